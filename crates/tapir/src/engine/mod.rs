//! Layer 5, the engine: runs tapes. The backward walk, the recorded-derivative walk,
//! custom-op dispatch and checkpoint replay. It imports the rules (`ops/`); the rules never
//! import it, and the one recursion across it (a checkpoint's recomputation running a
//! nested backward pass) is handed in as an argument.

pub(crate) mod backward;
pub(crate) mod checkpoint;
pub(crate) mod custom;
pub(crate) mod grad;
pub(crate) mod jvp;
pub(crate) mod nest;
pub(crate) mod per_example;
