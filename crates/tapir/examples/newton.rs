//! Newton-CG on the 100-dimensional Rosenbrock function with Hessian-vector products
//! from [`tapir::func::hvp`], beside gradient descent.
//!
//! ```text
//! cargo run --release -p tapir --example newton     # a few seconds on 2 cores
//! ```
//!
//! `f(x) = Σᵢ 100 (xᵢ₊₁ − xᵢ²)² + (1 − xᵢ)²` for `i < n − 1`, minimum 0 at `x = 1`, from
//! the classic start `x = (−1.2, 1, −1.2, 1, ...)`. Each Newton step solves `H p = −g`
//! approximately by conjugate gradients that stop on negative curvature (Steihaug's
//! truncated CG) or at the relative residual `min(0.5, √‖g‖)` (Nocedal and Wright,
//! algorithm 7.1), then backtracks along `p` (Armijo). No Hessian is ever formed: CG
//! needs only products `H v`, each a reverse sweep over the recorded gradient (about two
//! gradients' work). Newton-CG runs to `‖∇f‖ < 1e-8`; gradient descent with the same
//! backtracking line search gets a budget of 10,000 iterations.
//!
//! Options: `--n N` (dimension, default 100), `--gd-iters N` (default 10000).

use std::time::Instant;

use tapir::{Graph, Scope, Tensor, Var};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

/// The Rosenbrock function of a rank-1 `x`, recorded.
fn rosenbrock<'s>(_: &'s Scope<'s, '_, f64>, x: Var<'s, f64>) -> Var<'s, f64> {
    let n = x.shape().dim(0);
    let (a, b) = (x.narrow(0, 0, n - 1), x.narrow(0, 1, n - 1));
    ((b - a.square()).square() * 100.0 + (a - 1.0).square()).sum()
}

/// What an optimizer run did.
#[derive(Debug, Default)]
struct Run {
    iterations: usize,
    gradients: usize,
    hvps: usize,
    value: f64,
    grad_norm: f64,
}

