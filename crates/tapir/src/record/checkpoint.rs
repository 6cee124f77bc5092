//! The interface of checkpointed blocks beyond the [`Checkpoint`](crate::Checkpoint) trait
//! and the side-table row (declared with the handles): [`Replay`], how the recorded
//! derivative runs a block again. The machinery that records and recomputes
//! blocks is the engine's (`engine/checkpoint/`).

use crate::dtype::Float;
use crate::error::Result;
use crate::record::handles::{CheckpointEntry, Nest, Var};

impl std::fmt::Debug for Nest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nest").field("anomaly", &self.anomaly).finish_non_exhaustive()
    }
}

impl<T> std::fmt::Debug for CheckpointEntry<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "checkpoint part {} ({} inputs, recorded at {})", self.part, self.inputs, self.location)
    }
}

/// A scope as the recorded derivative of a checkpoint sees it: something that runs the
/// block of checkpoint `table` on itself. Implemented by `Scope<'s, 'g, T>`, which holds
/// its blocks borrowed for `'g` ([`Checkpoint::forward`] needs the block borrowed for the
/// scope's `'g`); the derivative ops see a `&'s dyn Replay<'s, T>`, with no `'g` to name,
/// so the scope stays invariant in `'g`.
pub(crate) trait Replay<'s, T: Float> {
    /// Runs checkpoint `table`'s block on this scope from `inputs`: its output, or the
    /// error of a block that panicked.
    fn replay(&'s self, table: u32, inputs: &[Var<'s, T>], part: u32) -> Result<Var<'s, T>>;
}
