//! [`Stateful`]: what an optimizer must expose so that a checkpoint can resume it exactly
//! (the step counter and the per-parameter buffers). Saving and loading are in
//! [`crate::io`] ([`io::optimizer_to_bytes`](crate::io::optimizer_to_bytes) and
//! [`io::load_optimizer_bytes`](crate::io::load_optimizer_bytes)).

use tapir::Float;

use crate::optim::Optimizer;

/// An optimizer whose whole state is a step counter, the learning rate and named
/// per-parameter buffers (one `Vec` per parameter, in store order, shaped like it).
pub trait Stateful<T: Float>: Optimizer<T> {
    /// The algorithm's name (`"Adam"`, `"AdamW"`, `"Sgd"`), checked when loading.
    fn kind(&self) -> &'static str;

    /// Steps taken (0 for an algorithm without a counter).
    fn step_count(&self) -> u64;

    /// Restores the step counter. A counter at `u64::MAX` makes the next
    /// [`Optimizer::step`] fail with [`tapir::Error::InvalidArgument`] (it cannot count
    /// another step); loading a checkpoint refuses such a counter.
    fn set_step_count(&mut self, steps: u64);

    /// The named buffers (`"m"`, `"v"`; `"velocity"`).
    fn buffers(&self) -> Vec<(&'static str, &[Vec<T>])>;

    /// The same buffers, mutably, in the same order.
    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut [Vec<T>])>;
}
