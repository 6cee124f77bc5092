//! Elementwise unary ops `y = f(x)`, one table: each row of [`unary_fns!`] gives a
//! function's variant, its name, its forward formula and its derivative, side by side.
//! Backward is `dx += dout ⊙ f'(x)`, with `f'` written in terms of `x`, `y` and the scalar
//! arguments `c`.
//!
//! | op            | `y`                                   | `f'(x)`                          | edges (value, gradient)                 |
//! |---------------|---------------------------------------|----------------------------------|-----------------------------------------|
//! | `neg`         | `-x`                                  | `-1`                             |                                         |
//! | `add_scalar`  | `x + c`                               | `1`                              |                                         |
//! | `mul_scalar`  | `c·x`                                 | `c`                              |                                         |
//! | `powf`        | `x^p`                                 | `p·x^(p-1)`, `0` if `p = 0`      | `x < 0`, fractional `p`: NaN            |
//! | `exp`         | `eˣ`                                  | `y`                              |                                         |
//! | `log`         | `ln x`                                | `1/x`                            | `log 0 = -∞`, `1/0 = ∞`; `x < 0`: NaN   |
//! | `log1p`       | `ln(1 + x)`, accurate near 0          | `1/(1 + x)`                      | `log1p(-1) = -∞`, grad `∞`; `x < -1`: NaN value, grad `1/(1+x)` |
//! | `expm1`       | `eˣ − 1`, accurate near 0             | `y + 1`                          |                                         |
//! | `sqrt`        | `√x`                                  | `1/(2y)`                         | `sqrt 0 = 0`, grad `∞`; `x < 0`: NaN    |
//! | `rsqrt`       | `1/√x`                                | `-y³/2`                          | `rsqrt 0 = ∞`, grad `-∞`; `x < 0`: NaN  |
//! | `square`      | `x²`                                  | `2x`                             |                                         |
//! | `recip`       | `1/x`                                 | `-y²`                            | `1/0 = ∞`, grad `-∞`                    |
//! | `abs`         | `\|x\|`                               | `sign x` (0 at 0)                |                                         |
//! | `sin`, `cos`  | `sin x`, `cos x`                      | `cos x`, `-sin x`                |                                         |
//! | `tanh`        | `tanh x`                              | `1 - y²`                         |                                         |
//! | `atan`        | `atan x`                              | `1/(1 + x²)`                     | `atan ±∞ = ±π/2`, grad `0`              |
//! | `erf`         | `erf x`                               | `2/√π · e^(−x²)`                 |                                         |
//! | `sigmoid`     | `1/(1+e⁻ˣ)` (stable)                  | `y(1-y)`                         |                                         |
//! | `relu`        | `max(x, 0)`                           | `1` if `y > 0`, else `0`         | NaN: value NaN, gradient passes `dout` (PyTorch) |
//! | `leaky_relu`  | `x` if `x > 0`, else `αx`             | `1` or `α`                       |                                         |
//! | `gelu`        | `x·Φ(x)`, `Φ(x) = (1 + erf(x/√2))/2`  | `Φ(x) + x·φ(x)`                  |                                         |
//! | `gelu_tanh`   | `x(1 + tanh u)/2`, `u = √(2/π)(x + 0.044715x³)` | `(1+t)/2 + x(1-t²)u'/2` |                                   |
//! | `softplus`    | `ln(1 + eˣ)` (stable)                 | `sigmoid x`                      |                                         |
//! | `silu`        | `x·σ(x)`                              | `σ(x)(1 + x(1 − σ(x)))`          |                                         |
//! | `clamp`       | `min(max(x, lo), hi)`                 | `1` inside `[lo, hi]`, else `0`  | NaN: value NaN, gradient `0` (PyTorch)  |
//!
//! The recorded derivative (`grad`, for [`Scope::grad`](crate::Scope::grad)) writes the same
//! `f'` with ops on `x` and `y`, so that it can be differentiated again; the piecewise
//! functions (`abs`, `relu`, `leaky_relu`, `clamp`) multiply by their derivative as a
//! constant mask, so their second derivative is 0 (almost everywhere, as in PyTorch).
//!
//! Kinks (`abs`, `relu`, `clamp` at their edges) use the subgradient shown. Every function
//! maps NaN to NaN. The `match` on the function runs once per op, outside the element
//! loop, so each function keeps its own (vectorisable) inner loop.

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels::unary_fn::UnaryFn;
use crate::kernels::{self, par, ElementMap, GradMap};
use crate::record::ctx::{BackwardCtx, First, GradCtx, JvpCtx, Rec, FIRST_MIN};
use crate::record::handles::{Core, Var};
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};
use crate::tape::tape::Tape;
use faer::Par;

