//! [`Mpi`]: [`Comm`] over MPI's world communicator, through rsmpi (feature `mpi`).
//!
//! rsmpi 0.8 sends `f32`/`f64` slices as `MPI_FLOAT`/`MPI_DOUBLE` and sums them with
//! `MPI_SUM`. It has no in-place all-reduce, so callers pass a separate receive buffer
//! ([`crate::DataParallel`] owns both, allocated once).

use std::sync::Once;

use mpi::collective::SystemOperation;
use mpi::environment::Universe;
use mpi::topology::{Communicator, SimpleCommunicator};
use mpi::traits::{CommunicatorCollectives, Root};
use tapir::Float;

use crate::comm::Comm;
use crate::error::{Error, Result};

/// MPI's world communicator; finalises MPI when dropped.
///
/// Create one per process, first thing in `main`, with [`Mpi::init`]. It also installs a
/// panic hook: a panic outside [`DataParallel::step`](crate::DataParallel::step) (where
/// panics become errors on every rank) prints its message with the rank and calls
/// `MPI_Abort`, so the other ranks end at once instead of waiting in a collective.
pub struct Mpi {
    world: SimpleCommunicator,
    rank: usize,
    size: usize,
    // Dropped last: `MPI_Finalize` must come after every communicator is freed.
    _universe: Universe,
}

impl std::fmt::Debug for Mpi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Mpi {{ rank: {}, size: {} }}", self.rank, self.size)
    }
}

impl Mpi {
    /// Initialises MPI (`MPI_Init_thread` with `MPI_THREAD_FUNNELED`: only the main thread
    /// calls MPI; the engine's own worker threads never do).
    ///
    /// # Errors
    /// [`Error::Init`] if MPI was already initialised in this process.
    pub fn init() -> Result<Mpi> {
        let (universe, _) = mpi::initialize_with_threading(mpi::Threading::Funneled)
            .ok_or_else(|| Error::Init { detail: "MPI is already initialised in this process".into() })?;
        let world = universe.world();
        let rank = usize::try_from(world.rank()).expect("MPI ranks are non-negative");
        let size = usize::try_from(world.size()).expect("MPI sizes are positive");
        install_panic_hook(rank, size);
        Ok(Mpi { world, rank, size, _universe: universe })
    }

    /// Runs a program's body on every rank and turns its outcome into the process's exit
    /// status, so that a rank returning an error cannot leave the others waiting:
    ///
    /// - `Ok`: MPI is finalised, exit status 0.
    /// - an error that every rank gets together ([`Error::RankFailed`],
    ///   [`Error::ModelMismatch`]): printed, MPI finalised, exit status 1 on every rank.
    /// - any other error (it may be this rank's alone, while the others wait in a
    ///   collective, where `MPI_Finalize` would hang): printed with the rank, then
    ///   `MPI_Abort`, which ends every rank of the job.
    ///
    /// ```no_run
    /// fn main() -> std::process::ExitCode {
    ///     tapir_dist::Mpi::run(|comm| {
    ///         // build the model, `DataParallel::new(comm, &mut store)?`, train ...
    ///         Ok(())
    ///     })
    /// }
    /// ```
    pub fn run(
        body: impl FnOnce(&Mpi) -> std::result::Result<(), Box<dyn std::error::Error>>,
    ) -> std::process::ExitCode {
        let comm = match Mpi::init() {
            Ok(comm) => comm,
            Err(e) => {
                eprintln!("{e}");
                return std::process::ExitCode::FAILURE;
            }
        };
        match body(&comm) {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => match e.downcast_ref::<Error>() {
                Some(collective @ (Error::RankFailed { .. } | Error::ModelMismatch { .. })) => {
                    eprintln!("tapir-dist: rank {} of {}: {collective}", comm.rank, comm.size);
                    std::process::ExitCode::FAILURE
                }
                _ => comm.abort(1, &format!("error: {e}")),
            },
        }
    }

    /// Seconds since an arbitrary point (`MPI_Wtime`).
    pub fn time() -> f64 {
        mpi::time()
    }
}

