//! The generator behind [`Program::from_bytes`]: it tracks every value's shape while it
//! decodes, so that most arguments are valid and programs get deep, and draws an
//! argument without regard to the shapes about one step in sixteen.

use crate::codes::{self, Code, Format, Kind};
use crate::model::{self, Outcome};
use crate::program::{Dtype, Ending, Leaf, Program, Step, MAX_STEPS};
use crate::unstructured::Unstructured;

mod adversarial;
mod args;
mod step;

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

impl Program {
    /// Decodes a program; every byte string gives one (see [`crate::codes`] for the format).
    pub fn from_bytes(bytes: &[u8]) -> Program {
        program(bytes)
    }
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
}
