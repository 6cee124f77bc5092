//! Random programs: a few leaves, a sequence of ops from the whole op set with arguments
//! that are sometimes invalid, then backward. The cargo-fuzz target `tape_program`, the
//! corpus replay test and the property tests all go through [`run_program`], so a crash
//! the fuzzer finds on nightly is guarded on stable by its checked-in input.
//!
//! [`Program::from_bytes`] decodes any byte string into a program. It tracks every
//! value's shape while it generates, so most arguments are valid (and the programs get
//! deep), while about one step in sixteen gets an argument drawn without regard to the
//! shapes: a bad axis, a wrong element count, an index past the end, an empty list.
//!
//! [`run_program`] then checks, for every program:
//!
//! - nothing panics (the fuzzer reports a panic as a crash);
//! - after each step, the scope holds exactly the error the reference model in
//!   `model.rs` predicts: same variant, same op name, located in this file (the caller),
//!   or no error and a value of the predicted shape; the arena limit (the program's, or
//!   [`SAFETY_LIMIT`]) may cut in earlier with an [`Error::ArenaLimit`] it explains;
//!   once the scope holds an error it keeps that error;
//! - backward returns the scope's error, [`Error::NotScalar`] for a loss of another size,
//!   and [`Error::BackwardTwice`] for a second consuming pass; `backward_retain` leaves
//!   the tape usable and gives the same gradients as the pass after it;
//! - gradients have their leaves' sizes, and inputs get none;
//! - a second run of the same program, with the same thread count, is bitwise identical;
//! - for programs in `f64` made only of smooth ops on finite inputs, the gradients match
//!   central finite differences ([`gradcheck`]).

use std::fmt;

use crate::error::Error;
use crate::graph::{Graph, Scope, Var};
use crate::tensor::Tensor;
use crate::testing::generate;
use crate::testing::model::{self, Outcome};
use crate::testing::{gradcheck, GradcheckError, GradcheckOptions};
use crate::Float;

/// Most steps a program may have, so that one fuzz input stays fast.
pub const MAX_STEPS: usize = 24;

/// The arena limit of programs that set none: valid arguments can ask for huge tensors
/// (an `im2col` with a padding of 2^31), which must end in [`Error::ArenaLimit`] rather
/// than in the fuzzer's out-of-memory abort.
pub const SAFETY_LIMIT: usize = 64 << 20;

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

/// Elementwise unary ops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UnaryOp {
    /// `x.neg()`.
    Neg,
    /// `x.exp()`.
    Exp,
    /// `x.log()`.
    Log,
    /// `x.sqrt()`.
    Sqrt,
    /// `x.square()`.
    Square,
    /// `x.recip()`.
    Recip,
    /// `x.abs()`.
    Abs,
    /// `x.sin()`.
    Sin,
    /// `x.cos()`.
    Cos,
    /// `x.tanh()`.
    Tanh,
    /// `x.sigmoid()`.
    Sigmoid,
    /// `x.relu()`.
    Relu,
    /// `x.gelu()`.
    Gelu,
    /// `x.gelu_tanh()`.
    GeluTanh,
    /// `x.softplus()`.
    Softplus,
}