/// Recording: the output filled from the input in one pass, straight into the arena; a
/// large input is split over the graph's threads (see [`par`]).
struct Record<'r, 'a, 's, T> {
    r: &'r Rec<'a, 's, T>,
    x: &'s [T],
    par: Par,
}

impl<'s, T: Float> ElementMap<T> for Record<'_, '_, 's, T> {
    type Out = Result<&'s mut [T]>;
    #[inline]
    fn map(self, f: impl Fn(T) -> T + Sync) -> Self::Out {
        if self.x.len() < par::MIN_PARALLEL {
            // The arena fills long values under SIMD dispatch (`storage::fill_from`).
            // `move`: the iterator owns `f` (and its scalar arguments), so the vectorised
            // fill loop keeps them in registers instead of reloading them after every store.
            self.r.alloc_iter(self.x.iter().map(move |&v| f(v)))
        } else {
            record_large(self.r, self.x, self.par, f)
        }
    }
    #[inline]
    fn map_long(self, f: impl Fn(T) -> T + Sync) -> Self::Out {
        if self.x.len() < par::MIN_PARALLEL {
            record_long(self.r, self.x, f)
        } else {
            record_large(self.r, self.x, self.par, f)
        }
    }
}

/// Recording of a long formula, out of line: short inputs fill through the iterator,
/// long ones through [`kernels::map`], whose slice loop vectorises under SIMD dispatch
/// (an iterator whose `next` holds the whole formula is not inlined into the fill loop).
#[inline(never)]
fn record_long<'s, T: Float>(r: &Rec<'_, 's, T>, x: &[T], f: impl Fn(T) -> T) -> Result<&'s mut [T]> {
    if x.len() < kernels::simd::MIN_LEN {
        return r.alloc_iter(x.iter().map(move |&v| f(v)));
    }
    let out = r.alloc_written(x.len())?;
    kernels::map(x, out, f);
    Ok(out)
}

/// Recording over the input's own buffer, which a checkpoint's recomputation handed over
/// (see [`Core::record_reading`](crate::record::core::Core::record_reading)).
struct InPlaceMap<'s, T> {
    buf: &'s mut [T],
    par: Par,
}

impl<'s, T: Float> ElementMap<T> for InPlaceMap<'s, T> {
    type Out = &'s mut [T];
    fn map(self, f: impl Fn(T) -> T + Sync) -> Self::Out {
        par::map_in_place(self.par, self.buf, f);
        self.buf
    }
    fn map_long(self, f: impl Fn(T) -> T + Sync) -> Self::Out {
        self.map(f)
    }
}

/// The split recording of a large input, out of line so that the small case stays tight.
#[inline(never)]
fn record_large<'s, T: Float>(
    r: &Rec<'_, 's, T>,
    x: &[T],
    threads: Par,
    f: impl Fn(T) -> T + Sync,
) -> Result<&'s mut [T]> {
    let out = r.alloc_written(x.len())?;
    par::map(threads, x, out, f);
    Ok(out)
}

/// Backward: `dx += dout ⊙ f'(x, y)`. The values of `x` and `y` are looked up only for
/// derivatives that read them.
struct Grad<'a, 's, T> {
    tape: &'a Tape<'s, T>,
    x: NodeId<'s>,
    y: NodeId<'s>,
    dout: &'a [T],
    dx: &'a mut [T],
    par: Par,
}

