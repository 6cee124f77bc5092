//! The step data model: what a decoded program is. Decoding is in `generate/` (with the
//! code tables in [`crate::codes`]), running and checking in `check.rs`, recording in
//! `interpret.rs`.

use tapir::{Float, Var};

use crate::program::custom::Misbehave;
use crate::program::SAFETY_LIMIT;

/// Declares [`UnaryOp`] from one line per op: its format-1 code, whether it is smooth,
/// and how it is recorded. Adding a unary op to the fuzz programs is one line here.
macro_rules! unary_ops {
    ($($op:ident = $code:literal, $smooth:literal, |$x:ident| $call:expr;)*) => {
        /// Elementwise unary ops.
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        pub enum UnaryOp {
            $(
                #[doc = concat!("`", stringify!($call), "`.")]
                $op,
            )*
        }

        impl UnaryOp {
            /// Every unary op, in declaration order (format 0 draws from the first 15 of
            /// them, frozen in [`crate::codes`]).
            pub const ALL: &'static [UnaryOp] = &[$(UnaryOp::$op),*];

            /// The op's code in format 1.
            pub const fn code(self) -> u8 {
                match self {
                    $(UnaryOp::$op => $code,)*
                }
            }

            /// Whether the op is differentiable on every finite input, so that finite
            /// differences must agree with backward.
            pub const fn smooth(self) -> bool {
                match self {
                    $(UnaryOp::$op => $smooth,)*
                }
            }

            /// Records the op on `x`; errors are located at the caller.
            #[track_caller]
            pub(crate) fn apply<'s, T: Float>(self, x: Var<'s, T>) -> Var<'s, T> {
                match self {
                    $(UnaryOp::$op => {
                        let $x = x;
                        $call
                    })*
                }
            }
        }
    };
}

/// Element type of a program's graph.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dtype {
    /// `Graph<f32>`.
    F32,
    /// `Graph<f64>`.
    F64,
}

/// A leaf: an owned tensor that enters the scope as a gradient-requesting leaf or as an input.
#[derive(Debug, Clone, PartialEq)]
pub struct Leaf {
    /// Its dimensions.
    pub dims: Vec<usize>,
    /// Its elements, converted to the program's element type.
    pub data: Vec<f64>,
    /// `Scope::leaf` if true, `Scope::input` otherwise.
    pub grad: bool,
}

/// Elementwise binary ops with broadcasting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BinOp {
    /// `a + b`.
    Add,
    /// `a - b`.
    Sub,
    /// `a * b`.
    Mul,
    /// `a / b`.
    Div,
    /// `a.pow(b)`.
    Pow,
    /// `a.maximum(b)`.
    Maximum,
    /// `a.minimum(b)`.
    Minimum,
}

impl BinOp {
    /// The op name errors carry.
    pub fn name(self) -> &'static str {
        match self {
            BinOp::Add => "add",
            BinOp::Sub => "sub",
            BinOp::Mul => "mul",
            BinOp::Div => "div",
            BinOp::Pow => "pow",
            BinOp::Maximum => "maximum",
            BinOp::Minimum => "minimum",
        }
    }
}

/// Comparisons (no gradient).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmpOp {
    /// `a.gt(b)`.
    Gt,
    /// `a.ge(b)`.
    Ge,
    /// `a.lt(b)`.
    Lt,
    /// `a.le(b)`.
    Le,
    /// `a.equal(b)`.
    Equal,
}

impl CmpOp {
    /// The op name errors carry.
    pub fn name(self) -> &'static str {
        match self {
            CmpOp::Gt => "gt",
            CmpOp::Ge => "ge",
            CmpOp::Lt => "lt",
            CmpOp::Le => "le",
            CmpOp::Equal => "equal",
        }
    }
}

/// Ops with a scalar operand: `x + c`, `x - c`, `x * c`, `x / c`, `x^c`,
/// `leaky_relu(x, c)`, `c - x`, `c / x`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScalarOp {
    /// `x + c`.
    Add,
    /// `x - c`.
    Sub,
    /// `x * c`.
    Mul,
    /// `x / c`.
    Div,
    /// `x.powf(c)`.
    Powf,
    /// `x.leaky_relu(c)`.
    LeakyRelu,
    /// `c - x`.
    RSub,
    /// `c / x`.
    RDiv,
}

