//! The tape, its scopes and the backward pass.

pub(crate) mod backward;
mod id;
mod report;
pub(crate) mod scope;
pub(crate) mod tape;

pub use id::NodeId;
pub use report::{MemoryReport, OpMemory};
pub use scope::{Graph, GraphStats, Scope, Var};
