//! Elementary functions written for the vectoriser: no branches, no table lookups, no
//! libm calls, only `+ − × ÷`, comparisons that become selects, and integer operations
//! on the bits. A loop that applies one of them to a slice compiles to SIMD code, and
//! [`super::simd`] runs such loops under runtime dispatch (AVX2 or AVX-512 where the CPU
//! has them), so `tanh` over 1024 `f32`s costs a few hundred nanoseconds rather than a
//! libm call per element.
//!
//! Products and sums are never fused (`mul_add` is not used), so every instruction set
//! gives the same bits: the scalar path for short slices, SSE2, AVX2 and AVX-512 agree,
//! and results do not depend on the machine's vector width.
//!
//! Methods (`f32` and `f64` share them through [`elementary!`]):
//! - `exp`: Cody–Waite reduction `x = k·ln2 + r`, `|r| ≤ ln2/2`, Taylor polynomial,
//!   scaled by `2^k` in two factors so that results near the overflow and subnormal
//!   edges round once.
//! - `expm1`: the same reduction, `eˣ − 1 = 2(2^(k−1)·expm1(r) + (2^(k−1) − ½))`.
//! - `ln`: fdlibm's `x = 2^k·m`, `m ∈ [√½, √2)`, `ln m = 2 atanh(f/(2+f))` with the
//!   atanh series; subnormals are scaled up first.
//! - `ln_1p`: `ln(u) + (x − (u − 1))/u` with `u = 1 + x` (the rounding of `u`, corrected).
//! - `tanh`: `expm1(2|x|)/(expm1(2|x|) + 2)`, with the sign of `x`; accurate near 0 too.
//! - `erf`: the Taylor series for `|x| ≤ 1`; above, `1 − erfc`.
//! - `erfc(z)`, `z ≥ 0` (erf's tail and GELU's normal CDF): `e^(−z²)·t·g(t)` with
//!   `t = 2/(2 + z)` and `g` a Chebyshev series in `2t − 1` (coefficients from
//!   `tools/erfc_chebyshev.py`), valid on the whole half-line, and `z²` carried in two parts,
//!   so that `e^(−z²)` does not inherit the rounding of `z²`.
//!
//! `docs/kernels.md` lists each function's measured error in ulp and how it was measured.

/// `1/n!` for the Taylor coefficients, computed at compile time.
const fn inv_factorial(n: u32) -> f64 {
    let mut f = 1.0f64;
    let mut i = 2;
    while i <= n {
        f *= i as f64;
        i += 1;
    }
    1.0 / f
}

/// The Chebyshev series of `g(t) = e^(z²)·erfc(z)/t`, `t = 2/(2 + z)`, in `u = 2t − 1`
/// (`tools/erfc_chebyshev.py`): 29 terms for `f64` (dropped tail 1.1e−18, against
/// `g ≥ 0.28`); `f32` takes the first 14 (see [`erfc_cheb`]).
#[allow(clippy::excessive_precision, clippy::unreadable_literal)]
const ERFC_CHEB: [f64; 29] = [
    0.5770337386164697,
    0.3554369212704985,
    0.06509515882878653,
    0.003671142395836639,
    -0.0011128447433526325,
    -0.0001607582991537808,
    3.278031574173137e-05,
    5.442441645505016e-06,
    -1.5154665553171482e-06,
    -1.4297608181169865e-07,
    8.234608827419493e-08,
    -1.2962846852306563e-09,
    -4.154721631015199e-09,
    6.347058278362811e-10,
    1.4320822712256225e-10,
    -6.160390105204585e-11,
    2.0612138554721698e-12,
    3.5714931488477042e-12,
    -8.586422843251796e-13,
    -6.14560021379063e-14,
    7.418725748596617e-14,
    -1.2895042755032325e-14,
    -2.358726385710632e-15,
    1.5729349381685912e-15,
    -2.2782966239546465e-16,
    -6.31233045075643e-17,
    3.5916763531814925e-17,
    -5.049809149847729e-18,
    -1.5324541113154899e-18,
];

/// The first `N` terms of [`ERFC_CHEB`] rounded to `f32`, as the `f32` Taylor coefficients
/// are rounded from their `f64` values.
const fn erfc_cheb<const N: usize>() -> [f32; N] {
    let mut c = [0.0; N];
    let mut i = 0;
    while i < N {
        c[i] = ERFC_CHEB[i] as f32;
        i += 1;
    }
    c
}

