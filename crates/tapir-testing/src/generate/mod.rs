//! The generator behind [`Program::from_bytes`]: it tracks every value's shape while it
//! decodes, so that most arguments are valid and programs get deep, and draws an
//! argument without regard to the shapes about one step in sixteen.

use crate::codes::{self, Code, Format, Kind};
use crate::model::{self, Outcome};
use crate::program::{Dtype, Ending, Leaf, Program, Step, WindowOp, MAX_STEPS};
use crate::unstructured::Unstructured;

mod adversarial;

/// Decodes `bytes` into a program.
///
/// Header byte: bits 4–5 clear selects a smooth program (`f64`, smooth ops only, valid
/// arguments); otherwise bit 0 picks `f32`, bits 1–2 both set allow special values (NaN,
/// infinities, huge values, signed zeros). Bit 3 picks two threads; bits 6–7 both set
/// cap the arena at fewer than 4096 bytes.
pub(crate) fn program(bytes: &[u8]) -> Program {
    let (format, bytes) = codes::split_format(bytes);
    let mut u = Unstructured::new(bytes);
    let header = u.byte();
    let smooth = header & 0b11_0000 == 0;
    let dtype = if header & 1 == 0 || smooth { Dtype::F64 } else { Dtype::F32 };
    let specials = !smooth && header & 0b110 == 0b110;
    let threads = if header & 0b1000 == 0 { 1 } else { 2 };
    let arena_limit = (header & 0b1100_0000 == 0b1100_0000).then(|| u.below(1 << 12));
    let ending = match u.below(4) {
        0 => Ending::Twice,
        1 => Ending::RetainThenOnce,
        _ => Ending::Once,
    };
    let f32 = dtype == Dtype::F32;
    let mut g =
        Gen { u, format, shapes: vec![], steps: vec![], nops: 0, leaves: 0, poisoned: false, smooth, specials, f32 };
    let mut leaves = vec![];
    for _ in 0..g.u.range(1, 3) {
        let dims = g.small_dims();
        let data = g.data(model::numel(&dims));
        let grad = g.u.chance(3, 4);
        g.shapes.push(dims.clone());
        leaves.push(Leaf { dims, data, grad });
    }
    g.leaves = leaves.len();
    // A `Nop` (format 1) costs one byte and records nothing, so it does not count as a
    // step; the cap on all steps keeps a program of `Nop`s short too.
    while !g.u.is_empty() && g.steps.len() - g.nops < MAX_STEPS && g.steps.len() < 4 * MAX_STEPS {
        g.step();
    }
    let values = g.shapes.len();
    let loss = if g.u.chance(7, 8) { values - 1 } else { g.u.below(values) };
    let reduce_loss = smooth || g.u.chance(7, 8);
    Program { dtype, leaves, steps: g.steps, loss, reduce_loss, ending, arena_limit, threads }
}

/// The generator's state: the reader and every value's shape so far.
struct Gen<'a> {
    u: Unstructured<'a>,
    /// How ops are coded (see [`crate::codes`]).
    format: Format,
    /// Shapes of the values (after the first predicted error, whatever the model said last).
    shapes: Vec<Vec<usize>>,
    steps: Vec<Step>,
    /// How many of the steps are a `Nop`.
    nops: usize,
    leaves: usize,
    /// Whether a step already failed: later shapes are placeholders.
    poisoned: bool,
    /// Only smooth ops with valid arguments.
    smooth: bool,
    /// Leaves and constants may hold NaN, infinities, huge values and signed zeros.
    specials: bool,
    /// Values are rounded to `f32` when drawn, so that the model, which compares them in
    /// `f64`, sees what an `f32` graph sees (`clamp(1e-310, -0.0)` is valid in `f32`).
    f32: bool,
}

/// Dimensions that no shape accepts, and that never reach an allocator.
const BAD_DIMS: [&[usize]; 3] = [&[1; 7], &[1 << 32], &[1 << 31, 1 << 31, 4]];

