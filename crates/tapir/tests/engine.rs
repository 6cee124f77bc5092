//! The engine's integration tests as one binary: each file of this folder is a module
//! (`cargo test -p tapir --test engine gradients::` runs one). One binary links and
//! optimises the engine's generic code once instead of once per file; see the `[[test]]`
//! entries in Cargo.toml for the tests that keep binaries of their own.

mod adversarial_engine;
mod adversarial_params;
mod arena;
mod attention;
mod callbacks;
mod checkpoint;
mod conv;
mod conv_fixtures;
mod conv_loops;
mod custom;
mod custom_slots;
mod deep;
mod errors;
mod forward;
mod gradients;
mod hand_worked;
mod names;
mod nan;
mod per_example;
mod profile;
mod second_order;
mod second_order_props;
mod semantics;
mod session;
mod tensor;
mod tree;
mod tree_derive;
mod tree_jac;
