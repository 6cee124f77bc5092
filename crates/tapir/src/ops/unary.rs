//! Elementwise unary ops. For `y = f(x)` backward is `dx += dout ⊙ f'(x)`:
//!
//! | op            | `y`                                   | `f'(x)`                          |
//! |---------------|---------------------------------------|----------------------------------|
//! | `neg`         | `-x`                                  | `-1`                             |
//! | `add_scalar`  | `x + c`                               | `1`                              |
//! | `mul_scalar`  | `c·x`                                 | `c`                              |
//! | `powf`        | `x^p`                                 | `p·x^(p-1)`                      |
//! | `exp`         | `eˣ`                                  | `y`                              |
//! | `log`         | `ln x`                                | `1/x`                            |
//! | `sqrt`        | `√x`                                  | `1/(2y)`                         |
//! | `square`      | `x²`                                  | `2x`                             |
//! | `recip`       | `1/x`                                 | `-y²`                            |
//! | `abs`         | `|x|`                                 | `sign x` (0 at 0)                |
//! | `sin`, `cos`  | `sin x`, `cos x`                      | `cos x`, `-sin x`                |
//! | `tanh`        | `tanh x`                              | `1 - y²`                         |
//! | `sigmoid`     | `1/(1+e⁻ˣ)`                           | `y(1-y)`                         |
//! | `relu`        | `max(x, 0)`                           | `1` if `x > 0`, else `0`         |
//! | `leaky_relu`  | `x` if `x > 0`, else `αx`             | `1` or `α`                       |
//! | `gelu`        | `x·Φ(x)`, `Φ(x) = (1 + erf(x/√2))/2`   | `Φ(x) + x·φ(x)`                  |
//! | `gelu_tanh`   | `x(1 + tanh u)/2`, `u = √(2/π)(x + 0.044715x³)` | `(1+t)/2 + x(1-t²)u'/2`  |
//! | `softplus`    | `ln(1 + eˣ)` (computed stably)         | `sigmoid x`                      |
//! | `clamp`       | `min(max(x, lo), hi)`                 | `1` inside `[lo, hi]`, else `0`  |
//!
//! Kinks (`abs`, `relu`, `clamp` at their edges) use the subgradient shown.

use crate::error::Result;
use crate::graph::backward::BackwardCtx;
use crate::graph::{NodeId, Var};
use crate::kernels;
use crate::ops::Op;
use crate::Float;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

/// `1/(1+e⁻ˣ)` without overflow for large `|x|`.
pub(crate) fn sigmoid<T: Float>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// `ln(1 + eˣ) = max(x, 0) + ln(1 + e^-|x|)`, which never overflows.
pub(crate) fn softplus<T: Float>(x: T) -> T {
    x.max(T::ZERO) + (-x.abs()).exp().ln_1p()
}

pub(crate) fn sign<T: Float>(x: T, _y: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        -T::ONE
    } else {
        T::ZERO
    }
}

pub(crate) fn gelu_tanh<T: Float>(x: T) -> T {
    let u = T::from_f64(SQRT_2_OVER_PI) * (x + T::from_f64(GELU_C) * x * x * x);
    T::from_f64(0.5) * x * (T::ONE + u.tanh())
}

pub(crate) fn gelu_tanh_grad<T: Float>(x: T) -> T {
    let k = T::from_f64(SQRT_2_OVER_PI);
    let c = T::from_f64(GELU_C);
    let t = (k * (x + c * x * x * x)).tanh();
    let du = k * (T::ONE + T::from_f64(3.0) * c * x * x);
    T::from_f64(0.5) * (T::ONE + t) + T::from_f64(0.5) * x * (T::ONE - t * t) * du
}

