//! The `tape_program` finding 3b4c291c (now `fuzz/corpus/tape_program/regression-second-order-rounding`),
//! by hand. The fuzzer's program ended in `log_softmax` along an axis that `broadcast_to`
//! had made of identical copies of `exp(…)` values near 8e5, and the recorded second
//! derivative gave 211.9 where finite differences gave −2.6e-4.
//!
//! Along an axis of `k` identical copies every entry of `log_softmax` is exactly `−ln k`,
//! so `L(u) = Σ log_softmax(broadcast_to(exp(u), [k, n]), 0) = −k·n·ln k` whatever `u`:
//! its exact gradient and Hessian are 0. The tests below show that the derivative rules are
//! right (the recorded second derivative is 0 to rounding on moderate values, and matches
//! the closed-form Hessian of `log_softmax` on distinct ones), and that the 211.9 is
//! rounding: `log_softmax(x)` of values of size `x` carries an absolute error of about
//! `ε·x` (it is `x − logsumexp(x)`), so `Σ exp(log_softmax)` misses 1 by about `ε·x`, and
//! the second-order graph multiplies that by the exp's derivative twice (`x` each time):
//! an error of order `ε·x³`, about 1e2 at `x = 8e5`. The fuzz checker therefore compares
//! second derivatives only where `ε·S³` (with `S` the program's largest value) is below
//! its tolerance (`program/check.rs`).

use tapir::{func, Graph, Tensor};

/// `L(u)`, its gradient and `H·v` (reverse over reverse, through `Scope::grad`) for `k`
/// copies of `exp(u)`.
fn copies_of_exp(u: &[f64], v: &[f64], k: usize) -> (f64, Vec<f64>, Vec<f64>) {
    let n = u.len();
    let (u, v) = (Tensor::from_vec(u.to_vec(), &[n]).unwrap(), Tensor::from_vec(v.to_vec(), &[n]).unwrap());
    let mut g = Graph::<f64>::new();
    let (value, grad) =
        func::value_and_grad(&mut g, &u, |_, u| u.exp().broadcast_to(&[k, n]).log_softmax(0).sum()).unwrap();
    let hv = func::hvp(&mut g, &u, &v, |_, u| u.exp().broadcast_to(&[k, n]).log_softmax(0).sum()).unwrap();
    (value, grad.data().to_vec(), hv.data().to_vec())
}

fn max_abs(v: &[f64]) -> f64 {
    v.iter().fold(0.0, |m, x| m.max(x.abs()))
}

/// Checks that the gradient and `H·v` of [`copies_of_exp`] are 0 to rounding: a value of
/// size `x` (the largest `exp(u)`) is off by about `ε·x`, the gradient multiplies that by
/// `x` once and `H·v` by `x` twice. Returns `x` and `max |H·v|`.
fn zero_to_rounding(u: &[f64], v: &[f64], k: usize) -> (f64, f64) {
    let x = u.iter().fold(0.0f64, |m, u| m.max(u.exp()));
    let (value, grad, hv) = copies_of_exp(u, v, k);
    // L = −k·n·ln k exactly, each entry off by up to about ε·x.
    let exact = -((k * u.len()) as f64) * (k as f64).ln();
    let eps = f64::EPSILON;
    let n = (k * u.len()) as f64;
    assert!((value - exact).abs() <= 4.0 * eps * x * n, "k = {k}: L = {value}, exactly {exact}");
    assert!(max_abs(&grad) <= 16.0 * eps * x * x, "k = {k}: gradient {grad:?} (exactly 0), more than ε·x²");
    let bound = 16.0 * eps * x.powi(3) * max_abs(v);
    assert!(max_abs(&hv) <= bound, "k = {k}: H·v = {hv:?} (exactly 0), more than ε·x³ = {bound:e}");
    (x, max_abs(&hv))
}

#[test]
fn identical_copies_give_zero_derivatives_on_moderate_values() {
    let (u, v) = ([-1.0, 0.3, 1.2, 2.0], [0.7, -0.4, 1.0, 0.25]);
    for k in [2, 3, 5] {
        // x ≤ e², so the rounding bound is below 1e-11: a wrong rule would show as O(1).
        let (x, hv) = zero_to_rounding(&u, &v, k);
        assert!(16.0 * f64::EPSILON * x.powi(3) <= 1e-11);
        eprintln!("k = {k}, x = {x:.2}: max |H·v| = {hv:.1e}");
    }
}

/// The rule itself, on distinct values: `f(x) = Σⱼ rⱼ·log_softmax(x)ⱼ` has the Hessian
/// `−(Σr)·(diag(s) − s·sᵀ)` with `s = softmax(x)` (differentiate `xⱼ − ln Σ eˣ` twice).
#[test]
fn log_softmax_hessian_matches_its_closed_form() {
    let x: [f64; 4] = [0.5, -1.25, 2.0, 0.0];
    let r = [1.0, -0.5, 2.0, 0.75];
    let z: f64 = x.iter().map(|v| v.exp()).sum();
    let s: Vec<f64> = x.iter().map(|v| v.exp() / z).collect();
    let total: f64 = r.iter().sum();
    let xt = Tensor::from_vec(x.to_vec(), &[4]).unwrap();
    let rt = Tensor::from_vec(r.to_vec(), &[4]).unwrap();
    let mut g = Graph::<f64>::new();
    let h = func::hessian(&mut g, &xt, |s, x| (x.log_softmax(0) * s.input(&rt)).sum()).unwrap();
    for i in 0..4 {
        for j in 0..4 {
            let exact = -total * (if i == j { s[i] } else { 0.0 } - s[i] * s[j]);
            let got = h.data()[i * 4 + j];
            assert!((got - exact).abs() <= 1e-13, "H[{i}][{j}] = {got}, closed form {exact}");
        }
    }
}

/// The finding's values: `exp(u)` near 8e5 (`u ≈ 13.6`). `Σ exp(log_softmax)` misses 1 by
/// about `ε·x`, and the recorded `H·v` (exactly 0) by up to about `ε·x³`; the same
/// program at moderate values (above) is exact to rounding.
#[test]
fn at_values_near_8e5_the_second_derivative_is_rounding_of_order_eps_x_cubed() {
    let (u, v): ([f64; 3], _) = ([13.6, 13.55, 13.1], [0.7, -0.4, 1.0]);
    let (x, hv) = zero_to_rounding(&u, &v, 3);
    // Where it comes from: Σ exp(log_softmax) over the copies misses 1 by about ε·x.
    let xt = Tensor::from_vec(u.to_vec(), &[3]).unwrap();
    let mut g = Graph::<f64>::new();
    let missing = g.scope(|s| {
        let y = s.leaf(&xt).exp().broadcast_to(&[3, 3]).log_softmax(0);
        let total = y.exp().sum_axes(&[0], false);
        total.value().unwrap().iter().map(|t| (t - 1.0).abs()).fold(0.0, f64::max)
    });
    eprintln!("x = {x:.3e}: |1 − Σ softmax| = {missing:.2e}, max |H·v| = {hv:.1} (exactly 0)");
    assert!(missing <= 4.0 * f64::EPSILON * x, "the softmax's sum is off by {missing:e}, more than ε·x");
}
