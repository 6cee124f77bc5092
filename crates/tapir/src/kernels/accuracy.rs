//! Accuracy of the elementwise kernels, in ulp.
//!
//! `f32`: every bit pattern in each function's useful range, compared with the function
//! evaluated in `f64` (by std/libm, whose error is below 1e−15 relative, against `f32`'s
//! 6e−8 per ulp) and measured in `f32` ulps of that exact-enough value. The default run
//! takes every `STRIDE`-th bit pattern (about a million per function, seconds in a
//! debug build); `TAPIR_ULP_STRIDE=1` runs the exhaustive sweep:
//!
//! ```text
//! just accuracy      # TAPIR_ULP_STRIDE=1 cargo test --release -p tapir --lib accuracy -- --nocapture
//! ```
//!
//! `TAPIR_ULP_ONLY=gelu,gelu\'` limits the sweep to the named functions.
//!
//! `f64`: a dense sample against values computed with mpmath at 50 digits and rounded to
//! `f64` (`tools/f64_reference.py` writes `tests/data/f64_reference.txt`); see
//! [`f64_matches_mpmath_reference`].
//!
//! Where a function crosses zero away from `x = 0` (the derivatives of `silu`, `gelu` and
//! `gelu_tanh`), no formula evaluated in the function's own precision has a bounded ulp
//! error next to the root: the sum that vanishes there cancels. Those rows measure the error
//! in ulps of `max(|f(x)|, FLOOR)` with `FLOOR = 2^−4`, so an absolute error there counts
//! against the function's typical size; docs/kernels.md says which rows do.

use super::scalar::{
    erf_grad, gelu_erf, gelu_erf_grad_given, gelu_tanh, gelu_tanh_grad, sigmoid, silu, silu_grad, softplus,
};
use crate::dtype::Float;

/// One function under test: ours in `f32` and `f64`, and an independent `f64` reference.
struct Case {
    name: &'static str,
    ours32: fn(f32) -> f32,
    ours64: fn(f64) -> f64,
    reference: fn(f64) -> f64,
    /// The useful range: outside it the result is a constant, 0 or overflows.
    range: (f32, f32),
    /// Measure in ulps of `max(|f|, floor)` (functions with a root away from 0).
    floor: f64,
    /// The largest `f32` error allowed, in ulps: the exhaustive sweep's maximum, rounded up.
    bound: f64,
}

/// GELU's derivative as backward computes it, from `x` and the forward's `gelu(x)`.
fn gelu_grad_from_output<T: Float>(x: T) -> T {
    gelu_erf_grad_given(x, gelu_erf(x))
}