unary_ops! {
    // Variant = format-1 code, smooth (differentiable on all finite inputs), how it is recorded.
    Neg = 0x80, true, |x| -x;
    Exp = 0x81, true, |x| x.exp();
    Log = 0x82, false, |x| x.log();
    Sqrt = 0x83, false, |x| x.sqrt();
    Square = 0x84, true, |x| x.square();
    Recip = 0x85, false, |x| x.recip();
    Abs = 0x86, false, |x| x.abs();
    Sin = 0x87, true, |x| x.sin();
    Cos = 0x88, true, |x| x.cos();
    Tanh = 0x89, true, |x| x.tanh();
    Sigmoid = 0x8a, true, |x| x.sigmoid();
    Relu = 0x8b, false, |x| x.relu();
    Gelu = 0x8c, true, |x| x.gelu();
    GeluTanh = 0x8d, true, |x| x.gelu_tanh();
    Softplus = 0x8e, true, |x| x.softplus();
    Erf = 0x8f, true, |x| x.erf();
    Log1p = 0x90, false, |x| x.log1p();
    Expm1 = 0x91, true, |x| x.expm1();
    Atan = 0x92, true, |x| x.atan();
    Silu = 0x93, true, |x| x.silu();
    Rsqrt = 0x94, false, |x| x.rsqrt();
}

/// Reductions over all elements or over axes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReduceOp {
    /// `sum` / `sum_axes`.
    Sum,
    /// `mean` / `mean_axes`.
    Mean,
    /// `max` / `max_axes`.
    Max,
    /// `min` / `min_axes`.
    Min,
}

impl ReduceOp {
    /// The op name a reduction over axes reports: the method called.
    pub fn axes_name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum_axes",
            ReduceOp::Mean => "mean_axes",
            ReduceOp::Max => "max_axes",
            ReduceOp::Min => "min_axes",
        }
    }

    /// The op name a reduction over all elements reports.
    pub fn whole_name(self) -> &'static str {
        match self {
            ReduceOp::Sum => "sum",
            ReduceOp::Mean => "mean",
            ReduceOp::Max => "max",
            ReduceOp::Min => "min",
        }
    }
}

