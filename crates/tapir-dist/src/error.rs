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
    /// An error from the engine or the layers (a shape mismatch, a bad checkpoint, ...).
    #[error(transparent)]
    Tapir(#[from] tapir::Error),
}

#[track_caller]
pub(crate) fn invalid(op: &'static str, detail: impl Into<String>) -> Error {
    Error::InvalidArgument { op, detail: detail.into(), location: std::panic::Location::caller() }
}
