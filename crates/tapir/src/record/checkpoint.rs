//! How checkpointed blocks' declarations print. The [`Checkpoint`](crate::Checkpoint)
//! trait, the side-table row and `Replay` (how a recorded derivative or a tangent runs a
//! block again) are declared with the handles, in whose knot they are; the machinery that
//! records and recomputes blocks is the engine's (`engine/checkpoint/`).

use crate::record::handles::{CheckpointEntry, Nest};

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