impl UnaryOp {
    pub(crate) fn smooth(self) -> bool {
        !matches!(self, UnaryOp::Log | UnaryOp::Sqrt | UnaryOp::Recip | UnaryOp::Abs | UnaryOp::Relu)
    }
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
    Binary { op: BinOp, a: usize, b: usize },
    /// A comparison (no gradient).
    Compare { op: CmpOp, a: usize, b: usize },
    /// An op with a scalar operand `c`.
    Scalar { op: ScalarOp, x: usize, c: f64 },
    /// `x.clamp(lo, hi)`.
    Clamp { x: usize, lo: f64, hi: f64 },
    /// An elementwise unary op.
    Unary { op: UnaryOp, x: usize },
    /// `a.matmul(b)`.
    MatMul { a: usize, b: usize },
    /// `x.reshape(dims)`.
    Reshape { x: usize, dims: Vec<usize> },
    /// `x.permute(axes)`.
    Permute { x: usize, axes: Vec<usize> },
    /// `x.transpose(a0, a1)`, or `x.t()` for `(-2, -1)`.
    Transpose { x: usize, a0: isize, a1: isize },
    /// `x.broadcast_to(dims)`.
    BroadcastTo { x: usize, dims: Vec<usize> },
    /// `x.squeeze(axis)`.
    Squeeze { x: usize, axis: isize },
    /// `x.unsqueeze(axis)`.
    Unsqueeze { x: usize, axis: isize },
    /// `x.narrow(axis, start, len)`.
    Narrow { x: usize, axis: isize, start: usize, len: usize },
    /// `Scope::concat(xs, axis)`.
    Concat { xs: Vec<usize>, axis: isize },
    /// `Scope::stack(xs, axis)`.
    Stack { xs: Vec<usize>, axis: isize },
    /// `x.index_select(axis, indices)`.
    IndexSelect { x: usize, axis: isize, indices: Vec<usize> },
    /// `Scope::where_(cond, a, b)`.
    Where { cond: usize, a: usize, b: usize },
    /// `axes: None` reduces everything (`sum()`, `mean()`, `max()`, `min()`).
    Reduce { op: ReduceOp, x: usize, axes: Option<Vec<isize>>, keepdim: bool },
    /// `x.var(axes, keepdim, correction)`.
    Var { x: usize, axes: Vec<isize>, keepdim: bool, correction: usize },
    /// `x.logsumexp(axis, keepdim)`.
    LogSumExp { x: usize, axis: isize, keepdim: bool },
    /// `x.softmax(axis)`, or `x.log_softmax(axis)` if `log`.
    Softmax { x: usize, axis: isize, log: bool },
    /// `x.cross_entropy(labels)`.
    CrossEntropy { x: usize, labels: Vec<usize> },
    /// `x.nll_loss(labels)`.
    Nll { x: usize, labels: Vec<usize> },
    /// `x.bce_with_logits(y)`.
    Bce { x: usize, y: usize },
    /// `a.mse_loss(b)`.
    Mse { a: usize, b: usize },
    /// `x.detach()`.
    Detach { x: usize },
    /// `x.with_grad()`.
    WithGrad { x: usize },
    /// The inner step, run inside `Scope::no_grad`.
    NoGrad(Box<Step>),
    /// `Scope::tensor(data, dims)`.
    Const { dims: Vec<usize>, data: Vec<f64> },
    /// `Scope::full(dims, v)`.
    Full { dims: Vec<usize>, v: f64 },
    /// `x.conv2d(w, stride, padding)`.
    Conv2d { x: usize, w: usize, stride: [usize; 2], padding: [usize; 2] },
    /// `im2col`, `max_pool2d` or `avg_pool2d` of `x`.
    Window { op: WindowOp, x: usize, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2] },
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
    fn smooth(&self) -> bool {
        match self {
            Step::Binary { op, .. } => matches!(op, BinOp::Add | BinOp::Sub | BinOp::Mul),
            Step::Scalar { op, c, .. } => {
                matches!(op, ScalarOp::Add | ScalarOp::Sub | ScalarOp::Mul) || (*op == ScalarOp::Div && *c != 0.0)
            }
            Step::Unary { op, .. } => op.smooth(),
            Step::Reduce { op, .. } => matches!(op, ReduceOp::Sum | ReduceOp::Mean),
            Step::MatMul { .. }
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
            | Step::Var { .. }
            | Step::LogSumExp { .. }
            | Step::Softmax { .. }
            | Step::CrossEntropy { .. }
            | Step::Nll { .. }
            | Step::Bce { .. }
            | Step::Mse { .. }
            | Step::Const { .. }
            | Step::Full { .. }
            | Step::Conv2d { .. } => true,
            Step::Window { op, .. } => *op != WindowOp::MaxPool2d,
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
    /// `backward` twice: the second must fail with [`Error::BackwardTwice`].
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
    /// fail with [`Error::NotScalar`]).
    pub reduce_loss: bool,
    /// How backward is called.
    pub ending: Ending,
    /// `Graph::set_arena_limit`.
    pub arena_limit: Option<usize>,
    /// `Graph::set_threads`.
    pub threads: usize,
}

/// A property that a program broke: a wrong error, a wrong shape, a wrong gradient, a
/// non-deterministic rerun. Its `Display` names the step and prints the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What went wrong.
    pub what: String,
    /// The program, as `Debug` prints it.
    pub program: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\nprogram: {}", self.what, self.program)
    }
}

