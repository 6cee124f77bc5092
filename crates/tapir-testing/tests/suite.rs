//! tapir-testing's integration tests as one binary: each file of this folder is a module
//! (`cargo test -p tapir-testing --test suite hardening::` runs one).

mod corpus_manifest;
mod func_sizes;
mod fuzz_replay;
mod hardening;
mod layout;
mod programs;
mod second_order;
mod structure;
