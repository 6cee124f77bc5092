//! The op set. `enum Op` names every node kind; each family file holds the recording
//! methods (forward), the backward functions and the tests, side by side.
//!
//! Variants hold `NodeId`s and small `Copy` scalars. Variable-length payloads (concat
//! inputs, indices, labels) live in the tape's `extra` list of `u32`s, and the variant
//! keeps the offset, so that a node stays at 64 bytes for `f32`.

pub(crate) mod binary;
pub(crate) mod conv;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod reduce;
pub(crate) mod shape_ops;
pub(crate) mod softmax;
pub(crate) mod unary;

use crate::graph::NodeId;

/// One recorded operation.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Op<'s, T> {
    /// An input, a constant, a detached value or anything recorded under `no_grad`.
    Leaf,
    /// A gradient-requesting leaf supplied by the caller (not a parameter).
    Variable,
    /// A parameter from a [`ParamStore`](crate::ParamStore), by index.
    Param(u32),
    Add {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Sub {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Mul {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Div {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Pow {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Maximum {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    Minimum {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    AddScalar {
        x: NodeId<'s>,
    },
    MulScalar {
        x: NodeId<'s>,
        c: T,
    },
    PowScalar {
        x: NodeId<'s>,
        p: T,
    },
    Neg {
        x: NodeId<'s>,
    },
    Exp {
        x: NodeId<'s>,
    },
    Log {
        x: NodeId<'s>,
    },
    Sqrt {
        x: NodeId<'s>,
    },
    Square {
        x: NodeId<'s>,
    },
    Recip {
        x: NodeId<'s>,
    },
    Abs {
        x: NodeId<'s>,
    },
    Sin {
        x: NodeId<'s>,
    },
    Cos {
        x: NodeId<'s>,
    },
    Tanh {
        x: NodeId<'s>,
    },
    Sigmoid {
        x: NodeId<'s>,
    },
    Relu {
        x: NodeId<'s>,
    },
    LeakyRelu {
        x: NodeId<'s>,
        slope: T,
    },
    GeluTanh {
        x: NodeId<'s>,
    },
    GeluErf {
        x: NodeId<'s>,
    },
    Softplus {
        x: NodeId<'s>,
    },
    Clamp {
        x: NodeId<'s>,
        lo: T,
        hi: T,
    },
    MatMul {
        a: NodeId<'s>,
        b: NodeId<'s>,
    },
    /// Also squeeze and unsqueeze; the value aliases the input's.
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
    Slice {
        x: NodeId<'s>,
        axis: u8,
        start: u32,
    },
    /// Inputs are `extra[first..first + count]`.
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
    Nll {
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
}

impl<'s, T> Op<'s, T> {
    /// Calls `f` on every input, in order (an input used twice is visited twice).
    pub(crate) fn for_each_input(&self, extra: &[u32], mut f: impl FnMut(NodeId<'s>)) {
        use Op::*;
        match *self {
            Leaf | Variable | Param(_) => {}
            Add { a, b }
            | Sub { a, b }
            | Mul { a, b }
            | Div { a, b }
            | Pow { a, b }
            | Maximum { a, b }
            | Minimum { a, b }
            | MatMul { a, b } => {
                f(a);
                f(b);
            }
            BceWithLogits { x, y } => {
                f(x);
                f(y);
            }
            Where { cond, a, b } => {
                f(cond);
                f(a);
                f(b);
            }
            Concat { first, count, .. } => {
                for &raw in &extra[first as usize..(first + count) as usize] {
                    f(NodeId::new(raw));
                }
            }
            AddScalar { x }
            | MulScalar { x, .. }
            | PowScalar { x, .. }
            | Neg { x }
            | Exp { x }
            | Log { x }
            | Sqrt { x }
            | Square { x }
            | Recip { x }
            | Abs { x }
            | Sin { x }
            | Cos { x }
            | Tanh { x }
            | Sigmoid { x }
            | Relu { x }
            | LeakyRelu { x, .. }
            | GeluTanh { x }
            | GeluErf { x }
            | Softplus { x }
            | Clamp { x, .. }
            | Reshape { x }
            | Permute { x, .. }
            | BroadcastTo { x }
            | Slice { x, .. }
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
            | AvgPool2d { x, .. } => f(x),
            CrossEntropy { logits, .. } => f(logits),
            Nll { logp, .. } => f(logp),
        }
    }

    /// The op's public name, as in error messages and graph dumps.
    pub(crate) fn name(&self) -> &'static str {
        use Op::*;
        match self {
            Leaf => "leaf",
            Variable => "variable",
            Param(_) => "param",
            Add { .. } => "add",
            Sub { .. } => "sub",
            Mul { .. } => "mul",
            Div { .. } => "div",
            Pow { .. } => "pow",
            Maximum { .. } => "maximum",
            Minimum { .. } => "minimum",
            AddScalar { .. } => "add_scalar",
            MulScalar { .. } => "mul_scalar",
            PowScalar { .. } => "pow_scalar",
            Neg { .. } => "neg",
            Exp { .. } => "exp",
            Log { .. } => "log",
            Sqrt { .. } => "sqrt",
            Square { .. } => "square",
            Recip { .. } => "recip",
            Abs { .. } => "abs",
            Sin { .. } => "sin",
            Cos { .. } => "cos",
            Tanh { .. } => "tanh",
            Sigmoid { .. } => "sigmoid",
            Relu { .. } => "relu",
            LeakyRelu { .. } => "leaky_relu",
            GeluTanh { .. } => "gelu_tanh",
            GeluErf { .. } => "gelu",
            Softplus { .. } => "softplus",
            Clamp { .. } => "clamp",
            MatMul { .. } => "matmul",
            Reshape { .. } => "reshape",
            Permute { .. } => "permute",
            BroadcastTo { .. } => "broadcast_to",
            Slice { .. } => "slice",
            Concat { .. } => "concat",
            IndexSelect { .. } => "index_select",
            Where { .. } => "where",
            Sum { .. } => "sum",
            SumAxis { .. } => "sum_axis",
            MaxAxis { .. } => "max",
            MinAxis { .. } => "min",
            LogSumExp { .. } => "logsumexp",
            Softmax { .. } => "softmax",
            LogSoftmax { .. } => "log_softmax",
            CrossEntropy { .. } => "cross_entropy",
            Nll { .. } => "nll",
            BceWithLogits { .. } => "bce_with_logits",
            Im2Col { .. } => "im2col",
            MaxPool2d { .. } => "max_pool2d",
            AvgPool2d { .. } => "avg_pool2d",
        }
    }
}
