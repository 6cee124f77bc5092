//! Scalar math shared by the recorded ops ([`UnaryFn`](crate::UnaryFn)'s table), the eager
//! [`Tensor`](crate::Tensor) methods and the losses: one formula per function.

use crate::Float;

const SQRT_2_OVER_PI: f64 = 0.797_884_560_802_865_4;
const GELU_C: f64 = 0.044_715;
/// `1/√(2π)`.
const INV_SQRT_2PI: f64 = 0.398_942_280_401_432_7;
/// `2/√π`.
const TWO_OVER_SQRT_PI: f64 = std::f64::consts::FRAC_2_SQRT_PI;

/// `1/(1+e⁻ˣ)` without overflow for large `|x|`; NaN stays NaN.
#[inline]
pub(crate) fn sigmoid<T: Float>(x: T) -> T {
    if x >= T::ZERO {
        T::ONE / (T::ONE + (-x).exp())
    } else {
        let e = x.exp();
        e / (T::ONE + e)
    }
}

/// `ln(1 + eˣ) = max(x, 0) + ln(1 + e^-|x|)`, which never overflows; NaN stays NaN.
#[inline]
pub(crate) fn softplus<T: Float>(x: T) -> T {
    relu(x) + (-x.abs()).exp().ln_1p()
}

/// `max(x, 0)`, NaN-propagating (PyTorch's `relu(NaN)` is NaN).
#[inline]
pub(crate) fn relu<T: Float>(x: T) -> T {
    if x < T::ZERO {
        T::ZERO
    } else {
        x
    }
}

/// `1` for `x > 0`, `-1` for `x < 0`, `0` at `0`; NaN for NaN (PyTorch's `sign`).
#[inline]
pub(crate) fn sign<T: Float>(x: T) -> T {
    if x > T::ZERO {
        T::ONE
    } else if x < T::ZERO {
        -T::ONE
    } else {
        x * T::ZERO
    }
}

/// `x(1 + tanh u)/2` with `u = √(2/π)(x + 0.044715x³)`.
#[inline]
pub(crate) fn gelu_tanh<T: Float>(x: T) -> T {
    let u = T::from_f64(SQRT_2_OVER_PI) * (x + T::from_f64(GELU_C) * x * x * x);
    T::from_f64(0.5) * x * (T::ONE + u.tanh())
}

/// The derivative of [`gelu_tanh`].
#[inline]
pub(crate) fn gelu_tanh_grad<T: Float>(x: T) -> T {
    let k = T::from_f64(SQRT_2_OVER_PI);
    let c = T::from_f64(GELU_C);
    let t = (k * (x + c * x * x * x)).tanh();
    let du = k * (T::ONE + T::from_f64(3.0) * c * x * x);
    T::from_f64(0.5) * (T::ONE + t) + T::from_f64(0.5) * x * (T::ONE - t * t) * du
}

/// The standard normal CDF `Φ(x) = (1 + erf(x/√2))/2`.
#[inline]
fn phi_cdf<T: Float>(x: T) -> T {
    T::from_f64(0.5) * (T::ONE + (x * T::from_f64(std::f64::consts::FRAC_1_SQRT_2)).erf())
}

/// `x·Φ(x)`.
#[inline]
pub(crate) fn gelu_erf<T: Float>(x: T) -> T {
    x * phi_cdf(x)
}

/// `Φ(x) + x·φ(x)`, the derivative of [`gelu_erf`].
#[inline]
pub(crate) fn gelu_erf_grad<T: Float>(x: T) -> T {
    let pdf = (-(x * x) * T::from_f64(0.5)).exp() * T::from_f64(INV_SQRT_2PI);
    phi_cdf(x) + x * pdf
}

/// `2/√π · e^(−x²)`, the derivative of `erf`.
#[inline]
pub(crate) fn erf_grad<T: Float>(x: T) -> T {
    T::from_f64(TWO_OVER_SQRT_PI) * (-(x * x)).exp()
}

/// `x·σ(x)` (SiLU, also called swish).
#[inline]
pub(crate) fn silu<T: Float>(x: T) -> T {
    x * sigmoid(x)
}

/// `σ(x)(1 + x(1 − σ(x)))`, the derivative of [`silu`].
#[inline]
pub(crate) fn silu_grad<T: Float>(x: T) -> T {
    let s = sigmoid(x);
    s * (T::ONE + x * (T::ONE - s))
}