/// Stable `f64` references, written independently of the kernels (std and libm only).
mod reference {
    pub fn sigmoid(x: f64) -> f64 {
        if x >= 0.0 {
            1.0 / (1.0 + (-x).exp())
        } else {
            x.exp() / (1.0 + x.exp())
        }
    }
    pub fn sigmoid_grad(x: f64) -> f64 {
        let e = (-x.abs()).exp();
        e / ((1.0 + e) * (1.0 + e))
    }
    pub fn softplus(x: f64) -> f64 {
        x.max(0.0) + (-x.abs()).exp().ln_1p()
    }
    pub fn silu(x: f64) -> f64 {
        x * sigmoid(x)
    }
    pub fn silu_grad(x: f64) -> f64 {
        sigmoid(x) * (1.0 + x * sigmoid(-x))
    }
    pub fn tanh_grad(x: f64) -> f64 {
        let c = x.cosh();
        1.0 / (c * c)
    }
    pub fn erf_grad(x: f64) -> f64 {
        std::f64::consts::FRAC_2_SQRT_PI * (-x * x).exp()
    }
    fn cdf(x: f64) -> f64 {
        0.5 * libm::erfc(-x * std::f64::consts::FRAC_1_SQRT_2)
    }
    pub fn gelu(x: f64) -> f64 {
        x * cdf(x)
    }
    pub fn gelu_grad(x: f64) -> f64 {
        cdf(x) + x * (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt()
    }
    fn gelu_tanh_u(x: f64) -> f64 {
        (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044_715 * x * x * x)
    }
    pub fn gelu_tanh(x: f64) -> f64 {
        // (1 + tanh u)/2 = σ(2u), which does not cancel for negative x.
        x * sigmoid(2.0 * gelu_tanh_u(x))
    }
    pub fn gelu_tanh_grad(x: f64) -> f64 {
        let u = gelu_tanh_u(x);
        let du = (2.0 / std::f64::consts::PI).sqrt() * (1.0 + 3.0 * 0.044_715 * x * x);
        sigmoid(2.0 * u) + x * 2.0 * sigmoid_grad(2.0 * u) * du
    }
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "exp",
            ours32: |x| Float::exp(x),
            ours64: |x| Float::exp(x),
            reference: f64::exp,
            range: (-104.0, 89.0),
            floor: 0.0,
            bound: 2.0,
        },
        Case {
            name: "expm1",
            ours32: |x| Float::exp_m1(x),
            ours64: |x| Float::exp_m1(x),
            reference: f64::exp_m1,
            range: (-18.0, 89.0),
            floor: 0.0,
            bound: 2.5,
        },
        Case {
            name: "log",
            ours32: |x| Float::ln(x),
            ours64: |x| Float::ln(x),
            reference: f64::ln,
            range: (0.0, f32::MAX),
            floor: 0.0,
            bound: 1.0,
        },
        Case {
            name: "log1p",
            ours32: |x| Float::ln_1p(x),
            ours64: |x| Float::ln_1p(x),
            reference: f64::ln_1p,
            range: (-1.0, f32::MAX),
            floor: 0.0,
            bound: 2.0,
        },
        Case {
            name: "tanh",
            ours32: |x| Float::tanh(x),
            ours64: |x| Float::tanh(x),
            reference: f64::tanh,
            range: (-10.0, 10.0),
            floor: 0.0,
            bound: 3.5,
        },
        Case {
            name: "tanh'",
            ours32: |x| 1.0 - Float::tanh(x) * Float::tanh(x),
            ours64: |x| 1.0 - Float::tanh(x) * Float::tanh(x),
            reference: reference::tanh_grad,
            range: (-60.0, 60.0),
            floor: 1.0,
            bound: 4.5,
        },
        Case {
            name: "erf",
            ours32: |x| Float::erf(x),
            ours64: |x| Float::erf(x),
            reference: libm::erf,
            range: (-4.0, 4.0),
            floor: 0.0,
            bound: 3.0,
        },
        Case {
            name: "erf'",
            ours32: erf_grad,
            ours64: erf_grad,
            reference: reference::erf_grad,
            range: (-10.5, 10.5),
            floor: 0.0,
            bound: 3.0,
        },
        Case {
            name: "sigmoid",
            ours32: sigmoid,
            ours64: sigmoid,
            reference: reference::sigmoid,
            range: (-104.0, 18.0),
            floor: 0.0,
            bound: 3.0,
        },
        Case {
            name: "sigmoid'",
            ours32: |x| sigmoid(x) * (1.0 - sigmoid(x)),
            ours64: |x| sigmoid(x) * (1.0 - sigmoid(x)),
            reference: reference::sigmoid_grad,
            range: (-104.0, 104.0),
            floor: 0.25,
            bound: 4.5,
        },
        Case {
            name: "softplus",
            ours32: softplus,
            ours64: softplus,
            reference: reference::softplus,
            range: (-104.0, 1e4),
            floor: 0.0,
            bound: 2.5,
        },
        Case {
            name: "silu",
            ours32: silu,
            ours64: silu,
            reference: reference::silu,
            range: (-87.0, 1e4),
            floor: 0.0,
            bound: 4.0,
        },
        Case {
            name: "silu'",
            ours32: silu_grad,
            ours64: silu_grad,
            reference: reference::silu_grad,
            range: (-104.0, 1e4),
            floor: 0.0625,
            bound: 6.5,
        },
        Case {
            name: "gelu",
            ours32: gelu_erf,
            ours64: gelu_erf,
            reference: reference::gelu,
            range: (-15.0, 1e4),
            floor: 0.0,
            bound: 7.5,
        },
        Case {
            name: "gelu'",
            ours32: super::vmath::m32::gelu_grad,
            ours64: super::vmath::m64::gelu_grad,
            reference: reference::gelu_grad,
            range: (-15.0, 1e4),
            floor: 0.0625,
            bound: 12.0,
        },
        Case {
            // What GELU's backward evaluates: the derivative from the forward's output.
            name: "gelu' from y",
            ours32: gelu_grad_from_output,
            ours64: gelu_grad_from_output,
            reference: reference::gelu_grad,
            range: (-15.0, 1e4),
            floor: 0.0625,
            bound: 15.5,
        },
        Case {
            name: "gelu_tanh",
            ours32: gelu_tanh,
            ours64: gelu_tanh,
            reference: reference::gelu_tanh,
            range: (-12.0, 1e4),
            floor: 0.0625,
            bound: 8.0,
        },
        Case {
            name: "gelu_tanh'",
            ours32: gelu_tanh_grad,
            ours64: gelu_tanh_grad,
            reference: reference::gelu_tanh_grad,
            range: (-12.0, 1e4),
            floor: 0.0625,
            bound: 13.0,
        },
    ]
}

