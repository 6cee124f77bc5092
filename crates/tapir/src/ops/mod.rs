//! The op set. [`OpKind`] is the table of op kinds and their names; `enum Op` is what a
//! tape node records. Each family file holds, side by side, the recording methods
//! (forward), the kernel calls and the derivatives of its variants:
//!
//! | file           | kinds                                                                     |
//! |----------------|---------------------------------------------------------------------------|
//! | `unary.rs`     | every elementwise `y = f(x)`: one [`UnaryFn`] table, name + forward + `f'` |
//! | `binary.rs`    | every broadcasting `out = f(a, b)`: one [`BinaryFn`] table                 |
//! | `matmul.rs`    | `matmul`, `linear` (product and bias in one node)                         |
//! | `shape_ops.rs` | `reshape`, `permute`, `broadcast_to`, `narrow`, `concat`, `index_select`, `where` |
//! | `scatter.rs`   | `pad_axis`, `scatter_add`: the adjoints of `narrow` and `index_select`    |
//! | `reduce.rs`    | `sum`, `sum_axes`, `max_axes`, `min_axes`, `logsumexp`                    |
//! | `softmax.rs`   | `softmax`, `log_softmax`                                                  |
//! | `norm.rs`      | `layer_norm` (normalisation, scale and shift in one node)                 |
//! | `attention.rs` | `attention_weights`, `attend`: multi-head attention on a packed `qkv`     |
//! | `loss.rs`      | `cross_entropy`, `nll_loss`, `bce_with_logits`                            |
//! | `conv.rs`      | `im2col`, `col2im`, `max_pool2d`, `avg_pool2d`                            |
//! | `custom.rs`    | user-defined ops ([`CustomOp`]), through the scope's side table           |
//! | `checkpoint.rs`| checkpointed blocks ([`Checkpoint`]), recomputed during backward          |
//!
//! Each op has two derivatives side by side: `backward`, the fast pass that accumulates
//! into buffers ([`Scope::backward`](crate::Scope::backward)), and `grad`, which records the
//! same derivative as ops on the tape so that it can be differentiated again
//! ([`Scope::grad`](crate::Scope::grad)). `Op::backward` and `Op::grad` dispatch on the
//! variant with exhaustive matches.
//!
//! Variants hold `NodeId`s and small `Copy` scalars. Variable-length payloads (concat
//! inputs, indices, labels, window geometry) live in the tape's `extra` list of `u32`s and
//! the variant keeps the offset, so that `Op` stays at 16 bytes for `f32`.
//!
//! Ops depend on the recording/backward toolkit in [`crate::record`], never on the tape's
//! or the scope's internals; the tape and the backward walk depend on `Op`.

pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod checkpoint;
pub(crate) mod conv;
pub(crate) mod custom;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod reduce;
pub(crate) mod scatter;
pub(crate) mod shape_ops;
pub(crate) mod softmax;
pub(crate) mod unary;

pub use binary::BinaryFn;
pub use checkpoint::Checkpoint;
pub use custom::{CustomError, CustomInputs, CustomOp};
pub use unary::UnaryFn;

use crate::error::Result;
use crate::graph::{NodeId, Var};
use crate::record::{BackwardCtx, GradCtx};
use crate::Float;

