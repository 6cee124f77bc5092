//! Axis permutation and its gradient, in cache-friendly tiles.

use crate::dtype::Float;
use crate::kernels::for_each2;
use crate::shape::{Shape, MAX_RANK};

/// `out[p] = x[perm-strided p]`: copies `x` (shape `sx`) into `out` (shape `so`, the
/// permuted shape) with the input strides rearranged by `axes`.
pub(crate) fn permute<T: Float>(x: &[T], sx: &Shape, axes: &[usize], so: &Shape, out: &mut [T]) {
    if let Some((m, n)) = swaps_last_two(sx, axes) {
        transpose_tiles(x, m, n, |o, v| out[o] = v);
        return;
    }
    let s = sx.strides();
    let mut st = [0; MAX_RANK];
    for (i, &a) in axes.iter().enumerate() {
        st[i] = s[a];
    }
    for_each2(so, &st, &[0; MAX_RANK], |o, ix, _| out[o] = x[ix]);
}

/// `dx[perm p] += dout[p]`: the gradient of [`permute`].
pub(crate) fn permute_grad<T: Float>(dout: &[T], sx: &Shape, axes: &[usize], so: &Shape, dx: &mut [T]) {
    if let Some((m, n)) = swaps_last_two(sx, axes) {
        // `dout` is `x`'s transpose, `[.., n, m]`: transposing it back adds into `dx`.
        transpose_tiles(dout, n, m, |i, v| dx[i] += v);
        return;
    }
    let s = sx.strides();
    let mut st = [0; MAX_RANK];
    for (i, &a) in axes.iter().enumerate() {
        st[i] = s[a];
    }
    for_each2(so, &st, &[0; MAX_RANK], |o, ix, _| dx[ix] += dout[o]);
}

/// `(m, n)`, the last two dimensions of `sx`, if `axes` swaps them and keeps the rest (a
/// batched matrix transpose, what `t()` and the recorded derivative of matmul record).
fn swaps_last_two(sx: &Shape, axes: &[usize]) -> Option<(usize, usize)> {
    let r = axes.len();
    let swap = r >= 2
        && axes[r - 2] == r - 1
        && axes[r - 1] == r - 2
        && axes[..r - 2].iter().enumerate().all(|(i, &a)| a == i);
    swap.then(|| (sx.dim(r - 2), sx.dim(r - 1)))
}

/// Calls `put(o, x[i])` for every element of each `m×n` matrix of `x` and its position `o`
/// in the `n×m` transpose. Eight output rows at a time, each filled front to back: eight
/// sequential write streams and short contiguous reads. (Square 32×32 tiles were slower:
/// with a power-of-two row length their 32 rows fall in one cache set and evict each other.)
#[inline]
fn transpose_tiles<T: Float>(x: &[T], m: usize, n: usize, mut put: impl FnMut(usize, T)) {
    const ROWS: usize = 8;
    let mn = m * n;
    if mn == 0 {
        return;
    }
    for (b, xb) in x.chunks_exact(mn).enumerate() {
        let base = b * mn;
        for j0 in (0..n).step_by(ROWS) {
            let j1 = (j0 + ROWS).min(n);
            for (i, row) in xb.chunks_exact(n).enumerate() {
                for (j, &v) in row[j0..j1].iter().enumerate() {
                    put(base + (j0 + j) * m + i, v);
                }
            }
        }
    }
}