fn norm(v: &[f64]) -> f64 {
    dot(v, v).sqrt()
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// `f` and `∇f` at `x`.
fn value_and_grad(graph: &mut Graph<f64>, x: &[f64]) -> tapir::Result<(f64, Vec<f64>)> {
    let x = Tensor::from_vec(x.to_vec(), &[x.len()])?;
    let (f, g) = tapir::func::value_and_grad(graph, &x, rosenbrock)?;
    Ok((f, g.into_vec()))
}

/// `f` at `x`, for the line search.
fn value(graph: &mut Graph<f64>, x: &[f64]) -> tapir::Result<f64> {
    let x = Tensor::from_vec(x.to_vec(), &[x.len()])?;
    graph.scope(|s| rosenbrock(s, s.input(&x)).item())
}

/// `∇²f(x) v`.
fn hvp(graph: &mut Graph<f64>, x: &[f64], v: &[f64]) -> tapir::Result<Vec<f64>> {
    let n = x.len();
    let (x, v) = (Tensor::from_vec(x.to_vec(), &[n])?, Tensor::from_vec(v.to_vec(), &[n])?);
    Ok(tapir::func::hvp(graph, &x, &v, rosenbrock)?.into_vec())
}

/// Backtracking (Armijo, `c = 1e-4`, halving) from step 1 along the descent direction `p`;
/// returns the accepted point's value, or `None` if no step of at least 2⁻⁶⁰ decreases `f`.
fn line_search(graph: &mut Graph<f64>, x: &mut [f64], f: f64, g: &[f64], p: &[f64]) -> tapir::Result<Option<f64>> {
    let slope = dot(g, p);
    let mut t = 1.0;
    let mut trial = vec![0.0; x.len()];
    for _ in 0..60 {
        for ((y, xi), pi) in trial.iter_mut().zip(x.iter()).zip(p) {
            *y = xi + t * pi;
        }
        let ft = value(graph, &trial)?;
        if ft <= f + 1e-4 * t * slope {
            x.copy_from_slice(&trial);
            return Ok(Some(ft));
        }
        t *= 0.5;
    }
    Ok(None)
}

/// Steihaug's truncated CG for `H p = −g`: stops at the relative residual `eta`, after `n`
/// steps, or on a direction of non-positive curvature (returning the iterate so far, or
/// `−g` if that is the first direction). Returns `p` and the number of products `H v`.
fn truncated_cg(graph: &mut Graph<f64>, x: &[f64], g: &[f64], eta: f64) -> tapir::Result<(Vec<f64>, usize)> {
    let n = x.len();
    let mut p = vec![0.0; n];
    let mut r: Vec<f64> = g.iter().map(|v| -v).collect(); // r = −g − H p
    let mut d = r.clone();
    let tol = eta * norm(g);
    let mut products = 0;
    for j in 0..n {
        let hd = hvp(graph, x, &d)?;
        products += 1;
        let curvature = dot(&d, &hd);
        if curvature <= 0.0 {
            if j == 0 {
                p = r.clone();
            }
            break;
        }
        let rr = dot(&r, &r);
        let alpha = rr / curvature;
        for (pi, di) in p.iter_mut().zip(&d) {
            *pi += alpha * di;
        }
        for (ri, hi) in r.iter_mut().zip(&hd) {
            *ri -= alpha * hi;
        }
        let rr_new = dot(&r, &r);
        if rr_new.sqrt() <= tol {
            break;
        }
        let beta = rr_new / rr;
        for (di, ri) in d.iter_mut().zip(&r) {
            *di = ri + beta * *di;
        }
    }
    Ok((p, products))
}

/// Newton-CG from `x` to `‖∇f‖ < tol` (or `max_iters`).
fn newton_cg(graph: &mut Graph<f64>, x: &mut [f64], tol: f64, max_iters: usize) -> tapir::Result<Run> {
    let mut run = Run::default();
    let (mut f, mut g) = value_and_grad(graph, x)?;
    run.gradients += 1;
    while norm(&g) >= tol && run.iterations < max_iters {
        let gn = norm(&g);
        let (p, products) = truncated_cg(graph, x, &g, gn.sqrt().min(0.5))?;
        run.hvps += products;
        run.iterations += 1;
        match line_search(graph, x, f, &g, &p)? {
            Some(_) => {}
            None => break,
        }
        (f, g) = value_and_grad(graph, x)?;
        run.gradients += 1;
    }
    run.value = f;
    run.grad_norm = norm(&g);
    Ok(run)
}

/// Gradient descent with the same line search, for `iters` iterations.
fn gradient_descent(graph: &mut Graph<f64>, x: &mut [f64], iters: usize) -> tapir::Result<Run> {
    let mut run = Run::default();
    let (mut f, mut g) = value_and_grad(graph, x)?;
    run.gradients += 1;
    for _ in 0..iters {
        let p: Vec<f64> = g.iter().map(|v| -v).collect();
        if line_search(graph, x, f, &g, &p)?.is_none() {
            break;
        }
        run.iterations += 1;
        (f, g) = value_and_grad(graph, x)?;
        run.gradients += 1;
    }
    run.value = f;
    run.grad_norm = norm(&g);
    Ok(run)
}

fn start(n: usize) -> Vec<f64> {
    (0..n).map(|i| if i % 2 == 0 { -1.2 } else { 1.0 }).collect()
}

fn main() -> Result<()> {
    let (mut n, mut gd_iters) = (100, 10_000);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--n" => n = value("--n")?.parse()?,
            "--gd-iters" => gd_iters = value("--gd-iters")?.parse()?,
            other => return Err(format!("unknown argument {other:?} (options: --n N, --gd-iters N)").into()),
        }
    }
    if n < 2 {
        return Err("--n must be at least 2".into());
    }
    let mut graph = Graph::<f64>::new();
    let clock = Instant::now();
    let mut x = start(n);
    let newton = newton_cg(&mut graph, &mut x, 1e-8, 1000)?;
    let newton_s = clock.elapsed().as_secs_f64();
    let dist = x.iter().map(|v| (v - 1.0).abs()).fold(0.0, f64::max);
    let clock = Instant::now();
    let mut y = start(n);
    let gd = gradient_descent(&mut graph, &mut y, gd_iters)?;
    let gd_s = clock.elapsed().as_secs_f64();
    println!("Rosenbrock, n = {n}, from (-1.2, 1, -1.2, 1, ...)");
    println!(
        "{:<18} {:>10} {:>10} {:>10} {:>12} {:>12} {:>8}",
        "method", "iterations", "gradients", "HVPs", "f", "|grad f|", "time"
    );
    for (name, r, s) in [("Newton-CG", &newton, newton_s), ("gradient descent", &gd, gd_s)] {
        println!(
            "{name:<18} {:>10} {:>10} {:>10} {:>12.3e} {:>12.3e} {:>7.2}s",
            r.iterations, r.gradients, r.hvps, r.value, r.grad_norm, s
        );
    }
    println!("Newton-CG: max |x - 1| = {dist:.1e}");
    if newton.grad_norm >= 1e-8 {
        return Err(format!("Newton-CG stopped at gradient norm {:.2e}", newton.grad_norm).into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The Hessian of Rosenbrock in closed form, dense.
    fn hessian(x: &[f64]) -> Vec<f64> {
        let n = x.len();
        let mut h = vec![0.0; n * n];
        for i in 0..n - 1 {
            // Term 100 (x₁ − x₀²)² + (1 − x₀)² with x₀ = xᵢ, x₁ = xᵢ₊₁.
            h[i * n + i] += 1200.0 * x[i] * x[i] - 400.0 * x[i + 1] + 2.0;
            h[(i + 1) * n + i + 1] += 200.0;
            h[i * n + i + 1] -= 400.0 * x[i];
            h[(i + 1) * n + i] -= 400.0 * x[i];
        }
        h
    }

    #[test]
    fn hvp_matches_the_closed_form_hessian() {
        let n = 7;
        let x: Vec<f64> = (0..n).map(|i| 0.3 * i as f64 - 0.8).collect();
        let v: Vec<f64> = (0..n).map(|i| ((i * 5 + 2) % 7) as f64 - 3.0).collect();
        let hv = hvp(&mut Graph::new(), &x, &v).unwrap();
        let h = hessian(&x);
        for (i, (row, got)) in h.chunks(n).zip(&hv).enumerate() {
            let expected: f64 = row.iter().zip(&v).map(|(a, b)| a * b).sum();
            assert!((got - expected).abs() <= 1e-10 * expected.abs().max(1.0), "row {i}: {got} vs {expected}");
        }
    }

    #[test]
    fn newton_cg_converges_on_a_small_rosenbrock() {
        let mut x = start(10);
        let run = newton_cg(&mut Graph::new(), &mut x, 1e-8, 200).unwrap();
        assert!(run.grad_norm < 1e-8, "{run:?}");
        assert!(x.iter().all(|v| (v - 1.0).abs() < 1e-6), "{x:?}");
    }
}