macro_rules! elementary {
    ($F:ident, $U:ident) => {
        type F = $F;
        type U = $U;

        const MANT: u32 = F::MANTISSA_DIGITS - 1;
        /// `2√2`; twice the rounded `√2`, so exactly `2·fl(√2)`.
        const SQRT_8: F = 2.0 * std::$F::consts::SQRT_2;
        /// `1/√(2π)`, rounded once from its decimal expansion.
        #[allow(clippy::excessive_precision)]
        const INV_SQRT_2PI: F = 0.398_942_280_401_432_677_939_946_059_934_381_868;
        const BIAS: U = (F::MAX_EXP - 1) as U;
        /// `1.5·2^MANT`: adding it rounds a float of magnitude below `2^(MANT−1)` to an
        /// integer, which then sits in the low bits of the sum.
        const MAGIC: F = 1.5 * (1u64 << MANT) as F;

        /// `Σ c[i]·x^i` by Horner's rule. The loop has a constant trip count and is fully
        /// unrolled, so the element loop around it still vectorises.
        #[inline(always)]
        fn horner<const N: usize>(x: F, c: &[F; N]) -> F {
            let mut acc = c[N - 1];
            let mut i = N - 1;
            while i > 0 {
                i -= 1;
                acc = acc * x + c[i];
            }
            acc
        }

        /// `Σ c[i]·T_i(u)` by Clenshaw's recurrence, stable for Chebyshev series.
        #[inline(always)]
        fn clenshaw<const N: usize>(u: F, c: &[F; N]) -> F {
            let (mut b1, mut b2) = (0.0 as F, 0.0 as F);
            let u2 = u + u;
            let mut i = N - 1;
            while i > 0 {
                let b0 = c[i] + u2 * b1 - b2;
                b2 = b1;
                b1 = b0;
                i -= 1;
            }
            c[0] + u * b1 - b2
        }

        /// `min(max(x, lo), hi)` that keeps NaN (the comparisons are false for it).
        #[inline(always)]
        fn clamp(x: F, lo: F, hi: F) -> F {
            let x = if x < lo { lo } else { x };
            if x > hi {
                hi
            } else {
                x
            }
        }

        /// `2^k` for an integer-valued `k` in the normal exponent range.
        #[inline(always)]
        fn pow2i(k: F) -> F {
            let bits = (k + MAGIC).to_bits().wrapping_sub(MAGIC.to_bits());
            F::from_bits(bits.wrapping_add(BIAS) << MANT)
        }

        /// `x` rounded to the nearest integer (ties to even), as a float; `|x| < 2^(MANT−1)`.
        #[inline(always)]
        fn round(x: F) -> F {
            (x + MAGIC) - MAGIC
        }

        /// `x` with its low bits cleared, so that `hi·hi` is exact; `x − hi` is exact too.
        #[inline(always)]
        fn split(x: F) -> F {
            F::from_bits(x.to_bits() & SPLIT_MASK)
        }

        /// `e^(hi + lo)` for a small correction `lo`.
        #[inline(always)]
        pub(crate) fn exp_parts(hi: F, lo: F) -> F {
            let x = clamp(hi, EXP_MIN, EXP_MAX);
            let k = round(x * std::$F::consts::LOG2_E);
            let r = (x - k * LN2_HI) - k * LN2_LO + lo;
            let p = horner(r, &EXP_TAYLOR);
            // Two factors keep both in the normal range at the edges: the product rounds once.
            let k1 = round(k * 0.5);
            p * pow2i(k1) * pow2i(k - k1)
        }

        /// `eˣ`.
        #[inline(always)]
        pub(crate) fn exp(x: F) -> F {
            exp_parts(x, 0.0)
        }

        /// `eˣ − 1`, accurate near 0; keeps the sign of a zero.
        #[inline(always)]
        pub(crate) fn exp_m1(x: F) -> F {
            let xc = clamp(x, EXPM1_MIN, EXP_MAX);
            let k = round(xc * std::$F::consts::LOG2_E);
            let r = (xc - k * LN2_HI) - k * LN2_LO;
            let em = r * horner(r, &EXPM1_TAYLOR);
            let h = pow2i(k - 1.0);
            let y = 2.0 * (h * em + (h - 0.5));
            if x == 0.0 {
                x
            } else {
                y
            }
        }

        /// Natural logarithm: `-∞` at 0, NaN below 0 and for NaN, `∞` at `∞`.
        #[inline(always)]
        pub(crate) fn ln(x: F) -> F {
            let tiny = x < F::MIN_POSITIVE;
            let xs = if tiny { x * SUBNORMAL_SCALE } else { x };
            // Move the mantissa into [√½, √2) and count the exponent accordingly.
            let ix = xs.to_bits().wrapping_add(ONE_BITS.wrapping_sub(SQRT_HALF_BITS));
            let kbits = (ix >> MANT).wrapping_sub(BIAS);
            let k = F::from_bits(MAGIC.to_bits().wrapping_add(kbits)) - MAGIC;
            let k = if tiny { k - SUBNORMAL_SHIFT } else { k };
            let m = F::from_bits((ix & MANT_MASK).wrapping_add(SQRT_HALF_BITS));
            let f = m - 1.0;
            let hfsq = 0.5 * f * f;
            let s = f / (2.0 + f);
            let z = s * s;
            let r = z * horner(z, &LN_ATANH);
            let y = s * (hfsq + r) + k * LN2_LO - hfsq + f + k * LN2_HI;
            let y = if x == F::INFINITY { x } else { y };
            let y = if x == 0.0 { F::NEG_INFINITY } else { y };
            if x < 0.0 || x.is_nan() {
                F::NAN
            } else {
                y
            }
        }

        /// `ln(1 + x)`, accurate near 0; keeps the sign of a zero.
        #[inline(always)]
        pub(crate) fn ln_1p(x: F) -> F {
            let u = 1.0 + x;
            // `u − 1` is exact here; `c` is what the rounding of `1 + x` lost.
            let c = x - (u - 1.0);
            let y = ln(u) + c / u;
            let y = if u == 1.0 || x == F::INFINITY { x } else { y };
            if x == -1.0 {
                F::NEG_INFINITY
            } else {
                y
            }
        }

        /// `tanh x`; odd, so `tanh(−0) = −0`.
        #[inline(always)]
        pub(crate) fn tanh(x: F) -> F {
            let a = x.abs();
            let a = if a > TANH_SATURATE { TANH_SATURATE } else { a };
            let em = exp_m1(a + a);
            (em / (em + 2.0)).copysign(x)
        }

        /// `t·g(t) = e^(z²)·erfc(z)` for `z ≥ 0` (clamped where `erfc` underflows), given
        /// `t = 2/(2 + z)`; callers multiply by `e^(−z²)`.
        #[inline(always)]
        fn erfc_scaled(t: F) -> F {
            t * clenshaw(t + t - 1.0, &ERFC_CHEB)
        }

        /// `a²` as an exact high part and a rounded low part.
        #[inline(always)]
        fn square_parts(a: F) -> (F, F) {
            let hi = split(a);
            (hi * hi, (a - hi) * (a + hi))
        }

        /// The error function; odd, so `erf(−0) = −0`.
        #[inline(always)]
        pub(crate) fn erf(x: F) -> F {
            let small = x * horner(x * x, &ERF_TAYLOR);
            let a = clamp(x.abs(), 1.0, ERFC_ZERO);
            let (sh, sl) = square_parts(a);
            let large = (1.0 - exp_parts(-sh, -sl) * erfc_scaled(2.0 / (2.0 + a))).copysign(x);
            if x.abs() <= 1.0 {
                small
            } else {
                large
            }
        }

        /// `2/√π · e^(−x²)`, the derivative of [`erf`].
        #[inline(always)]
        pub(crate) fn erf_grad(x: F) -> F {
            let a = clamp(x.abs(), 0.0, ERFC_ZERO);
            let (sh, sl) = square_parts(a);
            std::$F::consts::FRAC_2_SQRT_PI * exp_parts(-sh, -sl)
        }

        /// Beyond this `|x|`, `e^(−x²/2)` and `Φ(−|x|)` are 0 in the type.
        const NORMAL_ZERO: F = ERFC_ZERO * std::$F::consts::SQRT_2;

        /// `(a, e)`: `a = |x|` clamped to [`NORMAL_ZERO`] and `e = e^(−a²/2)`, computed from
        /// `a²` in two parts so that it does not inherit the rounding of `a²`.
        #[inline(always)]
        fn half_gaussian(x: F) -> (F, F) {
            let a = clamp(x.abs(), 0.0, NORMAL_ZERO);
            let (sh, sl) = square_parts(a);
            (a, exp_parts(-0.5 * sh, -0.5 * sl))
        }

        /// The pieces of `Φ(x)`, the standard normal CDF, and `φ(x)`, its density, without
        /// cancellation in either tail: `(q, e)` where `Φ(x) = q·e` for `x ≤ 0` and
        /// `1 − q·e` for `x > 0`, with `e = e^(−x²/2)` (computed from `x²` in two parts) and
        /// `q = e^(x²/2)·erfc(|x|/√2)/2` from the scaled erfc, one formula for every `x`.
        /// `φ(x) = e/√(2π)`. Callers multiply by `e` last, so a result in the subnormal
        /// range rounds once.
        #[inline(always)]
        fn normal_parts(x: F) -> (F, F) {
            let (a, e) = half_gaussian(x);
            // `t = 2/(2 + a/√2) = 2√2/(2√2 + a)`: two roundings, none for `a/√2`.
            let q = 0.5 * erfc_scaled(SQRT_8 / (SQRT_8 + a));
            (q, e)
        }

        /// `x·Φ(x)` (GELU).
        #[inline(always)]
        pub(crate) fn gelu(x: F) -> F {
            let (q, e) = normal_parts(x);
            if x > 0.0 {
                x * (1.0 - q * e)
            } else {
                (x * q) * e
            }
        }

        /// `Φ(x) + x·φ(x)`, the derivative of [`gelu`], from `x` alone: the accuracy tests'
        /// reference for `gelu_grad_given`, which backward uses.
        #[cfg(test)]
        #[inline(always)]
        pub(crate) fn gelu_grad(x: F) -> F {
            let (q, e) = normal_parts(x);
            let xc = x * INV_SQRT_2PI;
            if x > 0.0 {
                (1.0 - q * e) + xc * e
            } else {
                (q + xc) * e
            }
        }

        /// `gelu_grad` given `y = gelu(x)`, for backward, which has the forward's output:
        /// `Φ(x) = y/x` (`½` near 0; `0` or `1` where `e^(−x²/2)` underflows, so that `y/x` is
        /// not `∞/∞`), and only `e^(−x²/2)` is evaluated, not the erfc series again.
        #[inline(always)]
        pub(crate) fn gelu_grad_given(x: F, y: F) -> F {
            let (a, e) = half_gaussian(x);
            // Below `ε/4`, `Φ(x) = ½` to half an ulp, and `y` may have lost bits to underflow.
            let cdf = if a < F::EPSILON * 0.25 { 0.5 } else { y / x };
            let cdf = if a < NORMAL_ZERO {
                cdf
            } else if x > 0.0 {
                1.0
            } else {
                0.0
            };
            cdf + (x * INV_SQRT_2PI) * e
        }
    };
}