/// The size of one ulp of `f32` at `|r|` (subnormal spacing below the normal range).
fn ulp32(r: f64) -> f64 {
    let r = (r.abs() as f32).min(f32::MAX.next_down());
    (r.next_up() - r) as f64
}

/// The size of one ulp of `f64` at `|r|`.
fn ulp64(r: f64) -> f64 {
    let r = r.abs().min(f64::MAX.next_down());
    r.next_up() - r
}

/// The error of `got` against `want` in ulps of `want` (or of `floor`, whichever is
/// larger), with equal infinities and NaNs counting as exact.
fn ulps(got: f64, want: f64, floor: f64, ulp: fn(f64) -> f64) -> f64 {
    if got == want || (got.is_nan() && want.is_nan()) {
        return 0.0;
    }
    if !got.is_finite() || !want.is_finite() {
        return f64::INFINITY;
    }
    (got - want).abs() / ulp(want.abs().max(floor))
}

/// The largest error of one case over every `stride`-th `f32` bit pattern in its range,
/// and where it occurs.
fn sweep32(case: &Case, stride: u64) -> (f64, f32) {
    let (lo, hi) = case.range;
    let chunks = 2u64;
    let per = (1u64 << 32) / chunks;
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..chunks)
            .map(|c| {
                s.spawn(move || {
                    let mut worst = (0.0f64, 0.0f32);
                    let mut bits = c * per;
                    while bits < (c + 1) * per {
                        let x = f32::from_bits(bits as u32);
                        if x >= lo && x <= hi {
                            let want = (case.reference)(x as f64);
                            // The f64 reference rounded to f32 can overflow where the exact value
                            // is just below f32::MAX; compare with the rounded value there.
                            let want = if (want as f32).is_infinite() { (want as f32) as f64 } else { want };
                            let e = ulps((case.ours32)(x) as f64, want, case.floor, ulp32);
                            if e > worst.0 || e.is_nan() {
                                worst = (e, x);
                            }
                        }
                        bits += stride;
                    }
                    worst
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("sweep thread"))
            .fold((0.0, 0.0), |a, b| if b.0 > a.0 { b } else { a })
    })
}

#[test]
fn f32_every_bit_pattern_within_a_few_ulp() {
    // A prime stride visits every residue class of the low bits over the range.
    let stride: u64 = std::env::var("TAPIR_ULP_STRIDE").ok().and_then(|s| s.parse().ok()).unwrap_or(4099);
    // `TAPIR_ULP_ONLY=gelu,erf` sweeps only the named functions (after a change to them).
    let only = std::env::var("TAPIR_ULP_ONLY").ok();
    let chosen = |name: &str| only.as_deref().is_none_or(|o| o.split(',').any(|n| n == name));
    let mut report = String::new();
    let mut failed = Vec::new();
    for case in cases().into_iter().filter(|c| chosen(c.name)) {
        let (err, at) = sweep32(&case, stride);
        report += &format!("f32 {:<11} max {:>6.3} ulp at x = {:e}\n", case.name, err, at);
        if err.is_nan() || err > case.bound {
            failed.push(case.name);
        }
    }
    println!("stride {stride}\n{report}");
    assert!(failed.is_empty(), "over their bounds: {failed:?}\n{report}");
}

#[test]
fn vector_path_gives_the_scalar_bits() {
    // The dispatched loop (AVX2/AVX-512 where present) and the element-at-a-time formula
    // must agree bit for bit, including at the special values.
    let mut xs: Vec<f32> =
        vec![0.0, -0.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 1e-45, -1e-45, 1e-40, 88.7, -87.5];
    xs.extend((0..1000).map(|i| (i as f32 - 500.0) * 0.037));
    let xs64: Vec<f64> = xs.iter().map(|&x| x as f64).collect();
    for case in cases() {
        let mut out = vec![0.0f32; xs.len()];
        super::map(&xs, &mut out, case.ours32);
        for (&x, &y) in xs.iter().zip(&out) {
            let s = (case.ours32)(x);
            assert!(s.to_bits() == y.to_bits(), "{} f32 at {x:e}: vector {y:e}, scalar {s:e}", case.name);
        }
        let mut out = vec![0.0f64; xs64.len()];
        super::map(&xs64, &mut out, case.ours64);
        for (&x, &y) in xs64.iter().zip(&out) {
            let s = (case.ours64)(x);
            assert!(s.to_bits() == y.to_bits(), "{} f64 at {x:e}: vector {y:e}, scalar {s:e}", case.name);
        }
    }
}

