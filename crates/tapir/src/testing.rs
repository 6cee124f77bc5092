//! Gradient checking, like `torch.autograd.gradcheck` and `gradgradcheck`: compares a
//! function's backward pass, and the derivative of its recorded gradient, with central
//! finite differences in `f64`.
//!
//! The random programs, shape model and fuzz harnesses that check the whole engine live in
//! the unpublished workspace crate `tapir-testing`; only the gradient check is public API.

use rand::{RngExt, SeedableRng};

use crate::error::{try_vec, Error, Loc};
use crate::graph::graph::Graph;
use crate::record::handles::{Scope, Var};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// Step and tolerances for [`gradcheck`].
#[derive(Debug, Clone, Copy)]
pub struct GradcheckOptions {
    /// Relative step: each element `x` is perturbed by `h·max(1, |x|)`.
    pub h: f64,
    /// Absolute tolerance.
    pub atol: f64,
    /// Relative tolerance: accept `|analytic − numeric| ≤ atol + rtol·max(|analytic|, |numeric|)`.
    pub rtol: f64,
    /// Seed of the random projection `r` in the loss `L = Σ out ⊙ r`.
    pub seed: u64,
}

impl Default for GradcheckOptions {
    fn default() -> Self {
        GradcheckOptions { h: 1e-6, atol: 1e-6, rtol: 1e-4, seed: 0 }
    }
}

/// How close the analytic gradient came.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GradcheckReport {
    /// Elements compared.
    pub checked: usize,
    /// Largest `|analytic − numeric|`.
    pub max_abs_err: f64,
}

/// Why a gradient check failed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GradcheckError {
    /// The function itself failed.
    #[error("gradcheck: the function failed: {0}")]
    Engine(#[from] Error),
    /// An element's gradient disagrees with finite differences.
    #[error("gradcheck: input {input} element {index}: analytic {analytic:e} vs numeric {numeric:e}")]
    Mismatch {
        /// Which input.
        input: usize,
        /// Which element of it (row-major).
        index: usize,
        /// From backward.
        analytic: f64,
        /// From central differences.
        numeric: f64,
    },
    /// An element of the forward-mode tangent ([`jvpcheck`]) disagrees with finite
    /// differences along the tangent, or with the reverse-mode Jacobian-vector product.
    #[error("jvpcheck: output element {index}: forward mode {analytic:e} vs {against} {expected:e}")]
    TangentMismatch {
        /// Which element of the output (row-major).
        index: usize,
        /// From forward mode.
        analytic: f64,
        /// What it was compared with: `"central differences"` or `"reverse mode"`.
        against: &'static str,
        /// That value.
        expected: f64,
    },
    /// The function returned a handle that does not depend on the inputs' values in a
    /// finite way (its value is NaN or infinite).
    #[error("gradcheck: the output is not finite")]
    NonFinite,
}