/// `f32` kernels.
#[allow(clippy::excessive_precision)]
pub(crate) mod m32 {
    use super::inv_factorial;
    elementary!(f32, u32);

    const EXP_MIN: F = -110.0;
    const EXP_MAX: F = 89.0;
    const EXPM1_MIN: F = -18.0;
    const TANH_SATURATE: F = 10.0;
    /// Beyond this `erfc` is 0 in `f32` (`erfc(11) ≈ 1e−54`).
    const ERFC_ZERO: F = 11.0;
    /// fdlibm's split of ln 2: the high part has trailing zeros, so `k·LN2_HI` is exact.
    const LN2_HI: F = 6.931_457_519_5e-01;
    const LN2_LO: F = 1.428_606_765_3e-06;
    const ONE_BITS: U = 0x3f80_0000;
    const SQRT_HALF_BITS: U = 0x3f35_04f3;
    const MANT_MASK: U = 0x007f_ffff;
    const SPLIT_MASK: U = 0xffff_f000;
    const SUBNORMAL_SCALE: F = 33_554_432.0; // 2^25
    const SUBNORMAL_SHIFT: F = 25.0;

    const EXP_TAYLOR: [F; 8] = taylor_exp();
    const EXPM1_TAYLOR: [F; 9] = taylor_expm1();
    const LN_ATANH: [F; 5] = [2.0 / 3.0, 2.0 / 5.0, 2.0 / 7.0, 2.0 / 9.0, 2.0 / 11.0];
    const ERF_TAYLOR: [F; 12] = taylor_erf();