impl std::error::Error for Finding {}

/// What a program did, for the statistics of a replay or a property test.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Steps in the program.
    pub steps: usize,
    /// The scope's first error, if a step failed.
    pub error: Option<Error>,
    /// Whether the gradients were compared with finite differences.
    pub gradchecked: bool,
}

/// Decodes `bytes` into a program, runs it twice and checks every property listed in the
/// module documentation.
///
/// # Errors
/// A [`Finding`] for the first property the program broke. The fuzz target panics with
/// it, so that libFuzzer saves the input.
pub fn run_program(bytes: &[u8]) -> Result<Report, Finding> {
    let program = Program::from_bytes(bytes);
    let first = program.execute()?;
    let second = program.execute()?;
    if first.bits != second.bits {
        return Err(program.finding("a rerun with the same thread count gave different bits".into()));
    }
    let gradchecked = program.check_gradients(&first)?;
    Ok(Report { steps: program.steps.len(), error: first.error, gradchecked })
}

/// What one execution produced: every value and leaf gradient as raw bits (`f32` values
/// widened exactly), and the scope's first error.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Values of leaves and steps, then leaf gradients, then backward's results, as bits.
    pub bits: Vec<Vec<u64>>,
    /// Largest absolute value of any step (`f64::INFINITY` if one was not finite).
    pub scale: f64,
    /// The scope's first error.
    pub error: Option<Error>,
}

impl Program {
    /// Decodes a program; every byte string gives one (see the module documentation).
    pub fn from_bytes(bytes: &[u8]) -> Program {
        generate::program(bytes)
    }

    /// The arena limit a run uses: the program's, or [`SAFETY_LIMIT`].
    pub fn limit(&self) -> usize {
        self.arena_limit.unwrap_or(SAFETY_LIMIT)
    }

    /// Whether `e` is an arena-limit error that this run's limit explains.
    fn honest_limit(&self, e: &Error) -> bool {
        match *e {
            Error::ArenaLimit { requested, in_use, limit, .. } => {
                limit == self.limit() && requested.saturating_add(in_use) > limit
            }
            _ => false,
        }
    }

    fn finding(&self, what: String) -> Finding {
        Finding { what, program: format!("{self:?}") }
    }

    /// Runs the program once in its element type, checking each step against the model.
    ///
    /// # Errors
    /// A [`Finding`] for the first broken property.
    pub fn execute(&self) -> Result<Trace, Finding> {
        match self.dtype {
            Dtype::F32 => self.execute_as::<f32>(),
            Dtype::F64 => self.execute_as::<f64>(),
        }
    }

    /// The model's outcome of every step, up to and including the first error.
    fn expected(&self) -> Vec<Outcome> {
        let mut shapes: Vec<Vec<usize>> = self.leaves.iter().map(|l| l.dims.clone()).collect();
        let mut out = vec![];
        for step in &self.steps {
            let o = model::outcome(step, &shapes);
            match &o {
                Outcome::Ok(dims) => shapes.push(dims.clone()),
                Outcome::Err { .. } => {
                    out.push(o);
                    break;
                }
            }
            out.push(o);
        }
        out
    }

    fn execute_as<T: Float>(&self) -> Result<Trace, Finding> {
        let mut tensors = Vec::with_capacity(self.leaves.len());
        for l in &self.leaves {
            let data = l.data.iter().map(|&v| T::from_f64(v)).collect();
            tensors.push(Tensor::from_vec(data, &l.dims).map_err(|e| self.finding(format!("leaf: {e}")))?);
        }
        let expected = self.expected();
        let mut graph = Graph::<T>::new();
        graph.set_threads(self.threads);
        graph.set_arena_limit(Some(self.limit()));
        graph.scope(|s| Run { p: self, s, expected: &expected, first: None }.go(&tensors))
    }