fn install_panic_hook(rank: usize, size: usize) {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            previous(info);
            let guarded = crate::fault::is_guarded();
            if !guarded && mpi::environment::is_initialized() && !mpi::environment::is_finalized() {
                eprintln!("tapir-dist: rank {rank} of {size} panicked outside a step; aborting the job (MPI_Abort)");
                SimpleCommunicator::world().abort(101);
            }
        }));
    });
}

/// The slice as `f32` or `f64` (what `T` is), for rsmpi's `Equivalence` bounds.
enum Slice<'a> {
    F32(&'a [f32]),
    F64(&'a [f64]),
}

enum SliceMut<'a> {
    F32(&'a mut [f32]),
    F64(&'a mut [f64]),
}

fn typed<T: Float>(s: &[T]) -> Slice<'_> {
    // `Float` is sealed to f32 and f64, both `Pod`: the casts check size and alignment
    // and cannot fail for the matching name.
    if T::NAME == "f32" {
        Slice::F32(bytemuck::cast_slice(s))
    } else {
        Slice::F64(bytemuck::cast_slice(s))
    }
}

fn typed_mut<T: Float>(s: &mut [T]) -> SliceMut<'_> {
    if T::NAME == "f32" {
        SliceMut::F32(bytemuck::cast_slice_mut(s))
    } else {
        SliceMut::F64(bytemuck::cast_slice_mut(s))
    }
}

fn rank_i32(rank: usize) -> i32 {
    i32::try_from(rank).expect("MPI ranks fit in an i32")
}

impl Comm for Mpi {
    fn rank(&self) -> usize {
        self.rank
    }

    fn size(&self) -> usize {
        self.size
    }

    fn all_reduce_sum<T: Float>(&self, send: &[T], recv: &mut [T]) {
        assert_eq!(send.len(), recv.len(), "all_reduce_sum: callers pass buffers of equal length");
        match (typed(send), typed_mut(recv)) {
            (Slice::F32(s), SliceMut::F32(r)) => self.world.all_reduce_into(s, r, SystemOperation::sum()),
            (Slice::F64(s), SliceMut::F64(r)) => self.world.all_reduce_into(s, r, SystemOperation::sum()),
            _ => unreachable!("send and recv have the same element type"),
        }
    }

    fn reduce_sum_to_root<T: Float>(&self, send: &[T], recv: &mut [T]) {
        assert_eq!(send.len(), recv.len(), "reduce_sum_to_root: callers pass buffers of equal length");
        let root = self.world.process_at_rank(0);
        match (typed(send), typed_mut(recv)) {
            (Slice::F32(s), SliceMut::F32(r)) if self.rank == 0 => root.reduce_into_root(s, r, SystemOperation::sum()),
            (Slice::F64(s), SliceMut::F64(r)) if self.rank == 0 => root.reduce_into_root(s, r, SystemOperation::sum()),
            (Slice::F32(s), _) => root.reduce_into(s, SystemOperation::sum()),
            (Slice::F64(s), _) => root.reduce_into(s, SystemOperation::sum()),
        }
    }

    fn broadcast<T: Float>(&self, root: usize, buf: &mut [T]) {
        let root = self.world.process_at_rank(rank_i32(root));
        match typed_mut(buf) {
            SliceMut::F32(b) => root.broadcast_into(b),
            SliceMut::F64(b) => root.broadcast_into(b),
        }
    }

    fn broadcast_bytes(&self, root: usize, buf: &mut Vec<u8>) {
        let process = self.world.process_at_rank(rank_i32(root));
        let mut len = buf.len() as u64;
        process.broadcast_into(&mut len);
        let len = usize::try_from(len).expect("a broadcast length fits in memory");
        if self.rank != root {
            buf.resize(len, 0);
        }
        process.broadcast_into(&mut buf[..]);
    }

    fn all_gather_u64(&self, value: u64, out: &mut [u64]) {
        self.world.all_gather_into(&value, out);
    }

    fn abort(&self, code: i32, message: &str) -> ! {
        eprintln!("tapir-dist: rank {} of {} aborting the job: {message}", self.rank, self.size);
        self.world.abort(code)
    }
}