    const fn taylor_exp() -> [F; 8] {
        let mut c = [0.0; 8];
        let mut i = 0;
        while i < 8 {
            c[i] = inv_factorial(i as u32) as F;
            i += 1;
        }
        c
    }

    const fn taylor_expm1() -> [F; 9] {
        let mut c = [0.0; 9];
        let mut i = 0;
        while i < 9 {
            c[i] = inv_factorial(i as u32 + 1) as F;
            i += 1;
        }
        c
    }

    const fn taylor_erf() -> [F; 12] {
        let mut c = [0.0; 12];
        let mut i = 0;
        while i < 12 {
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            c[i] = (sign * std::f64::consts::FRAC_2_SQRT_PI * inv_factorial(i as u32) / (2 * i + 1) as f64) as F;
            i += 1;
        }
        c
    }

    /// The first 14 terms of the `f64` series (`tools/erfc_chebyshev.py`: dropped tail
    /// 2.1e−10, against `g ≥ 0.28`), rounded to `f32`.
    const ERFC_CHEB: [F; 14] = super::erfc_cheb();
}

/// `f64` kernels.
#[allow(clippy::excessive_precision)]
pub(crate) mod m64 {
    use super::inv_factorial;
    elementary!(f64, u64);

    const EXP_MIN: F = -750.0;
    const EXP_MAX: F = 710.0;
    const EXPM1_MIN: F = -40.0;
    const TANH_SATURATE: F = 20.0;
    /// Beyond this `erfc` is 0 in `f64` (`erfc(28) ≈ 1e−343`).
    const ERFC_ZERO: F = 28.0;
    const LN2_HI: F = 6.931_471_803_691_238_164_90e-01;
    const LN2_LO: F = 1.908_214_929_270_587_700_02e-10;
    const ONE_BITS: U = 0x3ff0_0000_0000_0000;
    const SQRT_HALF_BITS: U = 0x3fe6_a09e_0000_0000;
    const MANT_MASK: U = 0x000f_ffff_ffff_ffff;
    const SPLIT_MASK: U = 0xffff_ffff_f800_0000;
    const SUBNORMAL_SCALE: F = 18_014_398_509_481_984.0; // 2^54
    const SUBNORMAL_SHIFT: F = 54.0;