impl Gen<'_> {
    fn push(&mut self, step: Step) -> usize {
        let shape = if self.poisoned {
            vec![]
        } else {
            match model::outcome(&step, &self.shapes) {
                Outcome::Ok(d) => d,
                Outcome::Err { .. } => {
                    self.poisoned = true;
                    vec![]
                }
            }
        };
        self.shapes.push(shape);
        self.steps.push(step);
        self.shapes.len() - 1
    }

    fn shape(&self, i: usize) -> &[usize] {
        &self.shapes[i]
    }

    /// An operand: one of the last four values most of the time.
    fn pick(&mut self) -> usize {
        let n = self.shapes.len();
        if self.u.chance(3, 4) {
            n - 1 - self.u.below(n.min(4))
        } else {
            self.u.below(n)
        }
    }

    /// An operand whose shape satisfies `ok`, if there is one.
    fn pick_where(&mut self, ok: impl Fn(&[usize]) -> bool) -> Option<usize> {
        let fits: Vec<usize> = (0..self.shapes.len()).filter(|&i| ok(&self.shapes[i])).collect();
        (!fits.is_empty()).then(|| fits[fits.len() - 1 - self.u.below(fits.len().min(6))])
    }

    /// Whether this step's arguments respect the shapes (always, in smooth mode).
    fn valid(&mut self) -> bool {
        self.smooth || self.u.chance(15, 16)
    }

    fn value(&mut self) -> f64 {
        let b = self.u.byte();
        let v = if self.specials && b >= 0xF8 {
            [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, 0.0, -0.0, 1e30, -1e30, 1e-310][usize::from(b & 7)]
        } else {
            (f64::from(b) - 127.5) / 48.0
        };
        if self.f32 {
            f64::from(v as f32)
        } else {
            v
        }
    }

    fn data(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.value()).collect()
    }

    /// Rank 0 to 3, dimensions 1 to 4, now and then a 0.
    fn small_dims(&mut self) -> Vec<usize> {
        let rank = self.u.below(4);
        (0..rank).map(|_| if self.u.chance(1, 16) { 0 } else { self.u.range(1, 4) }).collect()
    }

    fn bad_dims(&mut self) -> Vec<usize> {
        if self.u.chance(1, 2) {
            BAD_DIMS[self.u.below(BAD_DIMS.len())].to_vec()
        } else {
            (0..self.u.below(4)).map(|_| self.u.below(6)).collect()
        }
    }

    fn constant(&mut self, dims: Vec<usize>) -> usize {
        // A partner for a huge value (an im2col with a huge padding) would be huge too.
        let dims = if model::numel(&dims) > 1 << 12 { vec![] } else { dims };
        let data = self.data(model::numel(&dims));
        self.push(Step::Const { dims, data })
    }

    /// A shape that broadcasts with `dims`: a suffix of it with some dimensions set to 1.
    fn broadcastable(&mut self, dims: &[usize]) -> Vec<usize> {
        let keep = self.u.below(dims.len() + 1);
        dims[dims.len() - keep..].iter().map(|&d| if self.u.chance(1, 3) { 1 } else { d }).collect()
    }

    /// An operand that broadcasts with `a` (made as a constant if none exists).
    fn partner(&mut self, a: usize) -> usize {
        let sa = self.shape(a).to_vec();
        if !self.valid() {
            return self.pick();
        }
        match self.pick_where(|s| model::broadcast(s, &sa).is_some()) {
            Some(b) if self.u.chance(3, 4) => b,
            _ => {
                let dims = self.broadcastable(&sa);
                self.constant(dims)
            }
        }
    }

    fn axis_for(&mut self, rank: usize, valid: bool) -> isize {
        if valid && rank > 0 {
            self.u.below(2 * rank) as isize - rank as isize
        } else {
            self.u.axis(rank)
        }
    }

    fn axes_for(&mut self, rank: usize, valid: bool) -> Vec<isize> {
        (0..self.u.below(rank.min(3) + 1)).map(|_| self.axis_for(rank, valid)).collect()
    }

    fn scalar(&mut self) -> f64 {
        if self.smooth {
            return 0.25 + f64::from(self.u.byte() % 8) / 4.0;
        }
        self.value()
    }

    /// The op of the next step, read as its format codes it, and for a `Nop` the code read.
    fn code(&mut self) -> (Code, u8) {
        if self.format == Format::V1 {
            let b = self.u.byte();
            let code = codes::FORMAT1[usize::from(b)];
            let off = self.smooth && !code.smooth();
            return (if off { Code::Nop } else { code }, b);
        }
        let smooth = self.smooth;
        let b = usize::from(self.u.byte());
        let kind = if smooth { codes::SMOOTH_KINDS0[b] } else { codes::KINDS0[b] };
        let mut sub = || usize::from(self.u.byte());
        let code = match kind {
            Kind::Binary => Code::Binary((if smooth { &codes::SMOOTH_BINARY0 } else { &codes::BINARY0 })[sub()]),
            Kind::Compare => Code::Compare(codes::CMP0[sub()]),
            Kind::Scalar => Code::Scalar((if smooth { &codes::SMOOTH_SCALAR0 } else { &codes::SCALAR0 })[sub()]),
            Kind::Unary => loop {
                let op = codes::UNARY0[sub()];
                if !smooth || op.smooth() {
                    break Code::Unary(op);
                }
            },
            Kind::Reduce => Code::Reduce((if smooth { &codes::SMOOTH_REDUCE0 } else { &codes::REDUCE0 })[sub()]),
            Kind::Window => Code::Window((if smooth { &codes::SMOOTH_WINDOW0 } else { &codes::WINDOW0 })[sub()]),
            Kind::Clamp => Code::Clamp,
            Kind::MatMul => Code::MatMul,
            Kind::Reshape => Code::Reshape,
            Kind::Permute => Code::Permute,
            Kind::Transpose => Code::Transpose,
            Kind::BroadcastTo => Code::BroadcastTo,
            Kind::Squeeze => Code::Squeeze,
            Kind::Unsqueeze => Code::Unsqueeze,
            Kind::Narrow => Code::Narrow,
            Kind::Concat => Code::Concat,
            Kind::Stack => Code::Stack,
            Kind::IndexSelect => Code::IndexSelect,
            Kind::Where => Code::Where,
            Kind::Var => Code::Var,
            Kind::LogSumExp => Code::LogSumExp,
            Kind::Softmax => Code::Softmax,
            Kind::CrossEntropy => Code::CrossEntropy,
            Kind::Nll => Code::Nll,
            Kind::Bce => Code::Bce,
            Kind::Mse => Code::Mse,
            Kind::Detach => Code::Detach,
            Kind::WithGrad => Code::WithGrad,
            Kind::NoGrad => Code::NoGrad,
            Kind::Const => Code::Const,
            Kind::Full => Code::Full,
            Kind::Conv2d => Code::Conv2d,
        };
        (code, b as u8)
    }

    /// Generates one step (and any constants it needs).
    fn step(&mut self) {
        let (code, byte) = self.code();
        let step = match code {
            Code::Nop => Step::Nop { code: byte },
            Code::Binary(op) => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Binary { op, a, b }
            }
            Code::Compare(op) => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Compare { op, a, b }
            }
            Code::Scalar(op) => Step::Scalar { op, x: self.pick(), c: self.scalar() },
            Code::Clamp => {
                let (x, mut lo, mut hi) = (self.pick(), self.value(), self.value());
                if self.valid() && lo > hi {
                    std::mem::swap(&mut lo, &mut hi);
                }
                Step::Clamp { x, lo, hi }
            }
            Code::Unary(op) => Step::Unary { op, x: self.pick() },
            Code::MatMul => self.matmul(),
            Code::Linear => self.linear(),
            Code::LayerNorm => self.layer_norm(),
            Code::AttentionWeights => self.attention_weights(),
            Code::Attend => self.attend(),
            Code::Reshape => {
                let x = self.pick();
                let dims = if self.valid() {
                    let mut d = self.shape(x).to_vec();
                    for i in (1..d.len()).rev() {
                        d.swap(i, self.u.below(i + 1));
                    }
                    if d.len() < 6 && self.u.chance(1, 3) {
                        d.insert(self.u.below(d.len() + 1), 1);
                    }
                    if self.u.chance(1, 4) {
                        d = vec![model::numel(&d)];
                    }
                    d
                } else {
                    self.bad_dims()
                };
                Step::Reshape { x, dims }
            }
            Code::Permute => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let mut axes: Vec<usize> = (0..rank).collect();
                if self.valid() {
                    for i in (1..rank).rev() {
                        axes.swap(i, self.u.below(i + 1));
                    }
                } else {
                    axes =
                        (0..self.u.range(rank.saturating_sub(1), rank + 1)).map(|_| self.u.below(rank + 2)).collect();
                }
                Step::Permute { x, axes }
            }
            Code::Transpose => {
                let x = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                let (a0, a1) = if self.u.chance(1, 3) {
                    (-2, -1)
                } else {
                    (self.axis_for(rank, valid), self.axis_for(rank, valid))
                };
                Step::Transpose { x, a0, a1 }
            }
            Code::BroadcastTo => {
                let x = self.pick();
                let dims = if self.valid() {
                    let mut d = self.shape(x).to_vec();
                    for v in d.iter_mut().filter(|v| **v == 1) {
                        *v = self.u.range(1, 3);
                    }
                    for _ in 0..self.u.below(3) {
                        if d.len() < 6 {
                            d.insert(0, self.u.range(1, 3));
                        }
                    }
                    d
                } else {
                    self.bad_dims()
                };
                Step::BroadcastTo { x, dims }
            }
            Code::Squeeze => {
                let x = self.pick_where(|s| s.contains(&1)).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let ones: Vec<usize> = (0..shape.len()).filter(|&a| shape[a] == 1).collect();
                let axis = if self.valid() && !ones.is_empty() {
                    ones[self.u.below(ones.len())] as isize
                } else {
                    self.u.axis(shape.len())
                };
                Step::Squeeze { x, axis }
            }
            Code::Unsqueeze => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::Unsqueeze { x, axis: self.axis_for(rank + 1, valid) }
            }
            Code::Narrow => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let (start, len) = if valid {
                    let start = self.u.range(0, dim);
                    (start, self.u.range(0, dim - start))
                } else if self.u.chance(1, 4) {
                    (self.u.below(3), usize::MAX)
                } else {
                    (self.u.range(0, dim + 2), self.u.range(0, dim + 2))
                };
                Step::Narrow { x, axis, start, len }
            }
            Code::Concat | Code::Stack => {
                let x = self.pick_where(|s| !s.is_empty() || code == Code::Stack).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let stack = code == Code::Stack;
                let axis = self.axis_for(shape.len() + usize::from(stack), valid);
                let mut xs = vec![x];
                for _ in 0..self.u.below(3) {
                    let other = if !valid {
                        self.pick()
                    } else if stack {
                        self.pick_where(|s| s == shape).unwrap_or(x)
                    } else {
                        let ax = model::resolve(shape.len(), axis);
                        let agree = |s: &[usize]| {
                            s.len() == shape.len() && (0..s.len()).all(|d| Some(d) == ax || s[d] == shape[d])
                        };
                        self.pick_where(agree).unwrap_or(x)
                    };
                    xs.push(other);
                }
                if !valid && self.u.chance(1, 4) {
                    xs.clear();
                }
                if stack {
                    Step::Stack { xs, axis }
                } else {
                    Step::Concat { xs, axis }
                }
            }
            Code::IndexSelect => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let n = self.u.below(5);
                let indices = if valid {
                    (0..if dim == 0 { 0 } else { n }).map(|_| self.u.below(dim)).collect()
                } else if self.u.chance(1, 4) {
                    vec![(1 << 32) + self.u.below(2)]
                } else {
                    (0..n).map(|_| self.u.below(dim + 3)).collect()
                };
                Step::IndexSelect { x, axis, indices }
            }
            Code::PadAxis => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axis = self.axis_for(rank, valid);
                Step::PadAxis { x, axis, before: self.u.below(3), after: self.u.below(3) }
            }
            Code::ScatterAdd => {
                let x = self.pick();
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let len = 1 + self.u.below(4);
                // As for the labels below: a huge operand (`[2^32 - 1, 3]` after a zero-size
                // reduction) must not make the generator allocate an index per row.
                let indices = if dim > 1 << 16 {
                    (0..self.u.below(4)).map(|_| self.u.below(len)).collect()
                } else if valid {
                    (0..dim).map(|_| self.u.below(len)).collect()
                } else if self.u.chance(1, 2) {
                    (0..dim + 1).map(|_| self.u.below(len)).collect()
                } else {
                    (0..dim).map(|_| self.u.below(len + 3)).collect()
                };
                Step::ScatterAdd { x, axis, indices, len }
            }
            Code::Where => {
                let a = self.pick();
                let cond = self.partner(a);
                let b = self.partner(a);
                Step::Where { cond, a, b }
            }
            Code::Reduce(op) => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axes = (!self.u.chance(1, 3)).then(|| self.axes_for(rank, valid));
                Step::Reduce { op, x, axes, keepdim: self.u.chance(1, 2) }
            }
            Code::Var => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axes = self.axes_for(rank, valid);
                let correction = self.u.below(2);
                Step::Var { x, axes, keepdim: self.u.chance(1, 2), correction }
            }
            Code::LogSumExp => {
                let x = self.pick_where(|s| !s.is_empty() && !s.contains(&0)).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::LogSumExp { x, axis: self.axis_for(rank, valid), keepdim: self.u.chance(1, 2) }
            }
            Code::Softmax => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::Softmax { x, axis: self.axis_for(rank, valid), log: self.u.chance(1, 2) }
            }
            Code::CrossEntropy | Code::Nll => {
                let valid = self.valid();
                let x = match self.pick_where(|s| s.len() == 2 && s[1] > 0) {
                    Some(x) if self.u.chance(3, 4) || !valid => x,
                    _ => {
                        let dims = vec![self.u.range(1, 3), self.u.range(1, 4)];
                        self.constant(dims)
                    }
                };
                let shape = self.shape(x).to_vec();
                // A huge valid operand (a zero-size reduction can leave `[2^32 - 1, 3]`,
                // which the arena limit then stops) must not make the generator allocate
                // a label per row.
                let labels = if valid && shape.len() == 2 && shape[0] <= 1 << 16 {
                    (0..shape[0]).map(|_| self.u.below(shape[1])).collect()
                } else {
                    (0..self.u.below(4)).map(|_| self.u.below(5)).collect()
                };
                if code == Code::CrossEntropy {
                    Step::CrossEntropy { x, labels }
                } else {
                    Step::Nll { x, labels }
                }
            }
            Code::Bce => {
                let x = self.pick();
                let shape = self.shape(x).to_vec();
                let y = if !self.valid() {
                    self.pick()
                } else {
                    match self.pick_where(|s| s == shape) {
                        Some(y) if self.u.chance(1, 2) => y,
                        _ => self.constant(shape),
                    }
                };
                Step::Bce { x, y }
            }
            Code::Mse => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Mse { a, b }
            }
            Code::Detach => Step::Detach { x: self.pick() },
            Code::WithGrad => Step::WithGrad { x: self.pick() },
            Code::NoGrad => {
                // A unary, scalar or binary op under no_grad.
                let x = self.pick();
                match self.no_grad_inner(x) {
                    Ok(inner) => Step::NoGrad(Box::new(inner)),
                    Err(code) => Step::Nop { code },
                }
            }
            Code::Const => {
                let dims = if self.valid() { self.small_dims() } else { self.bad_dims() };
                let mut n: usize = if model::valid_dims(&dims) { model::numel(&dims) } else { 2 };
                if !self.valid() {
                    n = (n + 1).saturating_sub(self.u.below(3));
                }
                let data = self.data(n);
                Step::Const { dims, data }
            }
            Code::Full => {
                let dims = if self.valid() { self.small_dims() } else { self.bad_dims() };
                Step::Full { dims, v: self.value() }
            }
            Code::Conv2d => self.conv2d(),
            Code::Window(op) => self.window(op),
            Code::ZeroHuge => self.zero_huge(),
            Code::RepeatedAxes => self.repeated_axes(),
        };
        self.nops += usize::from(matches!(step, Step::Nop { .. }));
        self.push(step);
    }

    /// The op under `no_grad` on `x`: unary, scalar or binary; in format 1 the code byte
    /// of any other op, which makes the step a `Nop`.
    fn no_grad_inner(&mut self, x: usize) -> Result<Step, u8> {
        if self.format == Format::V1 {
            let b = self.u.byte();
            return match codes::FORMAT1[usize::from(b)] {
                Code::Unary(op) => Ok(Step::Unary { op, x }),
                Code::Scalar(op) => Ok(Step::Scalar { op, x, c: self.value() }),
                Code::Binary(op) => {
                    let b = self.partner(x);
                    Ok(Step::Binary { op, a: x, b })
                }
                _ => Err(b),
            };
        }
        Ok(match self.u.below(3) {
            0 => Step::Unary { op: codes::UNARY0[usize::from(self.u.byte())], x },
            1 => Step::Scalar { op: codes::SCALAR0[usize::from(self.u.byte())], x, c: self.value() },
            _ => {
                let b = self.partner(x);
                Step::Binary { op: codes::BINARY0[usize::from(self.u.byte())], a: x, b }
            }
        })
    }

    /// A 4-D operand `[N, C, H, W]` (made as a constant if none exists or now and then).
    fn image(&mut self) -> usize {
        match self.pick_where(|s| s.len() == 4 && s[2] > 0 && s[3] > 0) {
            Some(x) if self.u.chance(1, 2) => x,
            _ => {
                let dims = vec![self.u.range(1, 2), self.u.range(1, 3), self.u.range(1, 5), self.u.range(1, 5)];
                self.constant(dims)
            }
        }
    }

    /// Kernel, stride and padding: fitting `[h, w]` if `valid`, else small and often
    /// wrong, now and then huge.
    fn window_args(&mut self, hw: [usize; 2], valid: bool, pool: bool) -> [[usize; 2]; 3] {
        if !valid {
            let mut arg = || if self.u.chance(1, 8) { (1 << 31) + self.u.below(2) } else { self.u.below(4) };
            return [[arg(), arg()], [arg(), arg()], [arg(), arg()]];
        }
        let mut out = [[1; 2]; 3];
        for d in 0..2 {
            let k = self.u.range(1, hw[d].clamp(1, 3));
            let p = self.u.below(if pool { k / 2 + 1 } else { 2 });
            out[0][d] = k;
            out[1][d] = self.u.range(1, 2);
            out[2][d] = p;
        }
        out
    }

    fn window(&mut self, op: WindowOp) -> Step {
        let valid = self.valid();
        let x = if valid || self.u.chance(1, 2) { self.image() } else { self.pick() };
        let sx = self.shape(x).to_vec();
        let hw = if sx.len() == 4 { [sx[2], sx[3]] } else { [1, 1] };
        let [kernel, stride, padding] = self.window_args(hw, valid, op != WindowOp::Im2Col);
        Step::Window { op, x, kernel, stride, padding }
    }

    fn conv2d(&mut self) -> Step {
        let valid = self.valid();
        let x = if valid { self.image() } else { self.pick() };
        let sx = self.shape(x).to_vec();
        let hw = if sx.len() == 4 { [sx[2], sx[3]] } else { [1, 1] };
        let [kernel, stride, padding] = self.window_args(hw, valid, false);
        let w = if valid && sx.len() == 4 {
            let dims = vec![self.u.range(1, 3), sx[1], kernel[0], kernel[1]];
            self.constant(dims)
        } else {
            self.pick()
        };
        Step::Conv2d { x, w, stride, padding }
    }

    fn matmul(&mut self) -> Step {
        let a = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
        let sa = self.shape(a).to_vec();
        if sa.len() < 2 || !self.valid() {
            return Step::MatMul { a, b: self.pick() };
        }
        let (batch, k) = (&sa[..sa.len() - 2], sa[sa.len() - 1]);
        let fits =
            |s: &[usize]| s.len() >= 2 && s[s.len() - 2] == k && model::broadcast(&s[..s.len() - 2], batch).is_some();
        let b = match self.pick_where(fits) {
            Some(b) if self.u.chance(1, 2) => b,
            _ => {
                let mut dims = self.broadcastable(batch);
                dims.extend([k, self.u.range(1, 4)]);
                self.constant(dims)
            }
        };
        Step::MatMul { a, b }
    }

    /// `x.linear(w, b)`: valid, `w: [k, n]` and `b: [n]` fit `x`'s last dimension `k`
    /// (existing nodes when some fit, else new constants); invalid, any three nodes.
    fn linear(&mut self) -> Step {
        let x = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
        let sx = self.shape(x).to_vec();
        if sx.len() < 2 || !self.valid() {
            return Step::Linear { x, w: self.pick(), b: self.pick() };
        }
        let k = sx[sx.len() - 1];
        let w = match self.pick_where(|s| s.len() == 2 && s[0] == k) {
            Some(w) if self.u.chance(1, 2) => w,
            _ => {
                let n = self.u.range(1, 4);
                self.constant(vec![k, n])
            }
        };
        // A constant too large to draw comes back as a scalar: an invalid step then.
        let n = match *self.shape(w) {
            [_, n] => n,
            _ => return Step::Linear { x, w, b: self.pick() },
        };
        let b = match self.pick_where(|s| s == [n]) {
            Some(b) if self.u.chance(1, 2) => b,
            _ => self.constant(vec![n]),
        };
        Step::Linear { x, w, b }
    }

    /// `x.layer_norm(w, b, eps)`: valid, `w` and `b` are `[C]` for `x`'s last dimension
    /// `C` (existing nodes when some fit, else new constants) and `eps` is `0.5` in smooth
    /// programs (a row of nearly equal values then stays well conditioned for finite
    /// differences), else `1e-5` or `0`; invalid, any three nodes or a bad `eps`.
    fn layer_norm(&mut self) -> Step {
        let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
        let sx = self.shape(x).to_vec();
        let eps = if self.smooth { 0.5 } else { [1e-5, 0.0, 0.5][self.u.below(3)] };
        let Some(&c) = sx.last() else {
            return Step::LayerNorm { x, w: self.pick(), b: self.pick(), eps };
        };
        if !self.valid() {
            let eps = if self.u.chance(1, 2) { [-1.0, f64::NAN, f64::INFINITY][self.u.below(3)] } else { eps };
            return Step::LayerNorm { x, w: self.pick(), b: self.pick(), eps };
        }
        let mut row = || match self.pick_where(|s| s == [c]) {
            Some(v) if self.u.chance(1, 2) => v,
            _ => self.constant(vec![c]),
        };
        let (w, b) = (row(), row());
        Step::LayerNorm { x, w, b, eps }
    }

    /// A packed attention input `[B, T, 3·H·D]` for `heads = H`: an existing node of that
    /// shape when there is one, else a new constant (`B` 1–2, `T` 1–4, `D` 1–2).
    fn qkv_for(&mut self, heads: usize) -> usize {
        let fits = move |s: &[usize]| matches!(*s, [_, _, c3] if c3 > 0 && c3 % (3 * heads) == 0);
        match self.pick_where(fits) {
            Some(x) if self.u.chance(1, 2) => x,
            _ => {
                let (b, t, d) = (self.u.range(1, 2), self.u.range(1, 4), self.u.range(1, 2));
                self.constant(vec![b, t, 3 * heads * d])
            }
        }
    }

    /// `qkv.attention_weights(heads, causal)`: valid, `heads` 1–2 and `qkv` from
    /// [`qkv_for`](Self::qkv_for); invalid, any node and `heads` from 0 to 3 (0, or a
    /// width it does not divide, is the recorded error).
    fn attention_weights(&mut self) -> Step {
        let causal = self.u.chance(1, 2);
        if !self.valid() {
            return Step::AttentionWeights { qkv: self.pick(), heads: self.u.below(4), causal };
        }
        let heads = self.u.range(1, 2);
        Step::AttentionWeights { qkv: self.qkv_for(heads), heads, causal }
    }

    /// `p.attend(qkv)`: valid, `p: [B, H, T, T]` (an existing node when one fits `qkv`,
    /// else a constant) for a `qkv` from [`qkv_for`](Self::qkv_for); invalid, any two nodes.
    fn attend(&mut self) -> Step {
        if !self.valid() {
            return Step::Attend { p: self.pick(), qkv: self.pick() };
        }
        let heads = self.u.range(1, 2);
        let qkv = self.qkv_for(heads);
        // After a step that errs, every shape reads `[]` (the program is poisoned).
        let [b, t, _] = *self.shape(qkv) else {
            return Step::Attend { p: self.pick(), qkv };
        };
        let p = match self.pick_where(|s| s == [b, heads, t, t]) {
            Some(p) if self.u.chance(1, 2) => p,
            _ => self.constant(vec![b, heads, t, t]),
        };
        Step::Attend { p, qkv }
    }
}
