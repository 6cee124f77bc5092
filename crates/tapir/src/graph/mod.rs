//! The tape, its scopes and the backward pass.

pub(crate) mod backward;
mod id;
pub(crate) mod scope;
pub(crate) mod tape;

pub use id::NodeId;
pub use scope::{Graph, GraphStats, Scope, Var};