    const EXP_TAYLOR: [F; 14] = taylor_exp();
    const EXPM1_TAYLOR: [F; 15] = taylor_expm1();
    const LN_ATANH: [F; 10] = [
        2.0 / 3.0,
        2.0 / 5.0,
        2.0 / 7.0,
        2.0 / 9.0,
        2.0 / 11.0,
        2.0 / 13.0,
        2.0 / 15.0,
        2.0 / 17.0,
        2.0 / 19.0,
        2.0 / 21.0,
    ];
    const ERF_TAYLOR: [F; 21] = taylor_erf();

    const fn taylor_exp() -> [F; 14] {
        let mut c = [0.0; 14];
        let mut i = 0;
        while i < 14 {
            c[i] = inv_factorial(i as u32);
            i += 1;
        }
        c
    }

    const fn taylor_expm1() -> [F; 15] {
        let mut c = [0.0; 15];
        let mut i = 0;
        while i < 15 {
            c[i] = inv_factorial(i as u32 + 1);
            i += 1;
        }
        c
    }

    const fn taylor_erf() -> [F; 21] {
        let mut c = [0.0; 21];
        let mut i = 0;
        while i < 21 {
            let sign = if i % 2 == 0 { 1.0 } else { -1.0 };
            c[i] = sign * std::f64::consts::FRAC_2_SQRT_PI * inv_factorial(i as u32) / (2 * i + 1) as f64;
            i += 1;
        }
        c
    }

    const ERFC_CHEB: [F; 29] = super::ERFC_CHEB;
}