impl<T: Float> GradMap<T> for Grad<'_, '_, T> {
    type Out = ();
    #[inline]
    fn map(self, d: impl Fn(T, T) -> T + Sync) {
        par::map_grad(self.par, self.dout, self.tape.value(self.x), self.tape.value(self.y), self.dx, d);
    }
    #[inline]
    fn scale(self, c: T) {
        par::axpy(self.par, self.dx, c, self.dout);
    }
    #[inline]
    fn map_long(self, d: impl Fn(T, T) -> T + Sync) {
        let (x, y) = (self.tape.value(self.x), self.tape.value(self.y));
        if self.dout.len() < par::MIN_PARALLEL {
            kernels::map_grad_long(self.dout, x, y, self.dx, d);
        } else {
            par::map_grad(self.par, self.dout, x, y, self.dx, d);
        }
    }
}

impl<'s, T: Float> Var<'s, T> {
    /// Records `F(self)`, `F` a [`UnaryFn`]'s code: each function gets its own copy of
    /// this method, in which the function is a constant.
    #[track_caller]
    #[inline(always)]
    fn unary<const F: u8>(self, c: [T; 2]) -> Var<'s, T> {
        let f = const { UnaryFn::from_code(F) };
        if const { UnaryFn::from_code(F).reads_only_output() } {
            let location = std::panic::Location::caller();
            // The closures are forced inline too (see `UnaryFn::forward`): W3's chain is
            // nothing but this path.
            return self.core.record_reading(
                OpKind::Unary(f).name(),
                location,
                Some(self.id),
                #[inline(always)]
                |r, held| {
                    let n = r.node(self.id);
                    let out = match held {
                        Some(buf) => {
                            let buf = f.forward(c, InPlaceMap { buf, par: self.core.par });
                            r.overwrite(self.id, buf)
                        }
                        None => f.forward(c, Record { r, x: n.value, par: self.core.par })?,
                    };
                    Ok((Op::Unary { f, x: self.id, c }, n.shape, out))
                },
            );
        }
        self.core.record(
            OpKind::Unary(f),
            #[inline(always)]
            |r| {
                let n = r.node(self.id);
                let out = f.forward(c, Record { r, x: n.value, par: self.core.par })?;
                Ok((Op::Unary { f, x: self.id, c }, n.shape, out))
            },
        )
    }

    /// `-x`. (Also the `-` operator.)
    #[track_caller]
    pub(crate) fn neg_(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Neg as u8 }>([T::ZERO; 2])
    }

    /// `x + c` for a scalar `c`. (Also `x + c`, `c + x` and `x - c`.)
    #[track_caller]
    pub fn add_scalar(self, c: T) -> Var<'s, T> {
        self.unary::<{ UnaryFn::AddScalar as u8 }>([c, T::ZERO])
    }

    /// `c·x` for a scalar `c`. (Also `x * c`, `c * x` and `x / c`.)
    #[track_caller]
    pub fn mul_scalar(self, c: T) -> Var<'s, T> {
        self.unary::<{ UnaryFn::MulScalar as u8 }>([c, T::ZERO])
    }

    /// `x^p` for a scalar exponent `p`; the gradient is 0 everywhere when `p = 0`.
    #[track_caller]
    pub fn powf(self, p: T) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Powf as u8 }>([p, T::ZERO])
    }

    /// `eˣ`.
    #[track_caller]
    pub fn exp(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Exp as u8 }>([T::ZERO; 2])
    }

    /// Natural logarithm.
    #[track_caller]
    pub fn log(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Log as u8 }>([T::ZERO; 2])
    }

    /// `ln(1 + x)`, accurate for small `|x|`; `log1p(-1) = -∞` with gradient `∞`.
    #[track_caller]
    pub fn log1p(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Log1p as u8 }>([T::ZERO; 2])
    }

    /// `eˣ − 1`, accurate for small `|x|`.
    #[track_caller]
    pub fn expm1(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Expm1 as u8 }>([T::ZERO; 2])
    }

    /// Square root.
    #[track_caller]
    pub fn sqrt(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Sqrt as u8 }>([T::ZERO; 2])
    }

    /// `1/√x`; `rsqrt(0) = ∞` with gradient `-∞`, NaN for `x < 0`.
    #[track_caller]
    pub fn rsqrt(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Rsqrt as u8 }>([T::ZERO; 2])
    }

    /// `x²`.
    #[track_caller]
    pub fn square(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Square as u8 }>([T::ZERO; 2])
    }

    /// `1/x`.
    #[track_caller]
    pub fn recip(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Recip as u8 }>([T::ZERO; 2])
    }

    /// `|x|` (gradient 0 at 0).
    #[track_caller]
    pub fn abs(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Abs as u8 }>([T::ZERO; 2])
    }

    /// Sine.
    #[track_caller]
    pub fn sin(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Sin as u8 }>([T::ZERO; 2])
    }

    /// Cosine.
    #[track_caller]
    pub fn cos(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Cos as u8 }>([T::ZERO; 2])
    }

    /// Hyperbolic tangent.
    #[track_caller]
    pub fn tanh(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Tanh as u8 }>([T::ZERO; 2])
    }

    /// Arctangent, in `(−π/2, π/2)`.
    #[track_caller]
    pub fn atan(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Atan as u8 }>([T::ZERO; 2])
    }

    /// The error function `erf x = 2/√π ∫₀ˣ e^(−t²) dt`.
    #[track_caller]
    pub fn erf(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Erf as u8 }>([T::ZERO; 2])
    }

    /// Logistic sigmoid `1/(1+e⁻ˣ)`, stable for large `|x|`.
    #[track_caller]
    pub fn sigmoid(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Sigmoid as u8 }>([T::ZERO; 2])
    }

    /// `max(x, 0)` (gradient 0 at 0; NaN stays NaN).
    #[track_caller]
    pub fn relu(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Relu as u8 }>([T::ZERO; 2])
    }

    /// `x` for `x > 0`, else `slope·x`.
    #[track_caller]
    pub fn leaky_relu(self, slope: T) -> Var<'s, T> {
        self.unary::<{ UnaryFn::LeakyRelu as u8 }>([slope, T::ZERO])
    }

    /// GELU with the exact normal CDF: `x·Φ(x)`.
    #[track_caller]
    pub fn gelu(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Gelu as u8 }>([T::ZERO; 2])
    }

    /// GELU with the tanh approximation used by GPT-2 and BERT.
    #[track_caller]
    pub fn gelu_tanh(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::GeluTanh as u8 }>([T::ZERO; 2])
    }

    /// `ln(1 + eˣ)`, computed without overflow.
    #[track_caller]
    pub fn softplus(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Softplus as u8 }>([T::ZERO; 2])
    }

    /// SiLU (swish): `x·σ(x)`.
    #[track_caller]
    pub fn silu(self) -> Var<'s, T> {
        self.unary::<{ UnaryFn::Silu as u8 }>([T::ZERO; 2])
    }

    /// `min(max(x, lo), hi)`; NaN stays NaN.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded) if `lo > hi`
    /// or either bound is NaN.
    #[track_caller]
    pub fn clamp(self, lo: T, hi: T) -> Var<'s, T> {
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(lo <= hi) {
            let location = std::panic::Location::caller();
            let shape = self.shape();
            return self.core.fail_as(UnaryFn::Clamp.name(), |op| Error::InvalidArgument {
                op,
                detail: format!("bounds lo = {lo} and hi = {hi} need lo <= hi (input shape {shape})"),
                location,
            });
        }
        self.unary::<{ UnaryFn::Clamp as u8 }>([lo, hi])
    }
}

