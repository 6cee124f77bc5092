//! Per-example gradients: the plan of [`Scope::per_example`](crate::Scope::per_example).
//!
//! A batch's loss is a sum (or mean) of per-example terms, and every op before that sum
//! treats the examples separately, so the gradient of any node computed from the examples
//! is already per-example: example `e` owns the `e`-th contiguous `1/B` of its value and of
//! its gradient ("batch-major"). Only a parameter's gradient sums over the examples, at the
//! ops where a parameter meets the examples (the *boundaries*: `x·W`, `+ b`, a layer
//! norm's gain, an embedding's rows). So the transform is one ordinary backward walk with
//! the parameters (and what is computed from parameters alone) left out, then each
//! boundary's rule run on one example's slice at a time ([`rules`]).
//!
//! The plan first gives every node a [`Flow`] and refuses, naming the op, any program
//! where the split would be wrong: an op that combines examples before the loss (a
//! reduction, softmax, product or concatenation over the batch axis), a nonlinear op after
//! examples were combined, a parameter reaching the examples through an op with no
//! per-example rule, or a loss term that depends on parameters and no example.

pub(crate) mod plan;
pub(crate) mod rules;

use crate::shape::Shape;
use crate::tape::id::NodeId;

/// How a node relates to the examples.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Flow {
    /// Depends on no example and no parameter, or needs no gradient.
    Const,
    /// Computed from parameters alone: its gradient is wanted per example.
    Free,
    /// Computed from the examples, batch-major: example `e` owns the `e`-th `1/B` of it.
    Major,
    /// A linear combination over the examples (the loss, a sum over the batch).
    Reduced,
}

/// Where a boundary's gradient goes: a node computed from parameters alone, input of an
/// op computed from the examples.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Boundary<'s> {
    /// The op computed from the examples.
    pub v: NodeId<'s>,
    /// Its input computed from parameters alone.
    pub p: NodeId<'s>,
    /// The parameter (index into the plan's `shapes`) that `p` is computed from.
    pub param: usize,
}

/// What [`plan`] found: the boundaries and the parameter-only nodes between them and the
/// parameters, in reverse tape order.
#[derive(Debug)]
pub(crate) struct Plan<'s> {
    pub batch: usize,
    /// The nodes that are parameters, each with its parameter's index (a parameter of a
    /// store read by several nodes has several).
    pub roots: Vec<(NodeId<'s>, usize)>,
    /// Each parameter's shape.
    pub shapes: Vec<Shape>,
    pub boundaries: Vec<Boundary<'s>>,
    /// Parameter-only nodes that are not parameters and get a gradient, latest first:
    /// each is a `reshape` or `permute` of another parameter-only node.
    pub free: Vec<NodeId<'s>>,
    /// Per node: its flow (what the walk must leave out is `Free`).
    pub flows: Vec<Flow>,
}

/// Whether an operand of an op with output shape `out` is aligned with the output along
/// the batch axis (sliced per example) rather than broadcast over it.
pub(crate) fn aligned(s: Shape, out: Shape) -> bool {
    s.rank() == out.rank() && s.rank() > 0 && s.dim(0) == out.dim(0)
}