    /// Compares backward with finite differences when the program is smooth, valid, in
    /// `f64`, on finite inputs, and small. Returns whether it did.
    fn check_gradients(&self, trace: &Trace) -> Result<bool, Finding> {
        let numel: usize = self.leaves.iter().map(|l| l.data.len()).sum();
        let eligible = self.dtype == Dtype::F64
            && self.arena_limit.is_none()
            && trace.error.is_none()
            && numel <= 48
            && trace.scale <= 1e6
            && self.leaves.iter().all(|l| l.data.iter().all(|v| v.is_finite()))
            && self.steps.iter().all(Step::smooth);
        if !eligible {
            return Ok(false);
        }
        let inputs: Vec<Tensor<f64>> =
            self.leaves.iter().filter_map(|l| Tensor::from_vec(l.data.clone(), &l.dims).ok()).collect();
        // Rounding in the forward pass grows with the values' magnitude; finite differences
        // see it divided by the step, so the absolute tolerance scales with it. Steep
        // programs (exp of a square of a square) have third derivatives so large that the
        // step's truncation error dominates: a mismatch is retried with smaller steps, and
        // only a gradient no step agrees with is a finding.
        let atol = 1e-5 * trace.scale.max(1.0);
        let mut first_mismatch = None;
        for h in [1e-6, 1e-7, 1e-8, 1e-9, 1e-5] {
            let opts = GradcheckOptions { h, atol, ..GradcheckOptions::default() };
            let result = gradcheck(&inputs, opts, |s, vars| {
                let mut values = vars.to_vec();
                for step in &self.steps {
                    let v = step_on(s, &values, step);
                    values.push(v);
                }
                values[self.loss]
            });
            match result {
                Ok(_) => return Ok(true),
                Err(GradcheckError::NonFinite) => return Ok(false),
                Err(e @ GradcheckError::Mismatch { .. }) => {
                    first_mismatch.get_or_insert(e);
                }
                Err(e) => return Err(self.finding(e.to_string())),
            }
        }
        match first_mismatch {
            Some(e) => Err(self.finding(format!("{e} (and with steps 1e-5 to 1e-9)"))),
            None => Ok(true),
        }
    }
}

/// One execution inside a scope.
struct Run<'p, 's, 'g, T: Float> {
    p: &'p Program,
    s: &'s Scope<'s, 'g, T>,
    expected: &'p [Outcome],
    /// The first error and the step (or `steps.len()` for the loss's sum) that raised it.
    first: Option<(usize, Error)>,
}

fn bits<T: Float>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

impl<'s, 'g: 's, T: Float> Run<'_, 's, 'g, T> {
    fn fail(&self, at: usize, what: String) -> Finding {
        self.p.finding(format!("step {at}: {what}"))
    }

    /// Checks that `e` is the error the model predicts for step `at` (or an arena limit).
    fn check_error(&self, at: usize, e: &Error) -> Result<(), Finding> {
        let ok_limit = self.p.honest_limit(e);
        let as_predicted = match self.expected.get(at) {
            Some(Outcome::Err { variant, op }) => model::variant(e) == *variant && e.op() == *op,
            _ => false,
        };
        if !ok_limit && !as_predicted {
            return Err(self.fail(at, format!("got error {e:?}, model expects {:?}", self.expected.get(at))));
        }
        match e.location() {
            Some(l) if l.file() == file!() => Ok(()),
            _ => Err(self.fail(at, format!("error {e} is not located at the caller ({})", file!()))),
        }
    }

    /// After step `at` made `v`: the scope's error must be unchanged, new and predicted,
    /// or absent with `v` of the predicted shape.
    fn after(&mut self, at: usize, v: Var<'s, T>, no_grad: bool) -> Result<(), Finding> {
        match (&self.first, self.s.check()) {
            (Some((_, first)), Err(e)) if *first == e => Ok(()),
            (Some((_, first)), now) => Err(self.fail(at, format!("first error {first:?} became {now:?}"))),
            (None, Err(e)) => {
                self.check_error(at, &e)?;
                self.first = Some((at, e));
                Ok(())
            }
            (None, Ok(())) => {
                let dims = match self.expected.get(at) {
                    Some(Outcome::Ok(dims)) => dims,
                    other => return Err(self.fail(at, format!("succeeded, model expects {other:?}"))),
                };
                let len = v.value().map_err(|e| self.fail(at, format!("value: {e}")))?.len();
                if v.shape().to_vec() != *dims || len != dims.iter().product::<usize>() {
                    return Err(
                        self.fail(at, format!("shape {} with {len} elements, model expects {dims:?}", v.shape()))
                    );
                }
                if no_grad && v.requires_grad() {
                    return Err(self.fail(at, "a value made under no_grad requires grad".into()));
                }
                Ok(())
            }
        }
    }