/// One op of a program. Operands (`a`, `b`, `x`, `y`, `w`, `cond`, `xs`) are indices into
/// the program's values: the leaves first, then each step's result in order. The other
/// fields are the op's arguments, named as in its signature.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // the fields, described above
pub enum Step {
    /// A broadcasting binary op.
    Binary {
        op: BinOp,
        a: usize,
        b: usize,
    },
    /// A comparison (no gradient).
    Compare {
        op: CmpOp,
        a: usize,
        b: usize,
    },
    /// An op with a scalar operand `c`.
    Scalar {
        op: ScalarOp,
        x: usize,
        c: f64,
    },
    /// `x.clamp(lo, hi)`.
    Clamp {
        x: usize,
        lo: f64,
        hi: f64,
    },
    /// An elementwise unary op.
    Unary {
        op: UnaryOp,
        x: usize,
    },
    /// `a.matmul(b)`.
    MatMul {
        a: usize,
        b: usize,
    },
    /// `x.linear(w, b)`.
    Linear {
        x: usize,
        w: usize,
        b: usize,
    },
    LayerNorm {
        x: usize,
        w: usize,
        b: usize,
        eps: f64,
    },
    /// `qkv.attention_weights(heads, causal)`.
    AttentionWeights {
        qkv: usize,
        heads: usize,
        causal: bool,
    },
    /// `p.attend(qkv)`.
    Attend {
        p: usize,
        qkv: usize,
    },
    /// `x.reshape(dims)`.
    Reshape {
        x: usize,
        dims: Vec<usize>,
    },
    /// `x.permute(axes)`.
    Permute {
        x: usize,
        axes: Vec<usize>,
    },
    /// `x.transpose(a0, a1)`, or `x.t()` for `(-2, -1)`.
    Transpose {
        x: usize,
        a0: isize,
        a1: isize,
    },
    /// `x.broadcast_to(dims)`.
    BroadcastTo {
        x: usize,
        dims: Vec<usize>,
    },
    /// `x.squeeze(axis)`.
    Squeeze {
        x: usize,
        axis: isize,
    },
    /// `x.unsqueeze(axis)`.
    Unsqueeze {
        x: usize,
        axis: isize,
    },
    /// `x.narrow(axis, start, len)`.
    Narrow {
        x: usize,
        axis: isize,
        start: usize,
        len: usize,
    },
    /// `Scope::concat(xs, axis)`.
    Concat {
        xs: Vec<usize>,
        axis: isize,
    },
    /// `Scope::stack(xs, axis)`.
    Stack {
        xs: Vec<usize>,
        axis: isize,
    },
    /// `x.index_select(axis, indices)`.
    IndexSelect {
        x: usize,
        axis: isize,
        indices: Vec<usize>,
    },
    /// `x.pad_axis(axis, before, after)`.
    PadAxis {
        x: usize,
        axis: isize,
        before: usize,
        after: usize,
    },
    /// `x.scatter_add(axis, indices, len)`.
    ScatterAdd {
        x: usize,
        axis: isize,
        indices: Vec<usize>,
        len: usize,
    },
    /// `Scope::where_(cond, a, b)`.
    Where {
        cond: usize,
        a: usize,
        b: usize,
    },
    /// `axes: None` reduces everything (`sum()`, `mean()`, `max()`, `min()`).
    Reduce {
        op: ReduceOp,
        x: usize,
        axes: Option<Vec<isize>>,
        keepdim: bool,
    },
    /// `x.var(axes, keepdim, correction)`.
    Var {
        x: usize,
        axes: Vec<isize>,
        keepdim: bool,
        correction: usize,
    },
    /// `x.logsumexp(axis, keepdim)`.
    LogSumExp {
        x: usize,
        axis: isize,
        keepdim: bool,
    },
    /// `x.softmax(axis)`, or `x.log_softmax(axis)` if `log`.
    Softmax {
        x: usize,
        axis: isize,
        log: bool,
    },
    /// `x.cross_entropy(labels)`.
    CrossEntropy {
        x: usize,
        labels: Vec<usize>,
    },
    /// `x.nll_loss(labels)`.
    Nll {
        x: usize,
        labels: Vec<usize>,
    },
    /// `x.bce_with_logits(y)`.
    Bce {
        x: usize,
        y: usize,
    },
    /// `a.mse_loss(b)`.
    Mse {
        a: usize,
        b: usize,
    },
    /// `x.detach()`.
    Detach {
        x: usize,
    },
    /// `x.with_grad()`.
    WithGrad {
        x: usize,
    },
    /// The inner step, run inside `Scope::no_grad`.
    NoGrad(Box<Step>),
    /// `Scope::tensor(data, dims)`.
    Const {
        dims: Vec<usize>,
        data: Vec<f64>,
    },
    /// `Scope::full(dims, v)`.
    Full {
        dims: Vec<usize>,
        v: f64,
    },
    /// `x.conv2d(w, stride, padding)`.
    Conv2d {
        x: usize,
        w: usize,
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// `im2col`, `max_pool2d` or `avg_pool2d` of `x`.
    Window {
        op: WindowOp,
        x: usize,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
    },
    /// The custom op of `custom.rs` on `xs` (one to three operands, the first one's shape
    /// the output's), whose backward misbehaves as `mode` says.
    Custom {
        xs: Vec<usize>,
        mode: Misbehave,
    },
    /// A format-1 code that names no op (yet), or one that a smooth program may not use:
    /// records nothing, and its value is the previous value. See [`crate::codes`].
    Nop {
        code: u8,
    },
}

/// The sliding-window ops besides `conv2d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WindowOp {
    /// `x.im2col(kernel, stride, padding)`.
    Im2Col,
    /// `x.max_pool2d(kernel, stride, padding)`.
    MaxPool2d,
    /// `x.avg_pool2d(kernel, stride, padding)`.
    AvgPool2d,
}

