//! tapir-nn's integration tests as one binary: each file of this folder is a module
//! (`cargo test -p tapir-nn --test layers transformer::` runs one). The allocation-counting
//! tests and `optim_threads` keep binaries of their own (see Cargo.toml).

mod adversarial;
mod checkpoint;
mod hardening;
mod layer_gradients;
mod maml;
mod per_example;
mod recompute;
mod thread_bits;
mod transformer;