/// Checks `f`'s gradients with respect to every element of every input.
///
/// The loss is `L = Σ out ⊙ r` for a fixed random `r`: a plain sum would send 1 to every
/// output and hide a transposed gradient.
///
/// ```
/// use tapir::testing::{gradcheck, GradcheckOptions};
/// let a = tapir::Tensor::<f64>::from_vec(vec![0.3, -1.2, 2.0, 0.5], &[2, 2]).unwrap();
/// let report = gradcheck(&[a.clone(), a], GradcheckOptions::default(), |_, v| v[0].matmul(v[1]).tanh()).unwrap();
/// assert_eq!(report.checked, 8);
/// ```
///
/// # Errors
/// [`GradcheckError`] on the first disagreement or failure.
#[allow(clippy::needless_range_loop)] // `index` addresses the input, its copy and the gradient alike.
#[track_caller]
pub fn gradcheck<F>(inputs: &[Tensor<f64>], opts: GradcheckOptions, f: F) -> Result<GradcheckReport, GradcheckError>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    let (op, location) = ("gradcheck", std::panic::Location::caller());
    let mut graph = Graph::<f64>::new();
    graph.set_threads(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed);
    // Shape of the output, then the projection.
    let out = output_shape(&mut graph, inputs, &f)?;
    let r = drawn(op, out, &mut rng, location)?;
    let analytic = graph.scope(|s| -> Result<Vec<Vec<f64>>, GradcheckError> {
        let vars: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
        let l = project(s, f(s, &vars), &r);
        if !l.item()?.is_finite() {
            return Err(GradcheckError::NonFinite);
        }
        // A function of no input has gradient 0, which finite differences must confirm.
        if l.requires_grad() {
            s.backward(l)?;
        }
        Ok(vars
            .iter()
            .zip(inputs)
            .map(|(v, t)| copied(op, t.shape(), v.grad(), location))
            .collect::<Result<_, Error>>()?)
    })?;
    let mut work = copies(op, inputs, location)?;
    let mut report = GradcheckReport { checked: 0, max_abs_err: 0.0 };
    for input in 0..inputs.len() {
        for index in 0..inputs[input].numel() {
            let x = inputs[input].data()[index];
            let h = opts.h * x.abs().max(1.0);
            let mut eval = |v: f64| -> Result<f64, GradcheckError> {
                work[input].data_mut()[index] = v;
                let work = &work;
                Ok(graph.scope(|s| {
                    let vars: Vec<_> = work.iter().map(|t| s.input(t)).collect();
                    project(s, f(s, &vars), &r).item()
                })?)
            };
            let numeric = (eval(x + h)? - eval(x - h)?) / (2.0 * h);
            work[input].data_mut()[index] = x;
            let a = analytic[input][index];
            let err = (a - numeric).abs();
            // Written so that a NaN on either side fails the check.
            let within = err <= opts.atol + opts.rtol * a.abs().max(numeric.abs());
            if !within {
                return Err(GradcheckError::Mismatch { input, index, analytic: a, numeric });
            }
            report.max_abs_err = report.max_abs_err.max(err);
            report.checked += 1;
        }
    }
    Ok(report)
}

/// Checks `f`'s second derivatives: the derivative of its recorded gradient
/// ([`Scope::grad`]) against central finite differences of its first derivative.
///
/// With `L = Σ out ⊙ r` as in [`gradcheck`] and a second fixed random projection `u` of
/// the gradients, `M(x) = Σᵢ ⟨∂L/∂xᵢ, uᵢ⟩` is a Hessian-vector product in disguise:
/// `∂M/∂x = H u`. The analytic side differentiates the recorded gradient with
/// `Scope::grad` twice; the numeric side perturbs each input element and recomputes
/// `∂L/∂x` with the fast [`Scope::backward`], which shares no code with the recorded
/// derivatives. Tolerances and step are [`GradcheckOptions`]'s.
///
/// ```
/// use tapir::testing::{gradgradcheck, GradcheckOptions};
/// let a = tapir::Tensor::<f64>::from_vec(vec![0.3, -1.2, 2.0, 0.5], &[2, 2]).unwrap();
/// let report = gradgradcheck(&[a.clone(), a], GradcheckOptions::default(), |_, v| v[0].matmul(v[1]).tanh()).unwrap();
/// assert_eq!(report.checked, 8);
/// ```
///
/// # Errors
/// [`GradcheckError`] on the first disagreement or failure.
#[allow(clippy::needless_range_loop)] // `index` addresses the input, its copy and the result alike.
#[track_caller]
pub fn gradgradcheck<F>(inputs: &[Tensor<f64>], opts: GradcheckOptions, f: F) -> Result<GradcheckReport, GradcheckError>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    let (op, location) = ("gradgradcheck", std::panic::Location::caller());
    let mut graph = Graph::<f64>::new();
    graph.set_threads(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x5eed_9a4d);
    let out = output_shape(&mut graph, inputs, &f)?;
    let r = drawn(op, out, &mut rng, location)?;
    let u = inputs.iter().map(|t| drawn(op, t.shape(), &mut rng, location)).collect::<Result<Vec<_>, Error>>()?;
    // ∂M/∂x through two recorded gradients.
    let analytic = graph.scope(|s| -> Result<Vec<Vec<f64>>, GradcheckError> {
        let vars: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
        let l = project(s, f(s, &vars), &r);
        if !l.item()?.is_finite() {
            return Err(GradcheckError::NonFinite);
        }
        let mut grads = vec![s.scalar(0.0); vars.len()];
        s.grad_into(l, &vars, &mut grads)?;
        let mut m = s.scalar(0.0);
        for (g, ui) in grads.iter().zip(&u) {
            m = m + project(s, *g, ui);
        }
        let mut second = vec![s.scalar(0.0); vars.len()];
        s.grad_into(m, &vars, &mut second)?;
        second.iter().zip(inputs).map(|(h, t)| Ok(copied(op, t.shape(), Some(h.value()?), location)?)).collect()
    })?;
    // M(x) from the fast backward.
    let m_at = |graph: &mut Graph<f64>, work: &[Tensor<f64>]| -> Result<f64, GradcheckError> {
        Ok(graph.scope(|s| -> Result<f64, Error> {
            let vars: Vec<_> = work.iter().map(|t| s.leaf(t)).collect();
            let l = project(s, f(s, &vars), &r);
            if !l.requires_grad() {
                return Ok(0.0);
            }
            s.backward(l)?;
            Ok(vars
                .iter()
                .zip(&u)
                .map(|(v, ui)| v.grad().map_or(0.0, |g| g.iter().zip(ui).map(|(a, b)| a * b).sum()))
                .sum())
        })?)
    };
    let mut work = copies(op, inputs, location)?;
    let mut report = GradcheckReport { checked: 0, max_abs_err: 0.0 };
    for input in 0..inputs.len() {
        for index in 0..inputs[input].numel() {
            let x = inputs[input].data()[index];
            let h = opts.h * x.abs().max(1.0);
            work[input].data_mut()[index] = x + h;
            let plus = m_at(&mut graph, &work)?;
            work[input].data_mut()[index] = x - h;
            let minus = m_at(&mut graph, &work)?;
            work[input].data_mut()[index] = x;
            let numeric = (plus - minus) / (2.0 * h);
            let a = analytic[input][index];
            let err = (a - numeric).abs();
            let within = err <= opts.atol + opts.rtol * a.abs().max(numeric.abs());
            if !within {
                return Err(GradcheckError::Mismatch { input, index, analytic: a, numeric });
            }
            report.max_abs_err = report.max_abs_err.max(err);
            report.checked += 1;
        }
    }
    Ok(report)
}

