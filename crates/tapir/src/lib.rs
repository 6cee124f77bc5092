//! # Tapir
//!
//! Reverse-mode automatic differentiation for dense tensors whose graph memory has an
//! explicit, compiler-checked lifetime.
//!
//! Each iteration records its ops on a tape inside [`Graph::scope`]. Values and
//! gradients live in a bump arena that is reset in O(1) when the scope ends; handles
//! ([`Var`]) are branded with the scope's lifetime, so they cannot escape it or be mixed
//! with another scope's. Nothing on the tape points back at anything, so no cycle can
//! form and nothing waits for a garbage collector.
//!
//! ```
//! use tapir::{Graph, Tensor};
//! # fn main() -> Result<(), tapir::Error> {
//! let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(0);
//! let x = Tensor::<f32>::normal(&[64, 64], 0.0, 1.0, &mut rng)?;
//! let mut graph = Graph::new();
//! for _ in 0..3 {
//!     let norm = graph.scope(|s| {
//!         let x = s.leaf(&x);                // borrows x, no copy
//!         let y = x.matmul(x).sum();         // y = Σ (x·x)
//!         s.backward(y)?;                    // consumes the tape
//!         let dx = x.grad().expect("x requires grad");
//!         Ok::<f32, tapir::Error>(dx.iter().map(|g| g * g).sum())
//!     })?;                                   // arena reset here, in O(1)
//!     assert!(norm > 0.0);
//! }
//! # Ok(()) }
//! ```

#![warn(missing_docs)]
// Sites in `storage/` and `graph/session.rs` allow it, each with its `// SAFETY:` argument
// (docs/unsafe.md).
#![deny(unsafe_code)]

// The modules in layer order: each imports only its own layer and those above it in this
// list (docs/architecture.md, invariant 1; checked by tapir-testing's `structure` test).
// 0 vocabulary
mod dtype;
mod error;
mod shape;
mod threads;
// 1 memory and math
mod kernels;
mod params;
mod storage;
mod tensor;
// 2 the record
mod tape;
// 3 recording: handles, contexts, plug-in interfaces
mod record;
// 4 rules
mod ops;
// 5 the engine
mod engine;
// 6 the public API
pub mod func;
mod graph;
pub mod testing;
// The f32 and f64 instances that dependent crates link to (dev profile only).
#[cfg(all(debug_assertions, not(test)))]
mod mono;

pub use dtype::Float;
pub use error::{Error, ErrorClass, Loc, Result};
pub use graph::forward::Level;
pub use graph::graph::{Graph, GraphStats};
pub use graph::per_example::PerExample;
pub use graph::report::{MemoryReport, OpMemory};
pub use graph::session::{NotLent, Session};
pub use kernels::binary_fn::BinaryFn;
pub use kernels::unary_fn::UnaryFn;
pub use ops::conv::conv2d::Conv2dOptions;
pub use params::{Grad, GradBuffer, GradMut, ParamId, ParamStore};
pub use record::custom_op::{CustomError, CustomInputs};
pub use record::handles::{Checkpoint, CustomOp, Scope, Var};
pub use shape::{Shape, ShapeProblem, MAX_RANK};
pub use storage::ArenaStats;
pub use tape::id::NodeId;
pub use tape::op::OpKind;
pub use tape::profile::{OpTime, Profile};
pub use tensor::Tensor;
pub use threads::{init_threads, pool_threads, set_spin_wait, MAX_THREADS};

/// The README's examples, compiled and run as doctests so that they cannot drift.
#[cfg(doctest)]
#[doc = include_str!("../../../README.md")]
struct ReadmeDoctests;
