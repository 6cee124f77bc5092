//! Test machinery for `tapir` and `tapir-nn`, not published: random programs decoded from
//! raw bytes, a reference model of the shape rules, an interpreter and checker, and the
//! harnesses of the cargo-fuzz targets.
//!
//! - [`program`] builds random programs for the fuzz target `tape_program`, the corpus
//!   replay and the property tests, and checks every promise of the engine on them. Its
//!   byte format, and how it stays stable as ops are added, is described there.
//! - [`tensor_io`] and [`checkpoint_io`] drive the loaders of external data (fuzz target
//!   `tensor_io`); [`optimizer_io`] the loaders of optimizer state and `tapir_dist`
//!   checkpoints (fuzz target `optimizer_io`).
//!
//! It uses only the public API of `tapir` and `tapir-nn`. Unit tests inside `tapir` cannot
//! use it (a dev-dependency cycle would link two `tapir` crates); integration tests, the
//! fuzz targets and other crates' tests can.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

pub mod checkpoint_io;
pub mod codes;
mod generate;
mod model;
pub mod optimizer_io;
pub mod program;
pub mod structure;
pub mod tensor_io;
pub mod unstructured;
