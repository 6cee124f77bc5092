//! The tape, its scopes and the backward pass.

pub(crate) mod backward;
pub(crate) mod core;
mod grad;
pub(crate) mod id;
mod report;
mod scope;
pub(crate) mod tape;
pub(crate) use scope::{nested, with_slice, Scratch};
mod var;

pub use id::NodeId;
pub use report::{MemoryReport, OpMemory};
pub use scope::{Graph, GraphStats, Scope};
pub use var::Var;