#[test]
fn gelu_grad_from_the_output_agrees_with_the_direct_formula_at_the_edges() {
    fn check<T: Float + std::fmt::Debug>(xs: &[T], tol: T, gelu_grad: fn(T) -> T) {
        for &x in xs {
            let (direct, given) = (gelu_grad(x), gelu_erf_grad_given(x, gelu_erf(x)));
            let close = (direct - given).abs() <= tol * direct.abs().max(T::ONE);
            assert!(close || (direct.is_nan() && given.is_nan()), "x {x:?}: direct {direct:?}, from y {given:?}");
        }
    }
    let xs = [0.0, -0.0, 1e-45, -1e-45, 1e-30, -1e-30, 0.5, -0.75, 5.0, -5.0, 15.0, -15.0, 15.6, -15.6, 40.0, -40.0];
    let inf = [f32::INFINITY, f32::NEG_INFINITY, f32::MAX, f32::MIN];
    check(&xs.iter().chain(&inf).copied().collect::<Vec<f32>>(), 1e-6, super::vmath::m32::gelu_grad);
    let inf = [f64::INFINITY, f64::NEG_INFINITY, f64::MAX, f64::MIN, 38.5, -38.5, 27.0, -27.0];
    check(&xs.iter().map(|&x| x as f64).chain(inf).collect::<Vec<f64>>(), 1e-14, super::vmath::m64::gelu_grad);
}

#[test]
fn special_values_follow_the_table() {
    // Odd functions keep the sign of zero; NaN stays NaN; the edges of the domain.
    for z in [0.0f32, -0.0] {
        for (name, v) in
            [("tanh", Float::tanh(z)), ("erf", Float::erf(z)), ("expm1", Float::exp_m1(z)), ("log1p", Float::ln_1p(z))]
        {
            assert!(v == 0.0 && v.is_sign_negative() == z.is_sign_negative(), "{name}({z:?}) = {v:?}");
        }
    }
    for case in cases() {
        assert!((case.ours32)(f32::NAN).is_nan(), "{} f32 NaN", case.name);
        assert!((case.ours64)(f64::NAN).is_nan(), "{} f64 NaN", case.name);
    }
    assert_eq!(Float::ln(0.0f32), f32::NEG_INFINITY);
    assert!(Float::ln(-1.0f64).is_nan());
    assert_eq!(Float::ln(f64::INFINITY), f64::INFINITY);
    assert_eq!(Float::ln_1p(-1.0f32), f32::NEG_INFINITY);
    assert_eq!(Float::ln_1p(f32::INFINITY), f32::INFINITY);
    assert_eq!(Float::exp(f32::NEG_INFINITY), 0.0);
    assert_eq!(Float::exp(f64::INFINITY), f64::INFINITY);
    assert_eq!(Float::exp(88.8f32), f32::INFINITY);
    assert_eq!(Float::exp_m1(f32::NEG_INFINITY), -1.0);
    assert_eq!(Float::tanh(f64::NEG_INFINITY), -1.0);
    assert_eq!(Float::erf(f32::INFINITY), 1.0);
    // ln of the smallest subnormal: ln(2^−149) = −149·ln 2.
    let want = -149.0 * std::f64::consts::LN_2;
    assert!((Float::ln(f32::from_bits(1)) as f64 - want).abs() < 1e-5);
    let want = -1074.0 * std::f64::consts::LN_2;
    assert!((Float::ln(f64::from_bits(1)) - want).abs() < 1e-12);
}

/// `f64`: mpmath's values (50 digits, rounded to f64) at a fixed dense grid; the grid is
/// recomputed here the same way the script computes it.
#[test]
fn f64_matches_mpmath_reference() {
    let text = include_str!("../../tests/data/f64_reference.txt");
    let all = cases();
    let mut worst: Vec<(f64, f64)> = vec![(0.0, 0.0); all.len()];
    let mut failed = Vec::new();
    for line in text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()) {
        let mut parts = line.split_whitespace();
        let name = parts.next().expect("a name");
        let x = f64::from_bits(u64::from_str_radix(parts.next().expect("x"), 16).expect("hex x"));
        let want = f64::from_bits(u64::from_str_radix(parts.next().expect("y"), 16).expect("hex y"));
        // A variant ("gelu' from y") is checked against its function's reference points.
        let cases = (0..all.len()).filter(|&i| all[i].name.split(' ').next() == Some(name));
        for i in cases {
            let got = (all[i].ours64)(x);
            let e = ulps(got, want, all[i].floor, ulp64);
            if e > worst[i].0 || e.is_nan() {
                worst[i] = (e, x);
            }
            if e > 4.0 || e.is_nan() {
                failed.push(format!("{}({x:e}) = {got:e}, want {want:e}: {e} ulp", all[i].name));
            }
        }
    }
    for (case, (e, x)) in all.iter().zip(&worst) {
        println!("f64 {:<11} max {e:>6.3} ulp at x = {x:e}", case.name);
    }
    assert!(failed.is_empty(), "{} points over 4 ulp:\n{}", failed.len(), failed[..failed.len().min(20)].join("\n"));
}
