//! The op table: [`OpKind`], every kind of node a tape can hold with the name the caller
//! knows it by, and `enum Op`, what a tape node records. The rules for each variant
//! (recording, backward, recorded derivative) are in `ops/`; the engine runs them.
//!
//! Variants hold `NodeId`s and small `Copy` scalars. Variable-length payloads (concat
//! inputs, indices, labels, window geometry) live in the tape's `extra` list of `u32`s and
//! the variant keeps the offset, so that `Op` stays at 16 bytes for `f32`.

use crate::kernels::binary_fn::BinaryFn;
use crate::kernels::unary_fn::UnaryFn;
use crate::tape::id::NodeId;

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

            /// The kind's row in a table of every kind (the profile's): the unary
            /// functions in table order, then the binary ones, then the other kinds.
            #[inline]
            pub(crate) const fn index(self) -> usize {
                /// The kinds without a function, numbered in table order.
                #[repr(u8)]
                enum Named {
                    $($kind,)*
                }
                const FNS: usize = UnaryFn::ALL.len() + BinaryFn::ALL.len();
                match self {
                    OpKind::Unary(f) => f as usize,
                    OpKind::Binary(f) => UnaryFn::ALL.len() + f as usize,
                    $(OpKind::$kind => FNS + Named::$kind as usize,)*
                }
            }

            /// How many rows [`index`](OpKind::index) numbers.
            pub(crate) const COUNT: usize = UnaryFn::ALL.len() + BinaryFn::ALL.len() + [$(OpKind::$kind),*].len();

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
    /// A user-defined op ([`CustomOp`](crate::CustomOp)). `"custom"` is the kind's name only: errors,
    /// anomaly reports, dumps and memory reports name each node by [`CustomOp::name`](crate::CustomOp::name).
    Custom => "custom",
    /// A checkpointed block ([`Checkpoint`](crate::Checkpoint)): only its inputs and output are kept, its
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
    /// Window geometry `[kh, kw, sh, sw, ph, pw, dh, dw]` is `extra[geom..geom + 8]`.
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
    /// (`State::name_of`).
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

#[cfg(test)]
mod tests {
    use super::OpKind;

    #[test]
    fn variants_stay_small() {
        assert_eq!(std::mem::size_of::<super::Op<'static, f32>>(), 16);
    }

    #[test]
    fn every_kind_has_its_own_index() {
        let mut seen = [false; OpKind::COUNT];
        for kind in OpKind::all() {
            assert!(!std::mem::replace(&mut seen[kind.index()], true), "{kind:?} shares an index");
        }
        assert!(seen.iter().all(|&s| s), "every index is some kind's");
    }
}