/// Checks `f`'s forward mode: the tangent of its output ([`Scope::forward`], with a fixed
/// random tangent `v` seeded on every input) against central differences along `v`,
/// `(f(x + h·v) − f(x − h·v))/2h`, and against the Jacobian-vector product of reverse mode
/// (the double-vjp trick: `∂⟨uᵀJ, v⟩/∂u` with a dummy cotangent `u`, through
/// [`Scope::vjp`] and [`Scope::grad`], which share no code with the tangent rules). The
/// step is `h·max(1, max |x|)`; tolerances are [`GradcheckOptions`]'s, for both comparisons.
///
/// ```
/// use tapir::testing::{jvpcheck, GradcheckOptions};
/// let a = tapir::Tensor::<f64>::from_vec(vec![0.3, -1.2, 2.0, 0.5], &[2, 2]).unwrap();
/// let report = jvpcheck(&[a.clone(), a], GradcheckOptions::default(), |_, v| v[0].matmul(v[1]).tanh()).unwrap();
/// assert_eq!(report.checked, 4);
/// ```
///
/// # Errors
/// [`GradcheckError`] on the first disagreement or failure.
pub fn jvpcheck<F>(inputs: &[Tensor<f64>], opts: GradcheckOptions, f: F) -> Result<GradcheckReport, GradcheckError>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    let (op, location) = ("jvpcheck", std::panic::Location::caller());
    let mut graph = Graph::<f64>::new();
    graph.set_threads(1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(opts.seed ^ 0x0f0a_7d00);
    let v = inputs.iter().map(|t| drawn(op, t.shape(), &mut rng, location)).collect::<Result<Vec<_>, Error>>()?;
    let tangents: Vec<Tensor<f64>> =
        v.iter().zip(inputs).map(|(v, t)| Tensor::copy_at(op, t.shape(), v, location)).collect::<Result<_, Error>>()?;
    let forward = graph.scope(|s| -> Result<Vec<f64>, GradcheckError> {
        s.forward(|level| {
            let vars: Vec<_> =
                inputs.iter().zip(&tangents).map(|(x, t)| s.dual(level, s.leaf(x), s.input(t))).collect();
            let y = f(s, &vars);
            if !y.value()?.iter().all(|v| v.is_finite()) {
                return Err(GradcheckError::NonFinite);
            }
            let t = s.tangent(level, y);
            Ok(copied(op, y.shape(), Some(t.value()?), location)?)
        })
    })?;
    let reverse = graph.scope(|s| -> Result<Vec<f64>, GradcheckError> {
        let vars: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
        let y = f(s, &vars);
        let dims = y.shape().to_vec();
        let u = s.zeros(&dims).with_grad();
        let mut ut_j = vec![u; vars.len()];
        s.vjp_into(y, u, &vars, &mut ut_j)?;
        let mut dot = s.scalar(0.0);
        for (g, t) in ut_j.iter().zip(&tangents) {
            dot = dot + (*g * s.input(t)).sum();
        }
        let [jv] = s.grad(dot.sum(), [u])?;
        Ok(copied(op, jv.shape(), Some(jv.value()?), location)?)
    })?;
    let scale = inputs.iter().flat_map(|t| t.data()).fold(1.0f64, |m, x| m.max(x.abs()));
    let h = opts.h * scale;
    let mut eval = |sign: f64| -> Result<Vec<f64>, GradcheckError> {
        let moved: Vec<Tensor<f64>> = inputs
            .iter()
            .zip(&v)
            .map(|(x, v)| {
                let data: Vec<f64> = x.data().iter().zip(v).map(|(x, v)| x + sign * h * v).collect();
                Tensor::copy_at(op, x.shape(), &data, location)
            })
            .collect::<Result<_, Error>>()?;
        let moved = &moved;
        Ok(graph.scope(|s| {
            let vars: Vec<_> = moved.iter().map(|t| s.input(t)).collect();
            f(s, &vars).value().map(|v| v.to_vec())
        })?)
    };
    let (plus, minus) = (eval(1.0)?, eval(-1.0)?);
    let mut report = GradcheckReport { checked: 0, max_abs_err: 0.0 };
    for (index, &a) in forward.iter().enumerate() {
        let numeric = (plus[index] - minus[index]) / (2.0 * h);
        for (against, expected) in [("central differences", numeric), ("reverse mode", reverse[index])] {
            let err = (a - expected).abs();
            // Written so that a NaN on either side fails the check.
            let within = err <= opts.atol + opts.rtol * a.abs().max(expected.abs());
            if !within {
                return Err(GradcheckError::TangentMismatch { index, analytic: a, against, expected });
            }
            report.max_abs_err = report.max_abs_err.max(err);
        }
        report.checked += 1;
    }
    Ok(report)
}