impl WindowOp {
    /// The op name errors carry.
    pub fn name(self) -> &'static str {
        match self {
            WindowOp::Im2Col => "im2col",
            WindowOp::MaxPool2d => "max_pool2d",
            WindowOp::AvgPool2d => "avg_pool2d",
        }
    }
}

impl Step {
    /// Whether the step is differentiable everywhere (on finite inputs) and its gradient
    /// flows to its inputs, so finite differences must agree with backward.
    pub(crate) fn smooth(&self) -> bool {
        match self {
            Step::Binary { op, .. } => matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul),
            Step::Scalar { op, c, .. } => {
                matches!(op, ScalarOp::Add | ScalarOp::Sub | ScalarOp::Mul) || (*op == ScalarOp::Div && *c != 0.0)
            }
            Step::Unary { op, .. } => op.smooth(),
            Step::Reduce { op, .. } => matches!(op, ReduceOp::Sum | ReduceOp::Mean),
            Step::MatMul { .. }
            | Step::Linear { .. }
            | Step::LayerNorm { .. }
            | Step::AttentionWeights { .. }
            | Step::Attend { .. }
            | Step::Reshape { .. }
            | Step::Permute { .. }
            | Step::Transpose { .. }
            | Step::BroadcastTo { .. }
            | Step::Squeeze { .. }
            | Step::Unsqueeze { .. }
            | Step::Narrow { .. }
            | Step::Concat { .. }
            | Step::Stack { .. }
            | Step::IndexSelect { .. }
            | Step::PadAxis { .. }
            | Step::ScatterAdd { .. }
            | Step::Var { .. }
            | Step::LogSumExp { .. }
            | Step::Softmax { .. }
            | Step::CrossEntropy { .. }
            | Step::Nll { .. }
            | Step::Bce { .. }
            | Step::Mse { .. }
            | Step::Const { .. }
            | Step::Full { .. }
            | Step::Conv2d { .. }
            | Step::Nop { .. } => true,
            Step::Window { op, .. } => *op != WindowOp::MaxPool2d,
            Step::Custom { mode, .. } => *mode == Misbehave::Not,
            Step::Compare { .. }
            | Step::Clamp { .. }
            | Step::Where { .. }
            | Step::Detach { .. }
            | Step::WithGrad { .. }
            | Step::NoGrad(_) => false,
        }
    }
}

/// How the program ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// One `backward`.
    Once,
    /// `backward` twice: the second must fail with [`tapir::Error::BackwardTwice`].
    Twice,
    /// `backward_retain`, then `backward`, then `backward` again (which must fail).
    RetainThenOnce,
}

/// A decoded program.
#[derive(Debug, Clone, PartialEq)]
pub struct Program {
    /// Element type.
    pub dtype: Dtype,
    /// The leaves, values `0..leaves.len()`.
    pub leaves: Vec<Leaf>,
    /// The ops; step `i` makes value `leaves.len() + i`.
    pub steps: Vec<Step>,
    /// The value backward starts from.
    pub loss: usize,
    /// Whether the loss is summed to a scalar first (if not, a loss of another size must
    /// fail with [`tapir::Error::NotScalar`]).
    pub reduce_loss: bool,
    /// How backward is called.
    pub ending: Ending,
    /// `Graph::set_arena_limit`.
    pub arena_limit: Option<usize>,
    /// `Graph::set_threads`.
    pub threads: usize,
}

impl Program {
    /// The arena limit a run uses: the program's, or [`SAFETY_LIMIT`].
    pub fn limit(&self) -> usize {
        self.arena_limit.unwrap_or(SAFETY_LIMIT)
    }

    /// Whether a step records the custom op.
    pub fn has_custom(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Custom { .. }))
    }

    /// Whether a custom step's backward misbehaves.
    pub fn misbehaves(&self) -> bool {
        self.steps.iter().any(|s| matches!(s, Step::Custom { mode, .. } if *mode != Misbehave::Not))
    }

    /// The same program with every custom op well-behaved: what a harmless misbehaviour
    /// must give, bit for bit.
    pub fn tamed(&self) -> Program {
        let mut p = self.clone();
        for step in &mut p.steps {
            if let Step::Custom { mode, .. } = step {
                *mode = Misbehave::Not;
            }
        }
        p
    }
}
