//! Thread counts for matrix products, shared by [`Graph::set_threads`](crate::Graph::set_threads)
//! and the eager [`Tensor::matmul`](crate::Tensor::matmul).
//!
//! faer splits a product into as many tasks as it is given threads, so an absurd count
//! (`usize::MAX`, anything from 2³¹ up) made one product spin for minutes, and counts
//! near 2⁶² divided by zero inside the GEMM crate. Counts are therefore clamped here, at
//! the API, to [`MAX_THREADS`].

use std::panic::Location;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use faer::Par;

use crate::error::{Error, Result};

/// The size of the pool [`init_threads`] built (1 until it has).
static POOL: AtomicUsize = AtomicUsize::new(1);

/// The number of threads [`init_threads`] gave rayon's global pool, or 1 if it has not
/// been called (or was called with 1). Work outside a graph that splits over the pool
/// ([`GradBuffer::zero`](crate::GradBuffer::zero), `tapir_nn`'s optimizers) uses this
/// many threads, so that a program that never called `init_threads` stays on its one
/// thread. Such work is elementwise, so its results do not depend on the count.
pub fn pool_threads() -> usize {
    POOL.load(Ordering::Relaxed)
}

/// The most threads a matrix product is split over; larger requests are clamped to it.
/// Far more than any machine's cores, far below what makes faer's task splitting slow.
pub const MAX_THREADS: usize = 1024;

/// Builds rayon's global pool with `threads` threads, **the calling thread being one of
/// them**, and returns the count. Call it once, at the start of the program, from the
/// thread that will run the graphs (usually `main`), then give each graph the same count
/// with [`Graph::set_threads`](crate::Graph::set_threads).
///
/// Without it, a parallel op called from `main` hands its pieces to rayon's workers and
/// waits: on a machine with as many cores as threads, the workers then spin (yielding)
/// against the calling thread whenever it records or walks serially between parallel ops.
/// With it, the calling thread takes its share of every split, as OpenMP's master thread
/// does in PyTorch: a W10 transformer step at 2 threads on 2 cores went from 270 to 190 ms
/// (CHANGELOG.md, `13ef515`).
///
/// - `0` means one thread per core ([`std::thread::available_parallelism`]); counts above
///   [`MAX_THREADS`] are clamped to it.
/// - `1` builds nothing and returns 1: graphs with one thread never use the pool, and a
///   pool whose only thread is the caller would run no work sent from other threads.
/// - Work that other threads send to the pool still runs, on its other threads.
/// - The calling thread stays the pool's thread 0 for the life of the process: if it
///   exits first, rayon's record of it (384 bytes) is lost, once. From `main` nothing is.
///
/// # Errors
/// [`Error::InvalidArgument`] when rayon's global pool already exists (built by an
/// earlier call, by another crate, or by any parallel work before this call) or the
/// calling thread already belongs to a rayon pool; the message says which. Nothing
/// changes then: work keeps running on the existing pool.
///
/// ```
/// // At the start of `main`, before any parallel work:
/// let threads = tapir::init_threads(2)?;
/// let mut graph = tapir::Graph::<f32>::new();
/// graph.set_threads(threads);
/// # Ok::<(), tapir::Error>(())
/// ```
#[track_caller]
pub fn init_threads(threads: usize) -> Result<usize> {
    let n = match threads {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n,
    }
    .min(MAX_THREADS);
    if n == 1 {
        return Ok(1);
    }
    let location = Location::caller();
    rayon::ThreadPoolBuilder::new().num_threads(n).use_current_thread().build_global().map_err(|e| {
        Error::InvalidArgument {
            op: "init_threads",
            detail: format!(
                "cannot build rayon's global pool of {n} threads with the calling thread in it: {e} \
                 (call init_threads once, before any parallel work, from a thread outside any pool)"
            ),
            location,
        }
    })?;
    POOL.store(n, Ordering::Relaxed);
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    SPIN.store(n <= cores, Ordering::Relaxed);
    Ok(n)
}

/// Whether the pool's idle threads wait for a graph's next split spinning
/// ([`keep_awake`]): set by [`init_threads`] when the pool has no more threads than the
/// machine has cores, so that a spinning thread never takes a core the work needs, and by
/// [`set_spin_wait`].
static SPIN: AtomicBool = AtomicBool::new(false);

/// Turns spin-waiting on or off and returns whether it was on. While it is on, a graph
/// with `n > 1` threads run on a pool thread keeps `n − 1` of the pool's other threads
/// spinning between its parallel ops, for up to 1 ms after the last, instead of letting
/// them sleep and paying 40–190 µs to wake one at its next split (OpenMP's spin-wait
/// does the same for PyTorch). [`init_threads`] turns it on when the pool has no more
/// threads than the machine has cores. Turn it off where other processes need the cores
/// the pool's idle threads would spin on, as several MPI ranks on one machine do; results
/// are the same either way.
///
/// ```
/// let was_on = tapir::set_spin_wait(false); // idle pool threads sleep at once
/// tapir::set_spin_wait(was_on);
/// ```
pub fn set_spin_wait(on: bool) -> bool {
    SPIN.swap(on, Ordering::Relaxed)
}

/// How many [`linger`] jobs are queued or running.
static LINGERING: AtomicUsize = AtomicUsize::new(0);

/// How long a lingering pool thread waits for work after its last job before it goes
/// back to rayon's idle loop (which sleeps after a few dozen yields, some 50 µs).
const LINGER: Duration = Duration::from_millis(1);

/// Keeps up to `threads − 1` of the pool's other threads awake while a graph on the
/// calling pool thread runs, as OpenMP's spin-wait keeps PyTorch's: each takes a
/// [`linger`] job that runs the pool's pending work and spins between jobs, for up to
/// [`LINGER`] after the last. Waking a sleeping pool thread costs the split that needs it
/// 40–190 µs on the 2-core development guest (`benches/examples/op_alone`, mode `idle`),
/// and a W11 step at 2 threads let its helper fall asleep some 19 times.
///
/// Only on a pool thread, with [`SPIN`] set; a job is spawned (one allocation) only for a
/// linger that ended, so a loop of steps closer together than [`LINGER`] spawns none
/// once warm. Results do not change: lingering threads run the same pieces of the same
/// splits, which depend on shapes alone.
pub(crate) fn keep_awake(threads: usize) {
    if threads < 2 || !SPIN.load(Ordering::Relaxed) {
        return;
    }
    let Some(me) = rayon::current_thread_index() else {
        return;
    };
    let want = threads.min(POOL.load(Ordering::Relaxed)) - 1;
    let mut have = LINGERING.load(Ordering::Relaxed);
    while have < want {
        match LINGERING.compare_exchange_weak(have, have + 1, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => {
                rayon::spawn(move || linger(me));
                have += 1;
            }
            Err(now) => have = now,
        }
    }
}

/// Runs the pool's pending work, spinning between jobs, until none has come for
/// [`LINGER`]. On the thread that spawned it (`spawner`), which took it back while
/// waiting inside a split of its own, it returns at once: that thread has its graph to
/// run.
fn linger(spawner: usize) {
    if rayon::current_thread_index() != Some(spawner) {
        let mut last = Instant::now();
        loop {
            match rayon::yield_now() {
                Some(rayon::Yield::Executed) => last = Instant::now(),
                _ if last.elapsed() >= LINGER => break,
                _ => std::hint::spin_loop(),
            }
        }
    }
    LINGERING.fetch_sub(1, Ordering::Relaxed);
}

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
