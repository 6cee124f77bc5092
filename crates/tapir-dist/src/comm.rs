//! [`Comm`]: the few collectives data-parallel training needs, so that everything above
//! them (the reduction arithmetic, start-up checks, fault propagation, checkpoints) is
//! ordinary code that also runs, and is tested, without MPI through [`Local`].
//!
//! The MPI implementation is [`crate::Mpi`] (feature `mpi`). Every method is collective:
//! every rank calls it, in the same order, or the job hangs (MPI's rule, not ours).

use tapir::Float;

/// Collectives over a fixed group of ranks `0..size`.
pub trait Comm {
    /// This process's rank, in `0..size()`.
    fn rank(&self) -> usize;

    /// Number of ranks.
    fn size(&self) -> usize;

    /// `recv[i] = Σ_ranks send[i]` on every rank. `send` and `recv` have equal lengths.
    fn all_reduce_sum<T: Float>(&self, send: &[T], recv: &mut [T]);

    /// `recv[i] = Σ_ranks send[i]` on rank 0; `recv` is left as it was elsewhere.
    fn reduce_sum_to_root<T: Float>(&self, send: &[T], recv: &mut [T]);

    /// Copies `root`'s `buf` into every rank's `buf` (equal lengths everywhere).
    fn broadcast<T: Float>(&self, root: usize, buf: &mut [T]);

    /// Copies `root`'s `buf` into every rank's `buf`, resizing it (two calls: length, bytes).
    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>);

    /// `out[r]` = rank `r`'s `value`, on every rank; `out.len() == size()`.
    fn all_gather_u64(&self, value: u64, out: &mut [u64]);

    /// Ends every rank of the job at once (`MPI_Abort`), after printing `message` here.
    fn abort(&self, code: i32, message: &str) -> !;
}

/// The single-process communicator: rank 0 of 1, every collective a copy.
///
/// Training with `Local` is exactly single-process training, which is what the default
/// (MPI-free) test run uses to check the reduction arithmetic.
#[derive(Debug, Clone, Copy, Default)]
pub struct Local;

impl Comm for Local {
    fn rank(&self) -> usize {
        0
    }

    fn size(&self) -> usize {
        1
    }

    fn all_reduce_sum<T: Float>(&self, send: &[T], recv: &mut [T]) {
        recv.copy_from_slice(send);
    }

    fn reduce_sum_to_root<T: Float>(&self, send: &[T], recv: &mut [T]) {
        recv.copy_from_slice(send);
    }

    fn broadcast<T: Float>(&self, _root: usize, _buf: &mut [T]) {}

    fn broadcast_bytes(&self, _root: usize, _buf: &mut Vec<u8>) {}

    fn all_gather_u64(&self, value: u64, out: &mut [u64]) {
        out[0] = value;
    }

    fn abort(&self, code: i32, message: &str) -> ! {
        eprintln!("rank 0 of 1 aborting: {message}");
        std::process::exit(code)
    }
}

/// A borrowed communicator is one too, so that several [`DataParallel`](crate::DataParallel)s
/// (one per model) can share a process's single MPI world.
impl<C: Comm> Comm for &C {
    fn rank(&self) -> usize {
        (**self).rank()
    }

    fn size(&self) -> usize {
        (**self).size()
    }

    fn all_reduce_sum<T: Float>(&self, send: &[T], recv: &mut [T]) {
        (**self).all_reduce_sum(send, recv);
    }

    fn reduce_sum_to_root<T: Float>(&self, send: &[T], recv: &mut [T]) {
        (**self).reduce_sum_to_root(send, recv);
    }

    fn broadcast<T: Float>(&self, root: usize, buf: &mut [T]) {
        (**self).broadcast(root, buf);
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) {
        (**self).broadcast_bytes(root, buf);
    }

    fn all_gather_u64(&self, value: u64, out: &mut [u64]) {
        (**self).all_gather_u64(value, out);
    }

    fn abort(&self, code: i32, message: &str) -> ! {
        (**self).abort(code, message)
    }
}

/// `size` threads posing as ranks, for testing the multi-rank logic without MPI: each
/// collective writes this rank's bytes into a shared slot, waits at a barrier, reads the
/// slots it needs and waits again. Sums run in rank order, like a reduction to one root.
#[cfg(test)]
pub(crate) mod threads {
    use std::sync::{Barrier, Mutex};

    use tapir::Float;

    use super::Comm;

    fn values<T: Float>(bytes: &[u8]) -> Vec<T> {
        bytes.chunks_exact(std::mem::size_of::<T>()).map(bytemuck::pod_read_unaligned).collect()
    }

    #[derive(Debug)]
    pub(crate) struct Threads<'a> {
        rank: usize,
        size: usize,
        barrier: &'a Barrier,
        slots: &'a Mutex<Vec<Vec<u8>>>,
    }

    /// Runs `f` on `size` threads, one per rank, and returns their results in rank order.
    pub(crate) fn run<R: Send>(size: usize, f: impl Fn(Threads<'_>) -> R + Sync) -> Vec<R> {
        let barrier = Barrier::new(size);
        let slots = Mutex::new(vec![Vec::new(); size]);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..size)
                .map(|rank| {
                    let comm = Threads { rank, size, barrier: &barrier, slots: &slots };
                    let f = &f;
                    s.spawn(move || f(comm))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("a rank thread panicked")).collect()
        })
    }

    impl Threads<'_> {
        /// Publishes `bytes` as this rank's slot, then returns every slot.
        fn exchange(&self, bytes: Vec<u8>) -> Vec<Vec<u8>> {
            self.slots.lock().unwrap()[self.rank] = bytes;
            self.barrier.wait();
            let all = self.slots.lock().unwrap().clone();
            self.barrier.wait();
            all
        }

        fn sum<T: Float>(&self, send: &[T], recv: &mut [T]) {
            let all = self.exchange(bytemuck::cast_slice(send).to_vec());
            recv.fill(T::ZERO);
            for slot in all {
                let v: Vec<T> = values(&slot);
                recv.iter_mut().zip(v).for_each(|(r, v)| *r += v);
            }
        }
    }

    impl Comm for Threads<'_> {
        fn rank(&self) -> usize {
            self.rank
        }

        fn size(&self) -> usize {
            self.size
        }

        fn all_reduce_sum<T: Float>(&self, send: &[T], recv: &mut [T]) {
            self.sum(send, recv);
        }

        fn reduce_sum_to_root<T: Float>(&self, send: &[T], recv: &mut [T]) {
            let mut tmp = vec![T::ZERO; recv.len()];
            self.sum(send, &mut tmp);
            if self.rank == 0 {
                recv.copy_from_slice(&tmp);
            }
        }

        fn broadcast<T: Float>(&self, root: usize, buf: &mut [T]) {
            let all = self.exchange(bytemuck::cast_slice(buf).to_vec());
            buf.copy_from_slice(&values::<T>(&all[root]));
        }

        fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) {
            let all = self.exchange(buf.clone());
            buf.clone_from(&all[root]);
        }

        fn all_gather_u64(&self, value: u64, out: &mut [u64]) {
            let all = self.exchange(value.to_le_bytes().to_vec());
            for (o, slot) in out.iter_mut().zip(all) {
                *o = u64::from_le_bytes(slot.try_into().expect("8 bytes per rank"));
            }
        }

        fn abort(&self, code: i32, message: &str) -> ! {
            panic!("rank {} aborted with code {code}: {message}", self.rank)
        }
    }
}