/// The shape of `f`'s output at `inputs`.
fn output_shape<F>(graph: &mut Graph<f64>, inputs: &[Tensor<f64>], f: &F) -> Result<Shape, Error>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    graph.scope(|s| {
        let vars: Vec<_> = inputs.iter().map(|t| s.input(t)).collect();
        let out = f(s, &vars);
        out.value()?;
        Ok(out.shape())
    })
}

// The buffers below are as large as the caller's tensors or `f`'s output, so they are
// allocated fallibly like every owned tensor: an input too large to copy is an
// `Error::TensorOutOfMemory` naming the check, not an abort.

/// Uniform draws in `[-1, 1)` for each element of `shape`, in order.
fn drawn(op: &'static str, shape: Shape, rng: &mut impl RngExt, location: Loc) -> Result<Vec<f64>, Error> {
    let mut v = try_vec(op, shape, shape.numel(), 0.0, location)?;
    for x in &mut v {
        *x = rng.random_range(-1.0..1.0);
    }
    Ok(v)
}

/// A copy of `data` (zeros for `None`, a gradient that was never written) of `shape`.
fn copied(op: &'static str, shape: Shape, data: Option<&[f64]>, location: Loc) -> Result<Vec<f64>, Error> {
    let mut v = try_vec(op, shape, shape.numel(), 0.0, location)?;
    if let Some(data) = data {
        v.copy_from_slice(data);
    }
    Ok(v)
}

/// Copies of `inputs`, to perturb.
fn copies(op: &'static str, inputs: &[Tensor<f64>], location: Loc) -> Result<Vec<Tensor<f64>>, Error> {
    inputs.iter().map(|t| Tensor::copy_at(op, t.shape(), t.data(), location)).collect()
}

/// `L = Σ out ⊙ r`.
fn project<'s>(s: &'s Scope<'s, '_, f64>, out: Var<'s, f64>, r: &[f64]) -> Var<'s, f64> {
    let dims = out.shape().to_vec();
    (out * s.tensor(r, &dims)).sum()
}