/// `dx += dout ⊙ f'(x)` for `out = f(x)`.
#[inline]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    f: UnaryFn,
    x: NodeId<'s>,
    c: [T; 2],
) -> Result<()> {
    let (tape, par) = (ctx.tape, ctx.par);
    // `out`'s gradient has `x`'s length; reading it is cheaper than `x`'s shape.
    let n = ctx.grads[out].as_deref().map_or(0, <[T]>::len);
    if n > FIRST_MIN && backward_first(ctx, out, f, x, c)? {
        return Ok(());
    }
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        f.derivative(c, Grad { tape, x, y: out, dout, dx, par });
    }
    Ok(())
}

/// [`backward`] on more than [`FIRST_MIN`] elements: builds `x`'s first gradient in one
/// pass instead of zeroing it and adding to it (see [`BackwardCtx::first_grad_slot`]), or,
/// where that does not apply, on [`par::MIN_PARALLEL`] elements or more writes a first
/// gradient over the threads and adds any other. `false` if it did nothing. Out of line,
/// so that the short path stays as short as it was.
#[inline(never)]
fn backward_first<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    f: UnaryFn,
    x: NodeId<'s>,
    c: [T; 2],
) -> Result<bool> {
    let (tape, par) = (ctx.tape, ctx.par);
    if let Some((dout, first)) = ctx.first_grad_slot(out, x) {
        f.derivative(c, FirstGrad { first, x: tape.value(x), y: tape.value(out), dout })?;
        return Ok(true);
    }
    if ctx.grads[out].as_deref().map_or(0, <[T]>::len) < par::MIN_PARALLEL {
        return Ok(false);
    }
    match ctx.grad_pair_write(out, x)? {
        Some((dout, dx, true)) => {
            f.derivative(c, par::WriteGrad { x: tape.value(x), y: tape.value(out), dout, dx, par })
        }
        Some((dout, dx, false)) => f.derivative(c, Grad { tape, x, y: out, dout, dx, par }),
        None => {}
    }
    Ok(true)
}