fn phi_cdf<T: Float>(x: T) -> T {
    T::from_f64(0.5) * (T::ONE + (x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf())
}

pub(crate) fn gelu_erf<T: Float>(x: T) -> T {
    x * phi_cdf(x)
}

pub(crate) fn gelu_erf_grad<T: Float>(x: T) -> T {
    let pdf = (-(x * x) * T::from_f64(0.5)).exp() * T::from_f64(0.398_942_280_401_432_7);
    phi_cdf(x) + x * pdf
}

impl<'s, T: Float> Var<'s, T> {
    #[track_caller]
    #[inline]
    fn unary(self, name: &'static str, op: Op<'s, T>, f: impl Fn(T) -> T) -> Var<'s, T> {
        self.core.record(name, |r| {
            let n = r.node(self.id);
            let out = r.alloc_iter(n.value.iter().map(|&v| f(v)))?;
            Ok((op, n.shape, out))
        })
    }

    /// `-x`. (Also the `-` operator.)
    #[track_caller]
    pub(crate) fn neg_(self) -> Var<'s, T> {
        self.unary("neg", Op::Neg { x: self.id }, |v| -v)
    }

    /// `x + c` for a scalar `c`. (Also `x + c`, `c + x` and `x - c`.)
    #[track_caller]
    pub fn add_scalar(self, c: T) -> Var<'s, T> {
        self.unary("add_scalar", Op::AddScalar { x: self.id }, |v| v + c)
    }

    /// `c·x` for a scalar `c`. (Also `x * c`, `c * x` and `x / c`.)
    #[track_caller]
    pub fn mul_scalar(self, c: T) -> Var<'s, T> {
        self.unary("mul_scalar", Op::MulScalar { x: self.id, c }, |v| v * c)
    }

    /// `x^p` for a scalar exponent `p`.
    #[track_caller]
    pub fn powf(self, p: T) -> Var<'s, T> {
        self.unary("powf", Op::PowScalar { x: self.id, p }, |v| v.powf(p))
    }

    /// `eˣ`.
    #[track_caller]
    pub fn exp(self) -> Var<'s, T> {
        self.unary("exp", Op::Exp { x: self.id }, T::exp)
    }

    /// Natural logarithm.
    #[track_caller]
    pub fn log(self) -> Var<'s, T> {
        self.unary("log", Op::Log { x: self.id }, T::ln)
    }

    /// Square root.
    #[track_caller]
    pub fn sqrt(self) -> Var<'s, T> {
        self.unary("sqrt", Op::Sqrt { x: self.id }, T::sqrt)
    }

    /// `x²`.
    #[track_caller]
    pub fn square(self) -> Var<'s, T> {
        self.unary("square", Op::Square { x: self.id }, |v| v * v)
    }

    /// `1/x`.
    #[track_caller]
    pub fn recip(self) -> Var<'s, T> {
        self.unary("recip", Op::Recip { x: self.id }, |v| T::ONE / v)
    }

    /// `|x|` (gradient 0 at 0).
    #[track_caller]
    pub fn abs(self) -> Var<'s, T> {
        self.unary("abs", Op::Abs { x: self.id }, T::abs)
    }

    /// Sine.
    #[track_caller]
    pub fn sin(self) -> Var<'s, T> {
        self.unary("sin", Op::Sin { x: self.id }, T::sin)
    }

    /// Cosine.
    #[track_caller]
    pub fn cos(self) -> Var<'s, T> {
        self.unary("cos", Op::Cos { x: self.id }, T::cos)
    }

    /// Hyperbolic tangent.
    #[track_caller]
    pub fn tanh(self) -> Var<'s, T> {
        self.unary("tanh", Op::Tanh { x: self.id }, T::tanh)
    }

    /// Logistic sigmoid `1/(1+e⁻ˣ)`, stable for large `|x|`.
    #[track_caller]
    pub fn sigmoid(self) -> Var<'s, T> {
        self.unary("sigmoid", Op::Sigmoid { x: self.id }, sigmoid)
    }

    /// `max(x, 0)` (gradient 0 at 0).
    #[track_caller]
    pub fn relu(self) -> Var<'s, T> {
        self.unary("relu", Op::Relu { x: self.id }, |v| if v > T::ZERO { v } else { T::ZERO })
    }

    /// `x` for `x > 0`, else `slope·x`.
    #[track_caller]
    pub fn leaky_relu(self, slope: T) -> Var<'s, T> {
        self.unary("leaky_relu", Op::LeakyRelu { x: self.id, slope }, |v| if v > T::ZERO { v } else { slope * v })
    }

    /// GELU with the exact normal CDF: `x·Φ(x)`.
    #[track_caller]
    pub fn gelu(self) -> Var<'s, T> {
        self.unary("gelu", Op::GeluErf { x: self.id }, gelu_erf)
    }

    /// GELU with the tanh approximation used by GPT-2 and BERT.
    #[track_caller]
    pub fn gelu_tanh(self) -> Var<'s, T> {
        self.unary("gelu_tanh", Op::GeluTanh { x: self.id }, gelu_tanh)
    }

    /// `ln(1 + eˣ)`, computed without overflow.
    #[track_caller]
    pub fn softplus(self) -> Var<'s, T> {
        self.unary("softplus", Op::Softplus { x: self.id }, softplus)
    }

    /// `min(max(x, lo), hi)`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded) if `lo > hi`
    /// or either bound is NaN.
    #[track_caller]
    pub fn clamp(self, lo: T, hi: T) -> Var<'s, T> {
        #[allow(clippy::neg_cmp_op_on_partial_ord)]
        if !(lo <= hi) {
            let location = std::panic::Location::caller();
            return self.core.fail(crate::Error::InvalidArgument {
                op: "clamp",
                detail: format!("bounds lo = {lo} and hi = {hi} need lo <= hi (input shape {})", self.shape()),
                location,
            });
        }
        self.unary("clamp", Op::Clamp { x: self.id, lo, hi }, |v| v.max(lo).min(hi))
    }
}

/// `dx += dout ⊙ d(x, y)` for `y = f(x)`.
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    d: impl Fn(T, T) -> T,
) -> Result<()> {
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::map_grad(dout, xv, yv, dx, d);
    }
    Ok(())
}

/// `dx += c·dout`.
pub(crate) fn backward_scale<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    c: T,
) -> Result<()> {
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::axpy(dx, c, dout);
    }
    Ok(())
}
