//! What user-defined ops exchange with the engine: [`CustomInputs`], [`CustomError`] and
//! the reused [`CustomScratch`]. The [`CustomOp`](crate::CustomOp) trait is declared with
//! the handles (`record/handles.rs`); its machinery is `engine/custom.rs`.
//!
//! A custom op has one output. The caller supplies its name, its output shape from the
//! input shapes, a forward pass from input slices into a zeroed output slice of the right
//! length (and, optionally, into a scratch slice of its own size saved for backward), and
//! a backward pass that *adds* `∂L/∂inputᵢ` into each input's gradient from `dout = ∂L/∂out`,
//! like the built-in ops.
//!
//! How it is stored: the node is `Op::Custom { table, first, count }`. The inputs are
//! stored ids (as concat's); `table` indexes the scope's side table of [`CustomEntry`]s,
//! each a borrowed `&'s dyn CustomOp<T>` (the caller lends it for `'g`, which outlives the
//! scope), the saved slice in the arena, the op's name and the caller's location. Nothing
//! is boxed: the side table is a `Vec` of `Copy` entries that the graph keeps between
//! scopes, emptied and relabelled like the tape's other vectors, so recording a custom op
//! allocates only in the arena after warm-up, and the scope's end still frees everything
//! in O(1) without running a destructor.
//!
//! The callbacks receive slices and shapes only, never the scope or a handle, so they
//! cannot record on the scope (the `RefCell` holding the tape is borrowed while they run).
//! A callback that panics or returns a [`CustomError`] becomes an [`Error`] naming the op:
//! while recording, the scope's first error; in backward, the error `backward` returns.

use crate::error::{Error, Loc};
use crate::shape::Shape;
use crate::tape::tape::recycle;

/// The inputs of a custom op, in the order given to [`Scope::custom`](crate::Scope::custom): each one's values
/// (row-major) and shape.
#[derive(Clone, Copy, Debug)]
pub struct CustomInputs<'a, T> {
    pub(crate) values: &'a [&'a [T]],
    pub(crate) shapes: &'a [Shape],
}

impl<'a, T> CustomInputs<'a, T> {
    /// Inputs from values and shapes (for calling an op's methods directly, in a test).
    /// The two lists are paired in order; a length mismatch is the caller's.
    pub fn new(values: &'a [&'a [T]], shapes: &'a [Shape]) -> CustomInputs<'a, T> {
        CustomInputs { values, shapes }
    }

    /// How many inputs.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Input `i`'s values. Panics if `i >= len()` (inside a callback, that panic becomes
    /// an error naming the op).
    pub fn value(&self, i: usize) -> &'a [T] {
        self.values[i]
    }

    /// Input `i`'s shape. Panics if `i >= len()`.
    pub fn shape(&self, i: usize) -> Shape {
        self.shapes[i]
    }

    /// Every input's values.
    pub fn values(&self) -> &'a [&'a [T]] {
        self.values
    }

    /// Every input's shape.
    pub fn shapes(&self) -> &'a [Shape] {
        self.shapes
    }
}

/// Why a custom op's callback failed. The engine turns it into an [`Error`] that names
/// the op and the caller's location: the shape variants into the built-in ops' shape
/// errors, [`Failed`](CustomError::Failed) into [`Error::CustomOp`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CustomError {
    /// Two shapes had to be equal: [`Error::ShapeMismatch`].
    ShapeMismatch {
        /// The first shape.
        lhs: Shape,
        /// The second shape.
        rhs: Shape,
    },
    /// Two shapes had to broadcast: [`Error::Broadcast`].
    Broadcast {
        /// The first shape.
        lhs: Shape,
        /// The second shape.
        rhs: Shape,
    },
    /// Another problem with an input's shape: [`Error::InvalidShape`].
    InvalidShape {
        /// The offending input's shape.
        shape: Shape,
        /// What is wrong and what would be valid.
        detail: String,
    },
    /// Anything else: [`Error::CustomOp`].
    Failed(String),
}

impl From<String> for CustomError {
    fn from(detail: String) -> Self {
        CustomError::Failed(detail)
    }
}

impl From<&str> for CustomError {
    fn from(detail: &str) -> Self {
        CustomError::Failed(detail.to_string())
    }
}

impl CustomError {
    pub(crate) fn into_error(self, op: &'static str, phase: &'static str, location: Loc) -> Error {
        match self {
            CustomError::ShapeMismatch { lhs, rhs } => Error::ShapeMismatch { op, lhs, rhs, location },
            CustomError::Broadcast { lhs, rhs } => Error::Broadcast { op, lhs, rhs, location },
            CustomError::InvalidShape { shape, detail } => Error::InvalidShape { op, shape, detail, location },
            CustomError::Failed(detail) => Error::CustomOp { op, phase, detail, location },
        }
    }
}

/// Lists the callbacks read and write, kept with their capacity between ops and scopes
/// (see `State::custom_scratch`), so that calling a custom op allocates nothing.
#[derive(Debug)]
pub(crate) struct CustomScratch<'s, T> {
    pub(crate) values: Vec<&'s [T]>,
    pub(crate) shapes: Vec<Shape>,
    pub(crate) grads: Vec<Option<&'s mut [T]>>,
    /// The address and length of each slot in `grads` as handed to the op's backward.
    pub(crate) given: Vec<Option<(usize, usize)>>,
}

impl<T> Default for CustomScratch<'_, T> {
    fn default() -> Self {
        CustomScratch { values: Vec::new(), shapes: Vec::new(), grads: Vec::new(), given: Vec::new() }
    }
}

impl<'s, T> CustomScratch<'s, T> {
    /// The same lists, emptied, under another scope's lifetime (see `tape::tape::recycle`).
    pub(crate) fn recycle<'b>(self) -> CustomScratch<'b, T> {
        CustomScratch {
            values: recycle(self.values),
            shapes: recycle(self.shapes),
            grads: recycle(self.grads),
            given: recycle(self.given),
        }
    }
}