/// [`Grad`] for the input's first gradient: builds the buffer from `dout ⊙ f'(x, y)` in
/// one pass (see [`BackwardCtx::first_grad_slot`]).
struct FirstGrad<'a, 's, T> {
    first: First<'a, 's, T>,
    x: &'a [T],
    y: &'a [T],
    dout: &'a [T],
}

impl<T: Float> GradMap<T> for FirstGrad<'_, '_, T> {
    type Out = Result<()>;
    #[inline]
    fn map(self, d: impl Fn(T, T) -> T + Sync) -> Result<()> {
        let values = self.dout.iter().zip(self.x).zip(self.y).map(move |((&g, &x), &y)| g * d(x, y));
        self.first.set(values)
    }
    #[inline]
    fn scale(self, c: T) -> Result<()> {
        self.first.set(self.dout.iter().map(move |&g| c * g))
    }
    #[inline]
    fn map_long(self, d: impl Fn(T, T) -> T + Sync) -> Result<()> {
        self.map(d)
    }
}

/// Writes `f'(x, y)` elementwise into a constant: the derivative of a piecewise function
/// (`abs`, `relu`, `leaky_relu`, `clamp`), whose own derivative is 0 almost everywhere.
struct Mask<'a, T> {
    x: &'a [T],
    y: &'a [T],
    out: &'a mut [T],
}

impl<T: Float> GradMap<T> for Mask<'_, T> {
    type Out = ();
    fn map(self, d: impl Fn(T, T) -> T) {
        for ((o, &x), &y) in self.out.iter_mut().zip(self.x).zip(self.y) {
            *o = d(x, y);
        }
    }
    fn scale(self, c: T) {
        self.out.fill(c);
    }
    fn map_long(self, d: impl Fn(T, T) -> T + Sync) {
        self.map(d);
    }
}

