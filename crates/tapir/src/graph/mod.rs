//! Layer 6, the public API: [`Graph`](graph::Graph) and its scopes, the handles' accessors,
//! and the memory report.

pub(crate) mod forward;
#[allow(clippy::module_inception)] // the API's central type, in a file of its own
pub(crate) mod graph;
pub(crate) mod per_example;
pub(crate) mod report;
pub(crate) mod scope;
// The one module besides `storage` with `unsafe` blocks: a scope held between calls
// (docs/unsafe.md).
#[allow(unsafe_code)]
pub(crate) mod session;
pub(crate) mod var;
