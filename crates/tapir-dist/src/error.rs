//! The crate's single error type.

/// `Result<T, tapir_dist::Error>`.
pub type Result<T> = std::result::Result<T, Error>;

/// What can go wrong in data-parallel training. Every variant that involves another rank
/// is returned on *every* rank, with the same message, so no rank is left waiting.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// MPI could not be started.
    #[error("Mpi::init: {detail}")]
    Init {
        /// Why.
        detail: String,
    },
    /// At start-up, a rank's model differs from rank 0's.
    #[error(
        "DataParallel::new: rank {rank}'s parameter {index} is {theirs} but rank 0's is {root}; \
         every rank must build the same model (same names, shapes and dtypes, in the same order)"
    )]
    ModelMismatch {
        /// The first rank (lowest number) whose model differs.
        rank: usize,
        /// Position of the first differing parameter.
        index: usize,
        /// Rank 0's parameter there, as `"name" f32 [shape]` (or `nothing`).
        root: String,
        /// The differing rank's parameter there, in the same form.
        theirs: String,
    },
    /// A rank's step returned an error or panicked; every rank's step returns this.
    #[error("{op}: rank {rank} of {size} failed, so every rank stops here: {message}")]
    RankFailed {
        /// The collective that noticed.
        op: &'static str,
        /// The first (lowest) failed rank.
        rank: usize,
        /// The world size.
        size: usize,
        /// That rank's error message.
        message: String,
    },
    /// A caller's mistake (a buffer of the wrong size, a zero batch size, ...).
    #[error("{op}: {detail} (at {location})")]
    InvalidArgument {
        /// The function called.
        op: &'static str,
        /// What was wrong and what would have been valid.
        detail: String,
        /// The caller's source location.
        location: tapir::Loc,
    },
    /// A buffer whose size the caller chose (a sampler's permutation, a reduction buffer)
    /// could not be allocated: its byte count is past `isize::MAX`, or the allocator
    /// refused it. Nothing was changed.
    #[error("{op}: out of memory allocating {what}: {count} elements of {elem_bytes} bytes ({}) (at {location})", bytes(*.count, *.elem_bytes))]
    OutOfMemory {
        /// The function called.
        op: &'static str,
        /// The buffer (`"the permutation"`).
        what: &'static str,
        /// Elements requested.
        count: usize,
        /// Bytes per element.
        elem_bytes: usize,
        /// The caller's source location.
        location: tapir::Loc,
    },
    /// An error from the engine or the layers (a shape mismatch, a bad checkpoint, ...).
    #[error(transparent)]
    Tapir(#[from] tapir::Error),
}

#[track_caller]
pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument { op, detail: detail.into(), location: std::panic::Location::caller() }
}

/// `count · elem_bytes` in words: the byte count, or that it exceeds what one allocation
/// may hold (`isize::MAX` bytes).
fn bytes(count: usize, elem_bytes: usize) -> String {
    match count.checked_mul(elem_bytes) {
        Some(b) if b <= isize::MAX as usize => format!("{b} bytes"),
        _ => "more than isize::MAX bytes".to_string(),
    }
}

/// A `Vec` of `count` copies of `value`, allocated fallibly: the byte count is checked
/// before anything is requested, and a refusal is [`Error::OutOfMemory`], not an abort.
#[track_caller]
pub(crate) fn try_vec<V: Clone>(op: &'static str, what: &'static str, count: usize, value: V) -> Result<Vec<V>> {
    let mut v = Vec::new();
    try_grow(op, what, &mut v, count)?;
    v.resize(count, value);
    Ok(v)
}

/// Makes room for `v` to hold `count` elements in all (fallibly, as [`try_vec`]); `v`
/// is unchanged on error.
#[track_caller]
pub(crate) fn try_grow<V>(op: &'static str, what: &'static str, v: &mut Vec<V>, count: usize) -> Result<()> {
    let (elem_bytes, location) = (std::mem::size_of::<V>(), std::panic::Location::caller());
    let oom = || Error::OutOfMemory { op, what, count, elem_bytes, location };
    if count.checked_mul(elem_bytes).is_none_or(|b| b > isize::MAX as usize) {
        return Err(oom());
    }
    v.try_reserve_exact(count.saturating_sub(v.len())).map_err(|_| oom())
}
