//! Scalar math shared by the recorded ops ([`UnaryFn`](crate::UnaryFn)'s table), the eager
//! [`Tensor`](crate::Tensor) methods and the losses: one formula per function.

use crate::dtype::Float;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;

/// `e^(−|x|)` and `1/(1 + e^(−|x|))`: the two pieces of the logistic function from which
/// `σ(x)`, `1 − σ(x)` and `σ'(x)` all follow without cancellation.
#[inline(always)]
fn logistic_parts<T: Float>(x: T) -> (T, T) {
    let e = (-x.abs()).exp();
    (e, T::ONE / (T::ONE + e))
}

/// `(σ(x), 1 − σ(x))`, both accurate: for `x ≥ 0`, `σ = r` and `1 − σ = e·r`; for
/// `x < 0` the other way round. NaN stays NaN.
#[inline(always)]
fn sigmoid_pair<T: Float>(x: T) -> (T, T) {
    let (e, r) = logistic_parts(x);
    let er = e * r;
    if x >= T::ZERO {
        (r, er)
    } else {
        (er, r)
    }
}

/// `1/(1+e⁻ˣ)` without overflow for large `|x|`; NaN stays NaN. Branch-free, so a loop of
/// it vectorises.
#[inline(always)]
pub(crate) fn sigmoid<T: Float>(x: T) -> T {
    sigmoid_pair(x).0
}

/// `ln(1 + eˣ) = max(x, 0) + ln(1 + e^-|x|)`, which never overflows; NaN stays NaN.
#[inline(always)]
pub(crate) fn softplus<T: Float>(x: T) -> T {
    relu(x) + (-x.abs()).exp().ln_1p()
}

/// `max(x, 0)`, NaN-propagating (PyTorch's `relu(NaN)` is NaN).
#[inline(always)]
pub(crate) fn relu<T: Float>(x: T) -> T {
    if x < T::ZERO {
        T::ZERO
    } else {
        x
    }
}

/// `1` for `x > 0`, `-1` for `x < 0`, `0` at `0`; NaN for NaN (PyTorch's `sign`).
#[inline(always)]
pub(crate) fn sign<T: Float>(x: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        -T::ONE
    } else {
        x * T::ZERO
    }
}

/// `2u = 2√(2/π)(x + 0.044715x³)`, the argument for which `(1 + tanh u)/2 = σ(2u)`.
#[inline(always)]
fn gelu_tanh_arg<T: Float>(x: T) -> T {
    T::from_f64(2.0 * SQRT_2_OVER_PI) * (x * (T::ONE + T::from_f64(GELU_C) * (x * x)))
}

/// `x(1 + tanh u)/2` with `u = √(2/π)(x + 0.044715x³)`, computed as `x·σ(2u)`, which
/// does not cancel for negative `x`.
#[inline(always)]
pub(crate) fn gelu_tanh<T: Float>(x: T) -> T {
    x * sigmoid(gelu_tanh_arg(x))
}

/// The derivative of [`gelu_tanh`]: `σ(2u) + x·σ'(2u)·2u'`.
#[inline(always)]
pub(crate) fn gelu_tanh_grad<T: Float>(x: T) -> T {
    // Beyond ±30 the derivative is exactly 1 or 0 in both types, and `x²` must not
    // overflow into `0·∞`.
    let bound = T::from_f64(30.0);
    let x = if x > bound {
        bound
    } else if x < -bound {
        -bound
    } else {
        x
    };
    let v = gelu_tanh_arg(x);
    let (e, r) = logistic_parts(v);
    let s = if v >= T::ZERO { r } else { e * r };
    let dv = T::from_f64(2.0 * SQRT_2_OVER_PI) * (T::ONE + T::from_f64(3.0 * GELU_C) * (x * x));
    s + x * (e * r * r) * dv
}

/// `x·Φ(x)`, `Φ` the standard normal CDF.
#[inline(always)]
pub(crate) fn gelu_erf<T: Float>(x: T) -> T {
    x.gelu()
}

/// `Φ(x) + x·φ(x)`, the derivative of [`gelu_erf`], given `y = gelu_erf(x)` (backward has
/// it): only `e^(−x²/2)` is evaluated.
#[inline(always)]
pub(crate) fn gelu_erf_grad_given<T: Float>(x: T, y: T) -> T {
    x.gelu_grad_given(y)
}

/// `2/√π · e^(−x²)`, the derivative of `erf`.
#[inline(always)]
pub(crate) fn erf_grad<T: Float>(x: T) -> T {
    x.erf_grad()
}

/// `x·σ(x)` (SiLU, also called swish).
#[inline(always)]
pub(crate) fn silu<T: Float>(x: T) -> T {
    x * sigmoid(x)
}

/// `σ(x)(1 + x(1 − σ(x)))`, the derivative of [`silu`], with `1 − σ` computed directly.
#[inline(always)]
pub(crate) fn silu_grad<T: Float>(x: T) -> T {
    let (s, sc) = sigmoid_pair(x);
    s * (T::ONE + x * sc)
}