macro_rules! op_kinds {
    ($($(#[$doc:meta])* $kind:ident => $name:literal,)*) => {
        /// Every kind of node a tape can hold: the table that names ops in errors, anomaly
        /// reports, [`Scope::dump`](crate::Scope::dump), [`Scope::to_dot`](crate::Scope::to_dot)
        /// and [`Scope::memory_report`](crate::Scope::memory_report), and that backward
        /// dispatches on. Elementwise kinds carry their function.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum OpKind {
            /// An elementwise unary function.
            Unary(UnaryFn),
            /// An elementwise binary function with broadcasting.
            Binary(BinaryFn),
            $($(#[$doc])* $kind,)*
        }

        impl OpKind {
            /// The name the caller knows the op by: the method that records it.
            #[inline]
            pub const fn name(self) -> &'static str {
                match self {
                    OpKind::Unary(f) => f.name(),
                    OpKind::Binary(f) => f.name(),
                    $(OpKind::$kind => $name,)*
                }
            }

            /// Every kind, the elementwise ones once per function.
            pub fn all() -> impl Iterator<Item = OpKind> {
                UnaryFn::ALL
                    .iter()
                    .map(|&f| OpKind::Unary(f))
                    .chain(BinaryFn::ALL.iter().map(|&f| OpKind::Binary(f)))
                    .chain([$(OpKind::$kind),*])
            }
        }
    };
}

op_kinds! {
    /// An input, a constant, a detached value or anything recorded under `no_grad`.
    Leaf => "leaf",
    /// A gradient-requesting leaf supplied by the caller.
    Variable => "variable",
    /// A parameter of a [`ParamStore`](crate::ParamStore).
    Param => "param",
    /// Batched matrix product.
    MatMul => "matmul",
    /// Matrix product and bias in one node (a fully connected layer).
    Linear => "linear",
    /// Layer normalisation over the last axis, with scale and shift, in one node.
    LayerNorm => "layer_norm",
    /// Softmax of scaled query-key products per head of a packed `qkv` (causal or not).
    AttentionWeights => "attention_weights",
    /// Attention weights applied to the value heads of a packed `qkv`.
    Attend => "attend",
    /// The same elements under another shape (also squeeze, unsqueeze, flatten).
    Reshape => "reshape",
    /// Axis permutation (also transpose).
    Permute => "permute",
    /// NumPy broadcast to a larger shape.
    BroadcastTo => "broadcast_to",
    /// A contiguous range along one axis.
    Narrow => "narrow",
    /// Joining along an axis (also stack).
    Concat => "concat",
    /// Gathering along an axis (embedding lookup).
    IndexSelect => "index_select",
    /// Elementwise choice by a condition.
    Where => "where",
    /// Sum of all elements.
    Sum => "sum",
    /// Sum along one axis.
    SumAxis => "sum_axes",
    /// Maximum along one axis.
    MaxAxis => "max_axes",
    /// Minimum along one axis.
    MinAxis => "min_axes",
    /// `ln Σ exp` along one axis.
    LogSumExp => "logsumexp",
    /// Softmax along one axis.
    Softmax => "softmax",
    /// Log-softmax along one axis.
    LogSoftmax => "log_softmax",
    /// Softmax cross-entropy against class labels.
    CrossEntropy => "cross_entropy",
    /// Negative log-likelihood against class labels.
    NllLoss => "nll_loss",
    /// Binary cross-entropy with logits, elementwise.
    BceWithLogits => "bce_with_logits",
    /// Sliding windows unrolled to columns.
    Im2Col => "im2col",
    /// 2-D max pooling.
    MaxPool2d => "max_pool2d",
    /// 2-D average pooling.
    AvgPool2d => "avg_pool2d",
    /// Zero padding along one axis: the adjoint of `narrow` (its recorded derivative).
    Pad => "pad_axis",
    /// Scatter-add of slices along an axis into zeros: the adjoint of `index_select`.
    ScatterAdd => "scatter_add",
    /// Columns folded back onto an image, overlaps summed: the adjoint of `im2col`.
    Col2Im => "col2im",
    /// A user-defined op ([`CustomOp`]). `"custom"` is the kind's name only: errors,
    /// anomaly reports, dumps and memory reports name each node by [`CustomOp::name`].
    Custom => "custom",
    /// A checkpointed block ([`Checkpoint`]): only its inputs and output are kept, its
    /// intermediates are recomputed during backward.
    Checkpoint => "checkpoint",
}

/// One recorded operation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op<'s, T> {
    Leaf,
    Variable,
    /// A parameter from a [`ParamStore`](crate::ParamStore), by index.
    Param(u32),
    /// `y = f(x)`; `c` holds the function's scalar arguments (unused ones are zero).
    Unary {
        f: UnaryFn,
        x: NodeId<'s>,
        c: [T; 2],
    },
    Binary {
        f: BinaryFn,
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    /// `op(a)·op(b)`, `op` transposing the last two axes of an operand whose flag is set:
    /// the recorded derivatives of products use transposed operands without copying them.
    MatMul {
        a: NodeId<'s>,
        b: NodeId<'s>,
        ta: bool,
        tb: bool,
    },
    Linear {
        x: NodeId<'s>,
        w: NodeId<'s>,
        b: NodeId<'s>,
    },
    /// Inputs `x`, `w`, `b` are the ids stored at `first`.
    LayerNorm {
        first: u32,
        eps: T,
    },
    /// The mask needs no field: backward reads it from the zeros of the weights.
    AttentionWeights {
        qkv: NodeId<'s>,
        heads: u32,
    },
    Attend {
        p: NodeId<'s>,
        qkv: NodeId<'s>,
    },
    /// The value aliases the input's.
    Reshape {
        x: NodeId<'s>,
    },
    Permute {
        x: NodeId<'s>,
        axes: [u8; 6],
    },
    BroadcastTo {
        x: NodeId<'s>,
    },
    Narrow {
        x: NodeId<'s>,
        axis: u8,
        start: u32,
    },
    /// Inputs are the ids stored at `first` (see `Tape::stored_ids`).
    Concat {
        first: u32,
        count: u32,
        axis: u8,
    },
    /// Indices are `extra[idx..idx + out.dim(axis)]`.
    IndexSelect {
        x: NodeId<'s>,
        axis: u8,
        idx: u32,
    },
    Where {
        cond: NodeId<'s>,
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Sum {
        x: NodeId<'s>,
    },
    SumAxis {
        x: NodeId<'s>,
        axis: u8,
    },
    MaxAxis {
        x: NodeId<'s>,
        axis: u8,
    },
    MinAxis {
        x: NodeId<'s>,
        axis: u8,
    },
    LogSumExp {
        x: NodeId<'s>,
        axis: u8,
    },
    Softmax {
        x: NodeId<'s>,
        axis: u8,
    },
    LogSoftmax {
        x: NodeId<'s>,
        axis: u8,
    },
    /// Labels are `extra[labels..labels + n]`; the output is the mean over the batch.
    CrossEntropy {
        logits: NodeId<'s>,
        labels: u32,
    },
    /// Labels as for `CrossEntropy`; `logp` holds log-probabilities.
    NllLoss {
        logp: NodeId<'s>,
        labels: u32,
    },
    BceWithLogits {
        x: NodeId<'s>,
        y: NodeId<'s>,
    },
    /// Window geometry `[kh, kw, sh, sw, ph, pw]` is `extra[geom..geom + 6]`.
    Im2Col {
        x: NodeId<'s>,
        geom: u32,
    },
    /// Geometry as for `Im2Col`.
    MaxPool2d {
        x: NodeId<'s>,
        geom: u32,
    },
    /// Geometry as for `Im2Col`.
    AvgPool2d {
        x: NodeId<'s>,
        geom: u32,
    },
    /// `x` placed at `start` along `axis` in zeros of the output's shape.
    Pad {
        x: NodeId<'s>,
        axis: u8,
        start: u32,
    },
    /// Indices are `extra[idx..idx + x.dim(axis)]`: `out[.., idx[j], ..] += x[.., j, ..]`.
    ScatterAdd {
        x: NodeId<'s>,
        axis: u8,
        idx: u32,
    },
    /// Geometry as for `Im2Col`, over the output's shape.
    Col2Im {
        x: NodeId<'s>,
        geom: u32,
    },
    /// A user-defined op: row `table` of the tape's side table; inputs are the ids stored
    /// at `first`.
    Custom {
        table: u32,
        first: u32,
        count: u32,
    },
    /// A checkpointed block: row `table` of the tape's checkpoint table; inputs (the
    /// block's own, then the parameters it read) are the ids stored at `first`.
    Checkpoint {
        table: u32,
        first: u32,
        count: u32,
    },
}

/// Where an op's inputs are: in the variant, or stored on the tape (see `Tape::for_each_input`).
pub(crate) enum Inputs<'s> {
    /// The first `n` of the ids.
    Fixed([NodeId<'s>; 3], usize),
    /// `count` ids stored at `at`.
    Stored { at: u32, count: u32 },
}

impl<'s, T> Op<'s, T> {
    /// The op's kind, from which its name comes.
    pub(crate) fn kind(&self) -> OpKind {
        use Op::*;
        match *self {
            Leaf => OpKind::Leaf,
            Variable => OpKind::Variable,
            Param(_) => OpKind::Param,
            Unary { f, .. } => OpKind::Unary(f),
            Binary { f, .. } => OpKind::Binary(f),
            MatMul { .. } => OpKind::MatMul,
            Linear { .. } => OpKind::Linear,
            LayerNorm { .. } => OpKind::LayerNorm,
            AttentionWeights { .. } => OpKind::AttentionWeights,
            Attend { .. } => OpKind::Attend,
            Reshape { .. } => OpKind::Reshape,
            Permute { .. } => OpKind::Permute,
            BroadcastTo { .. } => OpKind::BroadcastTo,
            Narrow { .. } => OpKind::Narrow,
            Concat { .. } => OpKind::Concat,
            IndexSelect { .. } => OpKind::IndexSelect,
            Where { .. } => OpKind::Where,
            Sum { .. } => OpKind::Sum,
            SumAxis { .. } => OpKind::SumAxis,
            MaxAxis { .. } => OpKind::MaxAxis,
            MinAxis { .. } => OpKind::MinAxis,
            LogSumExp { .. } => OpKind::LogSumExp,
            Softmax { .. } => OpKind::Softmax,
            LogSoftmax { .. } => OpKind::LogSoftmax,
            CrossEntropy { .. } => OpKind::CrossEntropy,
            NllLoss { .. } => OpKind::NllLoss,
            BceWithLogits { .. } => OpKind::BceWithLogits,
            Im2Col { .. } => OpKind::Im2Col,
            MaxPool2d { .. } => OpKind::MaxPool2d,
            AvgPool2d { .. } => OpKind::AvgPool2d,
            Pad { .. } => OpKind::Pad,
            ScatterAdd { .. } => OpKind::ScatterAdd,
            Col2Im { .. } => OpKind::Col2Im,
            Custom { .. } => OpKind::Custom,
            Checkpoint { .. } => OpKind::Checkpoint,
        }
    }

    /// The op's kind's name; a custom op's own name is in the tape's side table
    /// (`Tape::name_of`).
    pub(crate) fn name(&self) -> &'static str {
        self.kind().name()
    }

    /// Where the inputs are, in order (an input used twice appears twice).
    #[inline]
    pub(crate) fn inputs(&self) -> Inputs<'s> {
        use Op::*;
        let one = |x| Inputs::Fixed([x; 3], 1);
        let two = |a, b| Inputs::Fixed([a, b, b], 2);
        match *self {
            Leaf | Variable | Param(_) => Inputs::Fixed([NodeId::POISON; 3], 0),
            Binary { a, b, .. } | MatMul { a, b, .. } => two(a, b),
            BceWithLogits { x, y } => two(x, y),
            Attend { p, qkv } => two(p, qkv),
            Where { cond, a, b } => Inputs::Fixed([cond, a, b], 3),
            Linear { x, w, b } => Inputs::Fixed([x, w, b], 3),
            LayerNorm { first, .. } => Inputs::Stored { at: first, count: 3 },
            Concat { first, count, .. } | Custom { first, count, .. } | Checkpoint { first, count, .. } => {
                Inputs::Stored { at: first, count }
            }
            AttentionWeights { qkv, .. } => one(qkv),
            Unary { x, .. }
            | Reshape { x }
            | Permute { x, .. }
            | BroadcastTo { x }
            | Narrow { x, .. }
            | IndexSelect { x, .. }
            | Sum { x }
            | SumAxis { x, .. }
            | MaxAxis { x, .. }
            | MinAxis { x, .. }
            | LogSumExp { x, .. }
            | Softmax { x, .. }
            | LogSoftmax { x, .. }
            | Im2Col { x, .. }
            | MaxPool2d { x, .. }
            | AvgPool2d { x, .. }
            | Pad { x, .. }
            | ScatterAdd { x, .. }
            | Col2Im { x, .. } => one(x),
            CrossEntropy { logits, .. } => one(logits),
            NllLoss { logp, .. } => one(logp),
        }
    }
}

impl<'s, T: Float> Op<'s, T> {
    /// Adds this node's contribution to its inputs' gradients: `out` is the node's id.
    /// A flat, exhaustive match: a new variant does not compile until it has a backward.
    #[inline(always)]
    pub(crate) fn backward(self, ctx: &mut BackwardCtx<'_, 's, T>, out: NodeId<'s>) -> Result<()> {
        use Op::*;
        match self {
            Leaf | Variable | Param(_) => Ok(()),
            Unary { f, x, c } => unary::backward(ctx, out, f, x, c),
            Binary { f, a, b } => binary::backward(ctx, out, f, a, b),
            MatMul { a, b, ta, tb } => matmul::backward(ctx, out, a, b, ta, tb),
            Linear { x, w, b } => matmul::backward_linear(ctx, out, x, w, b),
            LayerNorm { first, eps } => norm::backward(ctx, out, first, eps),
            AttentionWeights { qkv, heads } => attention::backward_weights(ctx, out, qkv, heads),
            Attend { p, qkv } => attention::backward_attend(ctx, out, p, qkv),
            Reshape { x } => shape_ops::backward_reshape(ctx, out, x),
            Permute { x, axes } => shape_ops::backward_permute(ctx, out, x, axes),
            BroadcastTo { x } => shape_ops::backward_broadcast(ctx, out, x),
            Narrow { x, axis, start } => shape_ops::backward_narrow(ctx, out, x, axis, start),
            Concat { first, count, axis } => shape_ops::backward_concat(ctx, out, first, count, axis),
            IndexSelect { x, axis, idx } => shape_ops::backward_index_select(ctx, out, x, axis, idx),
            Where { cond, a, b } => shape_ops::backward_where(ctx, out, cond, a, b),
            Sum { x } => reduce::backward_sum(ctx, out, x),
            SumAxis { x, axis } => reduce::backward_sum_axis(ctx, out, x, axis),
            MaxAxis { x, axis } | MinAxis { x, axis } => reduce::backward_select_axis(ctx, out, x, axis),
            LogSumExp { x, axis } => reduce::backward_logsumexp(ctx, out, x, axis),
            Softmax { x, axis } => softmax::backward(ctx, out, x, axis, false),
            LogSoftmax { x, axis } => softmax::backward(ctx, out, x, axis, true),
            CrossEntropy { logits, labels } => loss::backward_cross_entropy(ctx, out, logits, labels),
            NllLoss { logp, labels } => loss::backward_nll(ctx, out, logp, labels),
            BceWithLogits { x, y } => loss::backward_bce(ctx, out, x, y),
            Im2Col { x, geom } => conv::backward_im2col(ctx, out, x, geom),
            MaxPool2d { x, geom } => conv::backward_max_pool2d(ctx, out, x, geom),
            AvgPool2d { x, geom } => conv::backward_avg_pool2d(ctx, out, x, geom),
            Pad { x, axis, start } => scatter::backward_pad(ctx, out, x, axis, start),
            ScatterAdd { x, axis, idx } => scatter::backward_scatter_add(ctx, out, x, axis, idx),
            Col2Im { x, geom } => conv::backward_col2im(ctx, out, x, geom),
            Custom { table, first, count } => custom::backward(ctx, out, table, first, count),
            Checkpoint { table, first, count } => checkpoint::backward(ctx, out, table, first, count),
        }
    }

    /// Records this node's derivative: adds `g`-weighted contributions (handles on the same
    /// tape) to its inputs' gradients in `ctx`, for [`Scope::grad`](crate::Scope::grad).
    /// `out` is the node's id and `g` its gradient. One function per op, beside its fast
    /// backward; no `_ =>` arm, so a new variant does not compile until it has one.
    #[track_caller]
    pub(crate) fn grad(self, ctx: &mut GradCtx<'_, 's, T>, out: NodeId<'s>, g: Var<'s, T>) -> Result<()> {
        use Op::*;
        match self {
            Leaf | Variable | Param(_) => Ok(()),
            Unary { f, x, c } => unary::grad(ctx, out, g, f, x, c),
            Binary { f, a, b } => binary::grad(ctx, out, g, f, a, b),
            MatMul { a, b, ta, tb } => matmul::grad(ctx, g, a, b, ta, tb),
            Linear { x, w, b } => matmul::grad_linear(ctx, g, x, w, b),
            LayerNorm { first, eps } => norm::grad(ctx, g, first, eps),
            AttentionWeights { qkv, heads } => attention::grad_weights(ctx, out, g, qkv, heads),
            Attend { p, qkv } => attention::grad_attend(ctx, g, p, qkv),
            Reshape { x } => shape_ops::grad_reshape(ctx, g, x),
            Permute { x, axes } => shape_ops::grad_permute(ctx, g, x, axes),
            BroadcastTo { x } => shape_ops::grad_broadcast(ctx, g, x),
            Narrow { x, axis, start } => shape_ops::grad_narrow(ctx, g, x, axis, start),
            Concat { first, count, axis } => shape_ops::grad_concat(ctx, g, first, count, axis),
            IndexSelect { x, axis, idx } => shape_ops::grad_index_select(ctx, g, x, axis, idx),
            Where { cond, a, b } => shape_ops::grad_where(ctx, g, cond, a, b),
            Sum { x } | SumAxis { x, .. } => reduce::grad_sum(ctx, g, x),
            MaxAxis { x, axis } | MinAxis { x, axis } => reduce::grad_select_axis(ctx, out, g, x, axis),
            LogSumExp { x, .. } => reduce::grad_logsumexp(ctx, out, g, x),
            Softmax { x, axis } => softmax::grad(ctx, out, g, x, axis, false),
            LogSoftmax { x, axis } => softmax::grad(ctx, out, g, x, axis, true),
            CrossEntropy { logits, labels } => loss::grad_cross_entropy(ctx, g, logits, labels),
            NllLoss { logp, labels } => loss::grad_nll(ctx, g, logp, labels),
            BceWithLogits { x, y } => loss::grad_bce(ctx, g, x, y),
            Im2Col { x, geom } => conv::grad_im2col(ctx, g, x, geom),
            MaxPool2d { x, geom } => conv::grad_max_pool2d(ctx, out, g, x, geom),
            AvgPool2d { x, geom } => conv::grad_avg_pool2d(ctx, g, x, geom),
            Pad { x, axis, start } => scatter::grad_pad(ctx, g, x, axis, start),
            ScatterAdd { x, axis, idx } => scatter::grad_scatter_add(ctx, g, x, axis, idx),
            Col2Im { x, geom } => conv::grad_col2im(ctx, g, x, geom),
            Custom { table, first, count } => custom::grad(ctx, out, g, table, first, count),
            Checkpoint { table, first, count } => checkpoint::grad(ctx, out, g, table, first, count),
        }
    }
}
