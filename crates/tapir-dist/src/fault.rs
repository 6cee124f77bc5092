//! Which panics are recoverable: a panic inside [`DataParallel::step`](crate::DataParallel::step)
//! is caught and reported to every rank; with the `mpi` feature, one anywhere else aborts the job.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};

thread_local! {
    // Depth of guarded regions on this thread.
    static GUARDED: Cell<usize> = const { Cell::new(0) };
}

/// Whether the calling thread is inside a guarded region (read by the MPI panic hook).
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub(crate) fn is_guarded() -> bool {
    GUARDED.try_with(Cell::get).unwrap_or(0) > 0
}

/// Runs `f`, turning a panic into `Err(message)`.
pub(crate) fn catch<R>(f: impl FnOnce() -> R) -> std::result::Result<R, String> {
    GUARDED.with(|g| g.set(g.get() + 1));
    let out = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    out.map_err(|payload| {
        let text = payload
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| payload.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic with a non-string payload".to_string());
        format!("panicked: {text}")
    })
}