    /// What backward must return now: the scope's error, `NotScalar`, `BackwardTwice`
    /// (after a consuming pass) or success.
    fn check_backward(&self, got: &Result<(), Error>, loss: Var<'s, T>, consumed: bool) -> Result<(), Finding> {
        let at = self.p.steps.len() + 1;
        let ok = match (&self.first, got) {
            (Some((_, first)), Err(e)) => first == e,
            (Some(_), Ok(())) => false,
            (None, Err(e @ Error::ArenaLimit { .. })) => self.p.honest_limit(e) && e.op() == "backward",
            (None, Err(Error::NotScalar { op, .. })) => op.starts_with("backward") && loss.shape().numel() != 1,
            (None, Err(Error::BackwardTwice { .. })) => consumed && loss.shape().numel() == 1,
            (None, Err(Error::NoGradient { .. })) => !consumed && loss.shape().numel() == 1 && !loss.requires_grad(),
            (None, Err(_)) => false,
            (None, Ok(())) => !consumed && loss.shape().numel() == 1 && loss.requires_grad(),
        };
        if !ok {
            return Err(self.fail(at, format!("backward returned {got:?} (consumed: {consumed})")));
        }
        if let Err(e) = got {
            if e.location().map(|l| l.file()) != Some(file!()) {
                return Err(self.fail(at, format!("backward error {e} is not located at the caller")));
            }
        }
        Ok(())
    }

    fn grads(&self, leaves: &[Var<'s, T>]) -> Result<Vec<Vec<u64>>, Finding> {
        let mut out = vec![];
        for (leaf, v) in self.p.leaves.iter().zip(leaves) {
            match v.grad() {
                Some(g) if !leaf.grad => return Err(self.fail(0, format!("input leaf got gradient {g:?}"))),
                Some(g) if g.len() != leaf.data.len() => {
                    return Err(self.fail(0, format!("gradient of {} elements for a leaf of {:?}", g.len(), leaf.dims)))
                }
                g => out.push(g.map_or(vec![], bits)),
            }
        }
        Ok(out)
    }

    fn go(mut self, tensors: &'g [Tensor<T>]) -> Result<Trace, Finding> {
        let s = self.s;
        let mut values: Vec<Var<'s, T>> = vec![];
        for (leaf, t) in self.p.leaves.iter().zip(tensors) {
            values.push(if leaf.grad { s.leaf(t) } else { s.input(t) });
        }
        let leaves = values.clone();
        for (at, step) in self.p.steps.iter().enumerate() {
            let v = step_on(s, &values, step);
            values.push(v);
            self.after(at, v, matches!(step, Step::NoGrad(_)))?;
        }
        let mut loss = values[self.p.loss];
        let at = self.p.steps.len();
        if self.p.reduce_loss {
            loss = loss.sum();
            if self.first.is_none() {
                if let Err(e) = s.check() {
                    // Only the arena limit can stop a sum of a valid value.
                    if !self.p.honest_limit(&e) {
                        return Err(self.fail(at, format!("sum of the loss failed: {e}")));
                    }
                    self.first = Some((at, e));
                }
            }
        }
        let item = loss.item();
        match (&self.first, &item) {
            (Some((_, first)), Err(e)) if first == e => {}
            (None, Ok(_)) if loss.shape().numel() == 1 => {}
            (None, Err(Error::NotScalar { op: "item", .. })) if loss.shape().numel() != 1 => {}
            _ => return Err(self.fail(at, format!("item returned {item:?}"))),
        }
        let mut bits_out: Vec<Vec<u64>> = vec![];
        let mut scale = 0f64;
        for v in &values {
            if let Ok(x) = v.value() {
                scale =
                    x.iter().fold(scale, |m, v| if v.is_finite() { m.max(v.to_f64().abs()) } else { f64::INFINITY });
                bits_out.push(bits(x));
            }
        }
        let first = backward_first(s, self.p.ending, loss);
        self.check_backward(&first, loss, false)?;
        let limited = matches!(first, Err(Error::ArenaLimit { .. }));
        let mut grads = self.grads(&leaves)?;
        bits_out.append(&mut grads.clone());
        if !limited {
            match self.p.ending {
                Ending::Once => {}
                Ending::Twice => {
                    let second = s.backward(loss);
                    self.check_backward(&second, loss, first.is_ok())?;
                }
                Ending::RetainThenOnce => {
                    let second = s.backward(loss);
                    self.check_backward(&second, loss, false)?;
                    if second.is_ok() {
                        let again = self.grads(&leaves)?;
                        if again != grads {
                            return Err(self.fail(at, "backward after backward_retain gave other gradients".into()));
                        }
                        grads = again;
                    }
                    let third = s.backward(loss);
                    self.check_backward(&third, loss, second.is_ok())?;
                }
            }
        }
        bits_out.append(&mut grads);
        Ok(Trace { bits: bits_out, scale, error: self.first.map(|(_, e)| e) })
    }
}

/// The first backward call of an ending: `backward_retain` for `RetainThenOnce`.
fn backward_first<'s, T: Float>(s: &'s Scope<'s, '_, T>, ending: Ending, loss: Var<'s, T>) -> Result<(), Error> {
    match ending {
        Ending::RetainThenOnce => s.backward_retain(loss),
        Ending::Once | Ending::Twice => s.backward(loss),
    }
}

