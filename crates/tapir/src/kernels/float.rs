//! [`Float`] for `f32` and `f64`: the scalar math of `vmath.rs` (vectorisable `exp`, `ln`,
//! `tanh`, ...) and the GEMM hooks into `matmul.rs`. The trait itself is `dtype.rs`.

use crate::dtype::Float;
use crate::kernels::{matmul, vmath};

macro_rules! impl_float {
    ($t:ty, $name:literal, $m:ident) => {
        impl Float for $t {
            const ZERO: Self = 0.0;
            const ONE: Self = 1.0;
            const NAME: &'static str = $name;
            #[inline]
            fn from_f64(v: f64) -> Self {
                v as $t
            }
            #[inline]
            fn to_f64(self) -> f64 {
                self as f64
            }
            #[inline(always)]
            fn exp(self) -> Self {
                vmath::$m::exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                vmath::$m::ln(self)
            }
            #[inline(always)]
            fn ln_1p(self) -> Self {
                vmath::$m::ln_1p(self)
            }
            #[inline(always)]
            fn exp_m1(self) -> Self {
                vmath::$m::exp_m1(self)
            }
            #[inline]
            fn atan(self) -> Self {
                <$t>::atan(self)
            }
            #[inline]
            fn sqrt(self) -> Self {
                <$t>::sqrt(self)
            }
            #[inline]
            fn abs(self) -> Self {
                <$t>::abs(self)
            }
            #[inline]
            fn sin(self) -> Self {
                <$t>::sin(self)
            }
            #[inline]
            fn cos(self) -> Self {
                <$t>::cos(self)
            }
            #[inline(always)]
            fn tanh(self) -> Self {
                vmath::$m::tanh(self)
            }
            #[inline(always)]
            fn erf(self) -> Self {
                vmath::$m::erf(self)
            }
            #[inline(always)]
            fn erf_grad(self) -> Self {
                vmath::$m::erf_grad(self)
            }
            #[inline(always)]
            fn gelu(self) -> Self {
                vmath::$m::gelu(self)
            }
            #[inline(always)]
            fn gelu_grad_given(self, y: Self) -> Self {
                vmath::$m::gelu_grad_given(self, y)
            }
            #[inline(always)]
            fn copysign(self, sign: Self) -> Self {
                <$t>::copysign(self, sign)
            }
            #[inline]
            fn powf(self, p: Self) -> Self {
                <$t>::powf(self, p)
            }
            #[inline]
            fn max(self, other: Self) -> Self {
                <$t>::max(self, other)
            }
            #[inline]
            fn min(self, other: Self) -> Self {
                <$t>::min(self, other)
            }
            #[inline]
            fn is_finite(self) -> bool {
                <$t>::is_finite(self)
            }
            #[inline]
            fn is_nan(self) -> bool {
                <$t>::is_nan(self)
            }
            #[inline]
            fn neg_infinity() -> Self {
                <$t>::NEG_INFINITY
            }
            fn gemm(
                dst: &mut [Self],
                a: &[Self],
                a_t: bool,
                b: &[Self],
                b_t: bool,
                (m, k, n): (usize, usize, usize),
                accumulate: bool,
                par: faer::Par,
            ) {
                matmul::gemm(dst, a, a_t, b, b_t, (m, k, n), accumulate, par)
            }
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
            ) {
                matmul::gemm_strided(dst, ld_dst, a, lda, a_t, b, ldb, b_t, mkn, accumulate)
            }
        }
    };
}

impl_float!(f32, "f32", m32);
impl_float!(f64, "f64", m64);
