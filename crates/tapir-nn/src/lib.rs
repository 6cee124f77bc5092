//! # tapir-nn
//!
//! The state that survives iterations, for the [`tapir`] autodiff engine: layers whose
//! parameters live in a [`ParamStore`](tapir::ParamStore), optimizers that own their
//! moment buffers and update the parameters in place after each scope, learning-rate
//! schedules, and checkpoints in the safetensors format.
//!
//! ## Training a model
//!
//! Build the layers once (their parameters go into the store), allocate the gradient
//! buffer and the optimizer once, then run one [`Graph::scope`](tapir::Graph::scope) per
//! step: forward, [`backward_into`](tapir::Scope::backward_into), and, after the scope has
//! ended and released its borrow of the store, the optimizer's update.
//!
//! ```
//! use rand::SeedableRng;
//! use tapir::{Graph, ParamStore, Tensor};
//! use tapir_nn::optim::{Adam, Optimizer};
//! use tapir_nn::{Activation, Ctx, Mlp, Module};
//! # fn main() -> Result<(), tapir::Error> {
//! let mut rng = rand::rngs::StdRng::seed_from_u64(0);
//! let mut store = ParamStore::<f32>::new();
//! let model = Mlp::builder(2).hidden(16).activation(Activation::Tanh).output(2).build(&mut store, "mlp", &mut rng)?;
//! let mut grads = store.zeros_like()?;
//! let mut opt = Adam::new(&store, 0.05)?;
//! // XOR: four points, two classes.
//! let x = Tensor::from_vec(vec![0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0], &[4, 2])?;
//! let labels = [0, 1, 1, 0];
//! let mut graph = Graph::new();
//! let mut loss = f32::INFINITY;
//! for _ in 0..200 {
//!     grads.zero();
//!     loss = graph.scope(|s| {
//!         let cx = Ctx::train(s, &store);
//!         let loss = model.forward(cx, s.input(&x)).cross_entropy(&labels);
//!         s.backward_into(loss, &mut grads)?;
//!         loss.item()
//!     })?;
//!     opt.step(&mut store, &grads)?; // the scope is over: the store is ours again
//! }
//! assert!(loss < 0.05, "{loss}");
//! # Ok(()) }
//! ```
//!
//! A training step allocates nothing on the heap once warmed up (the integration test
//! `tests/zero_alloc.rs` counts). See `docs/nn.md` for the layer, optimizer and checkpoint APIs.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod functional;
pub mod init;
pub mod io;
pub mod layer;
pub mod optim;
// The f32 and f64 instances that dependent crates link to (dev profile only).
#[cfg(all(debug_assertions, not(test)))]
mod mono;

pub use functional::{flat_len, flatten_params, unflatten_params};
pub use init::Init;
pub use layer::{
    Activation, AvgPool2d, CausalSelfAttention, Checkpointed, Conv2d, Ctx, Dropout, Embedding, Flatten, Gpt, GptConfig,
    LayerNorm, Linear, MaxPool2d, Mlp, MlpBuilder, Module, PositionalEmbedding, Sequential, TransformerBlock,
};

use std::panic::Location;

/// `a · b` for sizes derived from the caller's (`3·dim`, `4·dim`), or an
/// [`tapir::Error::InvalidArgument`] naming `op` and both factors when it overflows.
#[track_caller]
pub(crate) fn mul_size(op: &'static str, what: &str, a: usize, b: usize) -> tapir::Result<usize> {
    // Not `ok_or_else(|| invalid(..))`: `#[track_caller]` does not pass through closures.
    match a.checked_mul(b) {
        Some(n) => Ok(n),
        None => Err(invalid(op, format!("{what} = {a} × {b} overflows usize"))),
    }
}

/// An [`tapir::Error::InvalidArgument`] naming `op`, at the caller's location.
#[track_caller]
pub(crate) fn invalid(op: &'static str, detail: String) -> tapir::Error {
    tapir::Error::InvalidArgument { op, detail, location: Location::caller() }
}

/// Renames the op of an error about the tensor being made (out of memory, an invalid
/// shape, an initialiser's invalid scale) to the layer constructor the caller called, so
/// that `Linear::new` with absurd sizes says `Linear::new:`, not the name of the tensor
/// constructor or [`Init::tensor`] it used inside. The location is already the caller's:
/// the constructors and what they call are `#[track_caller]`.
pub(crate) fn in_op(op: &'static str) -> impl FnOnce(tapir::Error) -> tapir::Error {
    move |e| match e {
        tapir::Error::TensorOutOfMemory { shape, requested, location, .. } => {
            tapir::Error::TensorOutOfMemory { op, shape, requested, location }
        }
        tapir::Error::InvalidShape { shape, detail, location, .. } => {
            tapir::Error::InvalidShape { op, shape, detail, location }
        }
        tapir::Error::InvalidArgument { detail, location, .. } => {
            tapir::Error::InvalidArgument { op, detail, location }
        }
        other => other,
    }
}

/// The dimensions of `shape` as `usize`s, without allocating.
pub(crate) fn dims(shape: tapir::Shape) -> ([usize; tapir::MAX_RANK], usize) {
    let mut d = [0; tapir::MAX_RANK];
    for (i, slot) in d.iter_mut().enumerate().take(shape.rank()) {
        *slot = shape.dim(i);
    }
    (d, shape.rank())
}