/// Recorded derivative: `dx = g ⊙ f'(x)`, with `f'` written in ops on `x` and `y` so that it
/// can be differentiated again; piecewise functions use their mask as a constant.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    f: UnaryFn,
    x: NodeId<'s>,
    c: [T; 2],
) -> Result<()> {
    if ctx.wants(x) {
        if let Some(dx) = scaled(ctx.core, "grad", out, g, f, x, c) {
            ctx.add(x, dx);
        }
    }
    Ok(())
}

/// Forward rule: `t = f'(x) ⊙ tx`, the same product as the recorded derivative (the
/// Jacobian is diagonal).
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    f: UnaryFn,
    x: NodeId<'s>,
    c: [T; 2],
) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).and_then(|t| scaled(ctx.core, "jvp", out, t, f, x, c)))
}

/// `g ⊙ f'(x)` as recorded ops (`y` is the output `out`), or `None` where `f'` is zero;
/// constants (masks) are recorded under `name`.
#[track_caller]
fn scaled<'s, T: Float>(
    core: &'s Core<'s, T>,
    name: &'static str,
    out: NodeId<'s>,
    g: Var<'s, T>,
    f: UnaryFn,
    x: NodeId<'s>,
    c: [T; 2],
) -> Option<Var<'s, T>> {
    use UnaryFn::*;
    let (xv, y) = (Var { core, id: x }, Var { core, id: out });
    let k = T::from_f64;
    let one = T::ONE;
    Some(match f {
        Neg => -g,
        AddScalar => g,
        MulScalar => g.mul_scalar(c[0]),
        // `x^0 = 1` has derivative 0: no contribution.
        Powf if c[0] == T::ZERO => return None,
        Powf => g * xv.powf(c[0] - one).mul_scalar(c[0]),
        Exp => g * y,
        Log => g / xv,
        Log1p => g / xv.add_scalar(one),
        Expm1 => g * y.add_scalar(one),
        Sqrt => g.mul_scalar(k(0.5)) / y,
        Rsqrt => g * y.powf(k(3.0)).mul_scalar(k(-0.5)),
        Square => g * xv.mul_scalar(k(2.0)),
        Recip => -(g * y.square()),
        Sin => g * xv.cos(),
        Cos => -(g * xv.sin()),
        Tanh => g * (-y.square()).add_scalar(one),
        Atan => g / xv.square().add_scalar(one),
        Erf => g * (-xv.square()).exp().mul_scalar(k(std::f64::consts::FRAC_2_SQRT_PI)),
        Sigmoid => g * (y - y.square()),
        Gelu => {
            // Φ(x) + x·φ(x)
            let cdf = xv.mul_scalar(k(std::f64::consts::FRAC_1_SQRT_2)).erf().mul_scalar(k(0.5)).add_scalar(k(0.5));
            let pdf = xv.square().mul_scalar(k(-0.5)).exp().mul_scalar(k(0.398_942_280_401_432_7)); // 1/√(2π)
            g * (cdf + xv * pdf)
        }
        GeluTanh => {
            // (1 + t)/2 + x(1 − t²)u'/2, t = tanh u, u = k(x + c x³), u' = k(1 + 3c x²)
            let (kk, cc) = (k((2.0 / std::f64::consts::PI).sqrt()), k(0.044715));
            let x2 = xv.square();
            let t = (xv + x2 * xv.mul_scalar(cc)).mul_scalar(kk).tanh();
            let du = x2.mul_scalar(k(3.0) * cc * kk).add_scalar(kk);
            let d = t.add_scalar(one).mul_scalar(k(0.5)) + xv * (-t.square()).add_scalar(one) * du.mul_scalar(k(0.5));
            g * d
        }
        Softplus => g * xv.sigmoid(),
        Silu => {
            // σ(1 + x(1 − σ))
            let s = xv.sigmoid();
            g * (s + xv * (s - s.square()))
        }
        Abs | Relu | LeakyRelu | Clamp => {
            let shape = core.tape.borrow().shape(x);
            let mask = core.constant(name, shape, |tape, out| {
                f.derivative(c, Mask { x: tape.value(x), y: tape.value(y.id), out });
            });
            g * mask
        }
    })
}
