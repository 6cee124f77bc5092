//! Thread counts for matrix products, shared by [`Graph::set_threads`](crate::Graph::set_threads)
//! and the eager [`Tensor::matmul`](crate::Tensor::matmul).
//!
//! faer splits a product into as many tasks as it is given threads, so an absurd count
//! (`usize::MAX`, anything from 2³¹ up) made one product spin for minutes, and counts
//! near 2⁶² divided by zero inside the GEMM crate. Counts are therefore clamped here, at
//! the API, to [`MAX_THREADS`].

use faer::Par;

/// The most threads a matrix product is split over; larger requests are clamped to it.
/// Far more than any machine's cores, far below what makes faer's task splitting slow.
pub const MAX_THREADS: usize = 1024;

/// faer's parallelism for `threads` (1: the calling thread; 0: every thread of rayon's
/// global pool; `n`: `min(n, MAX_THREADS)` threads), and the count in effect.
pub(crate) fn par(threads: usize) -> (Par, usize) {
    let par = match threads {
        1 => Par::Seq,
        0 => Par::rayon(rayon_threads()),
        n => Par::rayon(n.min(MAX_THREADS)),
    };
    (par, par.degree())
}

/// The size of rayon's global pool, clamped like any other count.
fn rayon_threads() -> usize {
    Par::rayon(0).degree().clamp(1, MAX_THREADS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_clamped() {
        assert_eq!(par(1).1, 1);
        assert_eq!(par(3).1, 3);
        assert_eq!(par(usize::MAX).1, MAX_THREADS);
        assert_eq!(par(1 << 62).1, MAX_THREADS);
        assert!((1..=MAX_THREADS).contains(&par(0).1));
    }
}
