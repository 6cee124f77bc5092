//! [`Float`]: the sealed scalar trait implemented by `f32` and `f64`.
//!
//! Kernels are generic over `Float`; the one place that needs a concrete type is GEMM,
//! which the trait routes to faer so that faer's own trait bounds stay out of our API.
//! The trait is vocabulary; its implementations for `f32` and `f64`, which call the
//! kernels (`vmath`, faer's GEMM), are `kernels/float.rs`.

use std::fmt::{Debug, Display};
use std::iter::Sum;
use std::ops::{Add, AddAssign, Div, DivAssign, Mul, MulAssign, Neg, Sub, SubAssign};

mod sealed {
    pub trait Sealed {}
    impl Sealed for f32 {}
    impl Sealed for f64 {}
}

/// A floating-point element type: `f32` or `f64`. Sealed: no other type implements it.
pub trait Float:
    sealed::Sealed
    + bytemuck::Pod
    + Default
    + PartialOrd
    + Debug
    + Display
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + DivAssign
    + Sum
{
    /// 0.
    const ZERO: Self;
    /// 1.
    const ONE: Self;
    /// `"f32"` or `"f64"`, as in safetensors' dtype names (`F32`, `F64`) lowercased.
    const NAME: &'static str;
    /// Converts from `f64`, rounding to nearest.
    fn from_f64(v: f64) -> Self;
    /// Converts to `f64` exactly.
    fn to_f64(self) -> f64;
    /// Converts a count, rounding to nearest.
    fn from_usize(v: usize) -> Self {
        Self::from_f64(v as f64)
    }
    /// `e^x`.
    fn exp(self) -> Self;
    /// Natural logarithm.
    fn ln(self) -> Self;
    /// `ln(1 + x)`, accurate near 0.
    fn ln_1p(self) -> Self;
    /// `eˣ − 1`, accurate near 0.
    fn exp_m1(self) -> Self;
    /// Arctangent, in `(−π/2, π/2)`.
    fn atan(self) -> Self;
    /// Square root.
    fn sqrt(self) -> Self;
    /// Absolute value.
    fn abs(self) -> Self;
    /// Sine.
    fn sin(self) -> Self;
    /// Cosine.
    fn cos(self) -> Self;
    /// Hyperbolic tangent.
    fn tanh(self) -> Self;
    /// The error function.
    fn erf(self) -> Self;
    /// `2/√π · e^(−x²)`, the derivative of [`erf`](Float::erf).
    #[doc(hidden)]
    fn erf_grad(self) -> Self;
    /// `x·Φ(x)`, `Φ` the standard normal CDF, accurate in both tails.
    #[doc(hidden)]
    fn gelu(self) -> Self;
    /// `Φ(x) + x·φ(x)`, the derivative of [`gelu`](Float::gelu), given `y = self.gelu()`:
    /// `Φ(x) = y/x`, so only `e^(−x²/2)` is evaluated (GELU's backward reads the forward's
    /// output).
    #[doc(hidden)]
    fn gelu_grad_given(self, y: Self) -> Self;
    /// `|self|` with the sign of `sign`.
    #[doc(hidden)]
    fn copysign(self, sign: Self) -> Self;
    /// `self^p`.
    fn powf(self, p: Self) -> Self;
    /// The larger of two values (NaN-propagating is not promised).
    fn max(self, other: Self) -> Self;
    /// The smaller of two values.
    fn min(self, other: Self) -> Self;
    /// Neither NaN nor infinite.
    fn is_finite(self) -> bool;
    /// Not a number.
    fn is_nan(self) -> bool;
    /// Negative infinity.
    fn neg_infinity() -> Self;
    /// `dst ← alpha·op(a)·op(b) + (dst if accumulate)` for row-major slices, where `op`
    /// transposes when asked; `dst` is `m×n`, `op(a)` is `m×k`, `op(b)` is `k×n`.
    #[allow(clippy::too_many_arguments)]
    #[doc(hidden)]
    fn gemm(
        dst: &mut [Self],
        a: &[Self],
        a_t: bool,
        b: &[Self],
        b_t: bool,
        mkn: (usize, usize, usize),
        accumulate: bool,
        par: faer::Par,
    );

    /// One-thread matrix product of strided blocks (see `kernels::matmul::gemm_strided`).
    #[allow(clippy::too_many_arguments)]
    #[doc(hidden)]
    fn gemm_strided(
        dst: &mut [Self],
        ld_dst: usize,
        a: &[Self],
        lda: usize,
        a_t: bool,
        b: &[Self],
        ldb: usize,
        b_t: bool,
        mkn: (usize, usize, usize),
        accumulate: bool,
    );
}