/// Records `step` on `s`, with operands from `values`.
fn step_on<'s, 'g: 's, T: Float>(s: &'s Scope<'s, 'g, T>, values: &[Var<'s, T>], step: &Step) -> Var<'s, T> {
    let v = |i: usize| values[i];
    let c = |x: f64| T::from_f64(x);
    match step {
        Step::Binary { op, a, b } => {
            let (a, b) = (v(*a), v(*b));
            match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div => a / b,
                BinOp::Pow => a.pow(b),
                BinOp::Maximum => a.maximum(b),
                BinOp::Minimum => a.minimum(b),
            }
        }
        Step::Compare { op, a, b } => {
            let (a, b) = (v(*a), v(*b));
            match op {
                CmpOp::Gt => a.gt(b),
                CmpOp::Ge => a.ge(b),
                CmpOp::Lt => a.lt(b),
                CmpOp::Le => a.le(b),
                CmpOp::Equal => a.equal(b),
            }
        }
        Step::Scalar { op, x, c: k } => {
            let (x, k) = (v(*x), c(*k));
            match op {
                ScalarOp::Add => x + k,
                ScalarOp::Sub => x - k,
                ScalarOp::Mul => x * k,
                ScalarOp::Div => x / k,
                ScalarOp::Powf => x.powf(k),
                ScalarOp::LeakyRelu => x.leaky_relu(k),
                ScalarOp::RSub => x.neg_().add_scalar(k),
                ScalarOp::RDiv => x.recip().mul_scalar(k),
            }
        }
        Step::Clamp { x, lo, hi } => v(*x).clamp(c(*lo), c(*hi)),
        Step::Unary { op, x } => {
            let x = v(*x);
            match op {
                UnaryOp::Neg => -x,
                UnaryOp::Exp => x.exp(),
                UnaryOp::Log => x.log(),
                UnaryOp::Sqrt => x.sqrt(),
                UnaryOp::Square => x.square(),
                UnaryOp::Recip => x.recip(),
                UnaryOp::Abs => x.abs(),
                UnaryOp::Sin => x.sin(),
                UnaryOp::Cos => x.cos(),
                UnaryOp::Tanh => x.tanh(),
                UnaryOp::Sigmoid => x.sigmoid(),
                UnaryOp::Relu => x.relu(),
                UnaryOp::Gelu => x.gelu(),
                UnaryOp::GeluTanh => x.gelu_tanh(),
                UnaryOp::Softplus => x.softplus(),
            }
        }
        Step::MatMul { a, b } => v(*a).matmul(v(*b)),
        Step::Reshape { x, dims } => v(*x).reshape(dims),
        Step::Permute { x, axes } => v(*x).permute(axes),
        Step::Transpose { x, a0, a1 } => {
            if (*a0, *a1) == (-2, -1) {
                v(*x).t()
            } else {
                v(*x).transpose(*a0, *a1)
            }
        }
        Step::BroadcastTo { x, dims } => v(*x).broadcast_to(dims),
        Step::Squeeze { x, axis } => v(*x).squeeze(*axis),
        Step::Unsqueeze { x, axis } => v(*x).unsqueeze(*axis),
        Step::Narrow { x, axis, start, len } => v(*x).narrow(*axis, *start, *len),
        Step::Concat { xs, axis } => s.concat(&xs.iter().map(|&i| v(i)).collect::<Vec<_>>(), *axis),
        Step::Stack { xs, axis } => s.stack(&xs.iter().map(|&i| v(i)).collect::<Vec<_>>(), *axis),
        Step::IndexSelect { x, axis, indices } => v(*x).index_select(*axis, indices),
        Step::Where { cond, a, b } => s.where_(v(*cond), v(*a), v(*b)),
        Step::Reduce { op, x, axes, keepdim } => {
            let x = v(*x);
            match (op, axes) {
                (ReduceOp::Sum, None) => x.sum(),
                (ReduceOp::Mean, None) => x.mean(),
                (ReduceOp::Max, None) => x.max(),
                (ReduceOp::Min, None) => x.min(),
                (ReduceOp::Sum, Some(a)) => x.sum_axes(a, *keepdim),
                (ReduceOp::Mean, Some(a)) => x.mean_axes(a, *keepdim),
                (ReduceOp::Max, Some(a)) => x.max_axes(a, *keepdim),
                (ReduceOp::Min, Some(a)) => x.min_axes(a, *keepdim),
            }
        }
        Step::Var { x, axes, keepdim, correction } => v(*x).var(axes, *keepdim, *correction),
        Step::LogSumExp { x, axis, keepdim } => v(*x).logsumexp(*axis, *keepdim),
        Step::Softmax { x, axis, log: false } => v(*x).softmax(*axis),
        Step::Softmax { x, axis, log: true } => v(*x).log_softmax(*axis),
        Step::CrossEntropy { x, labels } => v(*x).cross_entropy(labels),
        Step::Nll { x, labels } => v(*x).nll_loss(labels),
        Step::Bce { x, y } => v(*x).bce_with_logits(v(*y)),
        Step::Mse { a, b } => v(*a).mse_loss(v(*b)),
        Step::Detach { x } => v(*x).detach(),
        Step::WithGrad { x } => v(*x).with_grad(),
        Step::NoGrad(inner) => s.no_grad(|| step_on(s, values, inner)),
        Step::Const { dims, data } => s.tensor(&data.iter().map(|&x| c(x)).collect::<Vec<_>>(), dims),
        Step::Full { dims, v: x } => s.full(dims, c(*x)),
        Step::Conv2d { x, w, stride, padding } => v(*x).conv2d(v(*w), *stride, *padding),
        Step::Window { op, x, kernel, stride, padding } => match op {
            WindowOp::Im2Col => v(*x).im2col(*kernel, *stride, *padding),
            WindowOp::MaxPool2d => v(*x).max_pool2d(*kernel, *stride, *padding),
            WindowOp::AvgPool2d => v(*x).avg_pool2d(*kernel, *stride, *padding),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_short_input_runs_clean() {
        for len in 0..4 {
            for seed in 0..=255u8 {
                let bytes: Vec<u8> =
                    (0..len * 16).map(|i| seed.wrapping_mul(31).wrapping_add((i as u8).wrapping_mul(7))).collect();
                if let Err(f) = run_program(&bytes) {
                    panic!("{f}");
                }
            }
        }
    }

    #[test]
    fn smooth_programs_are_gradchecked() {
        // Header 0: f64, smooth ops only, one thread, no limit.
        let bytes: Vec<u8> = std::iter::once(0).chain((1..200u8).map(|i| i.wrapping_mul(37))).collect();
        let report = run_program(&bytes).unwrap_or_else(|f| panic!("{f}"));
        assert!(report.steps > 3, "{report:?}");
    }
}
