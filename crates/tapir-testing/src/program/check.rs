//! The checker: runs a program twice, compares every step with the reference model, checks
//! backward's results and gradients, and compares smooth programs with finite differences
//! (small ones to second order, through the recorded gradient of `Scope::grad`).

use std::fmt;

use tapir::testing::{gradcheck, gradgradcheck, jvpcheck, GradcheckError, GradcheckOptions};
use tapir::{Error, Float, Graph, Scope, Tensor, Var};

use crate::model::{self, Outcome};
use crate::program::custom::NAME as CUSTOM;
use crate::program::interpret::{self, backward, backward_first, step_on};
use crate::program::{buffer, Dtype, Ending, Program, Step};

/// A property that a program broke: a wrong error, a wrong shape, a wrong gradient, a
/// non-deterministic rerun. Its `Display` names the step and prints the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Finding {
    /// What went wrong.
    pub what: String,
    /// The program, as `Debug` prints it.
    pub program: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}\nprogram: {}", self.what, self.program)
    }
}

impl std::error::Error for Finding {}

/// What a program did, for the statistics of a replay or a property test.
#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    /// Steps in the program.
    pub steps: usize,
    /// The scope's first error, if a step failed.
    pub error: Option<Error>,
    /// Whether the gradients were compared with finite differences.
    pub gradchecked: bool,
    /// Whether the recorded second derivatives were compared with finite differences of
    /// the gradients.
    pub gradgradchecked: bool,
    /// Whether forward mode's tangent (every leaf seeded) was compared with differences
    /// along it and with reverse mode.
    pub tangentchecked: bool,
}

/// Decodes `bytes` into a program, runs it twice and checks every property listed in the
/// module documentation.
///
/// # Errors
/// A [`Finding`] for the first property the program broke. The fuzz target panics with
/// it, so that libFuzzer saves the input.
pub fn run_program(bytes: &[u8]) -> Result<Report, Finding> {
    let program = Program::from_bytes(bytes);
    let first = program.execute()?;
    let second = program.execute()?;
    if first.bits != second.bits {
        return Err(program.finding("a rerun with the same thread count gave different bits".into()));
    }
    // A custom op's backward that misbehaved and still returned `Ok` must have been
    // harmless: every value and gradient as the well-behaved op's, bit for bit.
    if program.misbehaves() && first.backward.is_ok() && program.tamed().execute()?.bits != first.bits {
        return Err(program.finding(format!(
            "backward through a misbehaving `{CUSTOM}` returned Ok with other values or gradients than the \
             well-behaved op's"
        )));
    }
    if program.has_custom() {
        buffer::check(&program).map_err(|what| program.finding(what))?;
    }
    let (gradchecked, gradgradchecked) = program.check_gradients(&first)?;
    // Checked with the first derivatives, on the same programs.
    let tangentchecked = gradchecked;
    Ok(Report { steps: program.steps.len(), error: first.error, gradchecked, gradgradchecked, tangentchecked })
}

/// What one execution produced: every value and leaf gradient as raw bits (`f32` values
/// widened exactly), and the scope's first error.
#[derive(Debug, Clone, PartialEq)]
pub struct Trace {
    /// Values of leaves and steps, then leaf gradients, then backward's results, as bits.
    pub bits: Vec<Vec<u64>>,
    /// Largest absolute value of any step (`f64::INFINITY` if one was not finite).
    pub scale: f64,
    /// The scope's first error.
    pub error: Option<Error>,
    /// What the first backward call returned.
    pub backward: Result<(), Error>,
}

impl Program {
    /// Whether `e` is an arena-limit error that this run's limit explains.
    fn honest_limit(&self, e: &Error) -> bool {
        match *e {
            Error::ArenaLimit { requested, in_use, limit, .. } => {
                limit == self.limit() && requested.saturating_add(in_use) > limit
            }
            _ => false,
        }
    }

    pub(crate) fn finding(&self, what: String) -> Finding {
        Finding { what, program: format!("{self:?}") }
    }

    /// Runs the program once in its element type, checking each step against the model.
    ///
    /// # Errors
    /// A [`Finding`] for the first broken property.
    pub fn execute(&self) -> Result<Trace, Finding> {
        match self.dtype {
            Dtype::F32 => self.execute_as::<f32>(),
            Dtype::F64 => self.execute_as::<f64>(),
        }
    }

    /// The model's outcome of every step, up to and including the first error.
    fn expected(&self) -> Vec<Outcome> {
        let mut shapes: Vec<Vec<usize>> = self.leaves.iter().map(|l| l.dims.clone()).collect();
        let mut out = vec![];
        for step in &self.steps {
            let o = model::outcome(step, &shapes);
            match &o {
                Outcome::Ok(dims) => shapes.push(dims.clone()),
                Outcome::Err { .. } => {
                    out.push(o);
                    break;
                }
            }
            out.push(o);
        }
        out
    }

    fn execute_as<T: Float>(&self) -> Result<Trace, Finding> {
        let mut tensors = Vec::with_capacity(self.leaves.len());
        for l in &self.leaves {
            let data = l.data.iter().map(|&v| T::from_f64(v)).collect();
            tensors.push(Tensor::from_vec(data, &l.dims).map_err(|e| self.finding(format!("leaf: {e}")))?);
        }
        let expected = self.expected();
        let mut graph = Graph::<T>::new();
        graph.set_threads(self.threads);
        graph.set_arena_limit(Some(self.limit()));
        graph.scope(|s| Run { p: self, s, expected: &expected, first: None, effective: false }.go(&tensors))
    }

    /// Compares backward with finite differences when the program is smooth, valid, in
    /// `f64`, on finite inputs, and small, and the recorded second derivatives too when it
    /// is smaller still. Returns whether it did each.
    fn check_gradients(&self, trace: &Trace) -> Result<(bool, bool), Finding> {
        let numel: usize = self.leaves.iter().map(|l| l.data.len()).sum();
        let eligible = self.dtype == Dtype::F64
            && self.arena_limit.is_none()
            && trace.error.is_none()
            && numel <= 48
            && trace.scale <= 1e6
            && self.leaves.iter().all(|l| l.data.iter().all(|v| v.is_finite()))
            && self.steps.iter().all(Step::smooth);
        if !eligible {
            return Ok((false, false));
        }
        let inputs: Vec<Tensor<f64>> =
            self.leaves.iter().filter_map(|l| Tensor::from_vec(l.data.clone(), &l.dims).ok()).collect();
        // Rounding in the forward pass grows with the values' magnitude; finite differences
        // see it divided by the step, so the absolute tolerance scales with it. Steep
        // programs (exp of a square of a square) have third derivatives so large that the
        // step's truncation error dominates: a mismatch is retried with smaller steps, and
        // only a gradient no step agrees with is a finding.
        let atol = 1e-5 * trace.scale.max(1.0);
        if !self.finite_differences(&inputs, atol, false)? {
            return Ok((false, false));
        }
        // Forward mode on the same program, every leaf seeded: its tangent against
        // differences along the tangent and against reverse mode's double-vjp product.
        // The generator's custom op has a forward rule (`CustomOp::jvp`), checked here too.
        self.tangents(&inputs, atol)?;
        // Small programs also take second derivatives: the recorded gradient
        // (`Scope::grad`) differentiated again, against finite differences of backward's.
        // Rounding grows faster there: a value of size S is off by about ε·S, and the
        // second-order graph can multiply that by two derivatives of size S (an exp's
        // derivative is its value), so a second derivative can be off by ε·S³ where the
        // exact one is 0 (`log_softmax` over identical copies of `exp(…)` ≈ 8e5 gave 211.9:
        // `tests/second_order.rs`). They are compared only where that bound is below the
        // tolerance, S up to about 2e5.
        let rounding = f64::EPSILON * trace.scale.max(1.0).powi(3);
        let second = numel <= 24 && rounding <= atol && self.finite_differences(&inputs, atol, true)?;
        Ok((true, second))
    }

    /// [`gradcheck`], or [`gradgradcheck`] if `second`, with steps from 1e-6 down to 1e-9
    /// (and 1e-5): `Ok(false)` if the function is not finite or finite differences do not
    /// settle on one value (see [`settled`]), a finding if no step agrees.
    fn finite_differences(&self, inputs: &[Tensor<f64>], atol: f64, second: bool) -> Result<bool, Finding> {
        let mut first_mismatch = None;
        let mut mismatches = Vec::new();
        for h in [1e-6, 1e-7, 1e-8, 1e-9, 1e-5] {
            let opts = GradcheckOptions { h, atol, ..GradcheckOptions::default() };
            let result = if second {
                gradgradcheck(inputs, opts, |s, vars| self.replay(s, vars))
            } else {
                gradcheck(inputs, opts, |s, vars| self.replay(s, vars))
            };
            match result {
                Ok(_) => return Ok(true),
                Err(GradcheckError::NonFinite) => return Ok(false),
                Err(e @ GradcheckError::Mismatch { .. }) => {
                    mismatches.push(e.clone());
                    first_mismatch.get_or_insert(e);
                }
                Err(e) => return Err(self.finding(e.to_string())),
            }
        }
        if !settled(&mismatches, atol) {
            return Ok(false);
        }
        let order = if second { "second derivative: " } else { "" };
        match first_mismatch {
            Some(e) => Err(self.finding(format!("{order}{e} (and with steps 1e-5 to 1e-9)"))),
            None => Ok(true),
        }
    }

    /// [`jvpcheck`] with steps from 1e-6 down to 1e-9 (and 1e-5): a finding if forward
    /// mode disagrees with reverse mode, or with differences at every step.
    fn tangents(&self, inputs: &[Tensor<f64>], atol: f64) -> Result<(), Finding> {
        let mut first = None;
        for h in [1e-6, 1e-7, 1e-8, 1e-9, 1e-5] {
            let opts = GradcheckOptions { h, atol, ..GradcheckOptions::default() };
            match jvpcheck(inputs, opts, |s, vars| self.replay(s, vars)) {
                Ok(_) | Err(GradcheckError::NonFinite) => return Ok(()),
                Err(e @ GradcheckError::TangentMismatch { against: "reverse mode", .. }) => {
                    return Err(self.finding(e.to_string()))
                }
                Err(e @ GradcheckError::TangentMismatch { .. }) => {
                    first.get_or_insert(e);
                }
                Err(e) => return Err(self.finding(e.to_string())),
            }
        }
        Err(self.finding(format!("{} (and with steps 1e-5 to 1e-9)", first.expect("a mismatch at every step"))))
    }

    /// The program's loss recorded on `vars`.
    fn replay<'s>(&self, s: &'s Scope<'s, '_, f64>, vars: &[Var<'s, f64>]) -> Var<'s, f64> {
        let mut values = vars.to_vec();
        for step in &self.steps {
            let v = step_on(s, &values, step);
            values.push(v);
        }
        values[self.loss]
    }
}

/// Whether the mismatches of the steps tried show finite differences that settled: two
/// steps that report the same element with numeric values agreeing within `gradcheck`'s
/// tolerance, so that the analytic gradient is what disagrees. If no two do, the program
/// is too steep for `f64` differences at any step: its rounding error divided by a small
/// step and its truncation error at a large one both exceed the tolerance (the fuzzer's
/// `cos` of a square of `exp(cos(cos(...)))`, whose gradient is about 1e6 on values of
/// 1e3: differences gave 3.0e4 to 9.0e5 against 9.81e5 from backward and from 80-digit
/// differences), and the check says nothing either way.
fn settled(mismatches: &[GradcheckError], atol: f64) -> bool {
    let rtol = GradcheckOptions::default().rtol;
    let numeric = |e: &GradcheckError| match *e {
        GradcheckError::Mismatch { input, index, numeric, .. } => Some((input, index, numeric)),
        _ => None,
    };
    mismatches.iter().enumerate().any(|(i, a)| {
        mismatches[i + 1..].iter().any(|b| match (numeric(a), numeric(b)) {
            (Some((ia, ea, na)), Some((ib, eb, nb))) => {
                (ia, ea) == (ib, eb) && (na - nb).abs() <= atol + rtol * na.abs().max(nb.abs())
            }
            _ => false,
        })
    })
}

/// One execution inside a scope.
struct Run<'p, 's, 'g, T: Float> {
    p: &'p Program,
    s: &'s Scope<'s, 'g, T>,
    expected: &'p [Outcome],
    /// The first error and the step (or `steps.len()` for the loss's sum) that raised it.
    first: Option<(usize, Error)>,
    /// Whether a custom step misbehaves in a way its backward must report
    /// ([`Misbehave::effective`](crate::program::Misbehave::effective)).
    effective: bool,
}

fn bits<T: Float>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

impl<'s, 'g: 's, T: Float> Run<'_, 's, 'g, T> {
    fn fail(&self, at: usize, what: String) -> Finding {
        self.p.finding(format!("step {at}: {what}"))
    }

    /// Checks that `e` is the error the model predicts for step `at` (or an arena limit).
    fn check_error(&self, at: usize, e: &Error) -> Result<(), Finding> {
        let ok_limit = self.p.honest_limit(e);
        let as_predicted = match self.expected.get(at) {
            Some(Outcome::Err { variant, op }) => model::variant(e) == *variant && e.op() == *op,
            _ => false,
        };
        if !ok_limit && !as_predicted {
            return Err(self.fail(at, format!("got error {e:?}, model expects {:?}", self.expected.get(at))));
        }
        match e.location() {
            Some(l) if l.file() == interpret::FILE => Ok(()),
            _ => Err(self.fail(at, format!("error {e} is not located at the caller ({})", interpret::FILE))),
        }
    }

    /// After step `at` made `v`: the scope's error must be unchanged, new and predicted,
    /// or absent with `v` of the predicted shape.
    fn after(&mut self, at: usize, v: Var<'s, T>, no_grad: bool) -> Result<(), Finding> {
        match (&self.first, self.s.check()) {
            (Some((_, first)), Err(e)) if *first == e => Ok(()),
            (Some((_, first)), now) => Err(self.fail(at, format!("first error {first:?} became {now:?}"))),
            (None, Err(e)) => {
                self.check_error(at, &e)?;
                self.first = Some((at, e));
                Ok(())
            }
            (None, Ok(())) => {
                let dims = match self.expected.get(at) {
                    Some(Outcome::Ok(dims)) => dims,
                    other => return Err(self.fail(at, format!("succeeded, model expects {other:?}"))),
                };
                let len = v.value().map_err(|e| self.fail(at, format!("value: {e}")))?.len();
                let numel = if dims.contains(&0) { 0 } else { dims.iter().product::<usize>() };
                if v.shape().to_vec() != *dims || len != numel {
                    return Err(
                        self.fail(at, format!("shape {} with {len} elements, model expects {dims:?}", v.shape()))
                    );
                }
                if no_grad && v.requires_grad() {
                    return Err(self.fail(at, "a value made under no_grad requires grad".into()));
                }
                Ok(())
            }
        }
    }

    /// What backward must return now: the scope's error, `NotScalar`, `BackwardTwice`
    /// (after a consuming pass) or success.
    fn check_backward(&self, got: &Result<(), Error>, loss: Var<'s, T>, consumed: bool) -> Result<(), Finding> {
        let at = self.p.steps.len() + 1;
        let ok = match (&self.first, got) {
            (Some((_, first)), Err(e)) => first == e,
            (Some(_), Ok(())) => false,
            (None, Err(e @ Error::ArenaLimit { .. })) => self.p.honest_limit(e) && e.op() == "backward",
            (None, Err(Error::NotScalar { op, .. })) => op.starts_with("backward") && loss.shape().numel() != 1,
            (None, Err(Error::BackwardTwice { .. })) => consumed && loss.shape().numel() == 1,
            (None, Err(Error::NoGradient { .. })) => !consumed && loss.shape().numel() == 1 && !loss.requires_grad(),
            (None, Err(Error::CustomOp { op, phase: "backward", .. })) => {
                self.effective && *op == CUSTOM && !consumed && loss.shape().numel() == 1 && loss.requires_grad()
            }
            (None, Err(_)) => false,
            (None, Ok(())) => !consumed && loss.shape().numel() == 1 && loss.requires_grad(),
        };
        if !ok {
            return Err(self.fail(at, format!("backward returned {got:?} (consumed: {consumed})")));
        }
        if let Err(e) = got {
            if e.location().map(|l| l.file()) != Some(interpret::FILE) {
                return Err(self.fail(at, format!("backward error {e} is not located at the caller")));
            }
        }
        Ok(())
    }

    fn grads(&self, leaves: &[Var<'s, T>]) -> Result<Vec<Vec<u64>>, Finding> {
        let mut out = vec![];
        for (leaf, v) in self.p.leaves.iter().zip(leaves) {
            match v.grad() {
                Some(g) if !leaf.grad => return Err(self.fail(0, format!("input leaf got gradient {g:?}"))),
                Some(g) if g.len() != leaf.data.len() => {
                    return Err(self.fail(0, format!("gradient of {} elements for a leaf of {:?}", g.len(), leaf.dims)))
                }
                g => out.push(g.map_or(vec![], bits)),
            }
        }
        Ok(out)
    }

    fn go(mut self, tensors: &'g [Tensor<T>]) -> Result<Trace, Finding> {
        let s = self.s;
        let mut values: Vec<Var<'s, T>> = vec![];
        for (leaf, t) in self.p.leaves.iter().zip(tensors) {
            values.push(if leaf.grad { s.leaf(t) } else { s.input(t) });
        }
        let leaves = values.clone();
        for (at, step) in self.p.steps.iter().enumerate() {
            let v = step_on(s, &values, step);
            if let Step::Custom { xs, mode } = step {
                // The engine hands a slot of the input's length to each input that
                // requires a gradient, `None` to the others.
                let slots: Vec<Option<usize>> =
                    xs.iter().map(|&i| values[i].requires_grad().then(|| values[i].shape().numel())).collect();
                self.effective |= mode.effective(&slots);
            }
            values.push(v);
            self.after(at, v, matches!(step, Step::NoGrad(_)))?;
        }
        let mut loss = values[self.p.loss];
        let at = self.p.steps.len();
        if self.p.reduce_loss {
            loss = interpret::sum(loss);
            if self.first.is_none() {
                if let Err(e) = s.check() {
                    // Only the arena limit can stop a sum of a valid value.
                    if !self.p.honest_limit(&e) {
                        return Err(self.fail(at, format!("sum of the loss failed: {e}")));
                    }
                    self.first = Some((at, e));
                }
            }
        }
        let item = loss.item();
        match (&self.first, &item) {
            (Some((_, first)), Err(e)) if first == e => {}
            (None, Ok(_)) if loss.shape().numel() == 1 => {}
            (None, Err(Error::NotScalar { op: "item", .. })) if loss.shape().numel() != 1 => {}
            _ => return Err(self.fail(at, format!("item returned {item:?}"))),
        }
        let mut bits_out: Vec<Vec<u64>> = vec![];
        let mut scale = 0f64;
        for v in &values {
            if let Ok(x) = v.value() {
                scale =
                    x.iter().fold(scale, |m, v| if v.is_finite() { m.max(v.to_f64().abs()) } else { f64::INFINITY });
                bits_out.push(bits(x));
            }
        }
        let first = backward_first(s, self.p.ending, loss);
        self.check_backward(&first, loss, false)?;
        let limited = matches!(first, Err(Error::ArenaLimit { .. }));
        let mut grads = self.grads(&leaves)?;
        bits_out.append(&mut grads.clone());
        if !limited {
            match self.p.ending {
                Ending::Once => {}
                Ending::Twice => {
                    let second = backward(s, loss);
                    self.check_backward(&second, loss, first.is_ok())?;
                }
                Ending::RetainThenOnce => {
                    let second = backward(s, loss);
                    self.check_backward(&second, loss, false)?;
                    if second.is_ok() {
                        let again = self.grads(&leaves)?;
                        if again != grads {
                            return Err(self.fail(at, "backward after backward_retain gave other gradients".into()));
                        }
                        grads = again;
                    }
                    let third = backward(s, loss);
                    self.check_backward(&third, loss, second.is_ok())?;
                }
            }
        }
        bits_out.append(&mut grads);
        Ok(Trace { bits: bits_out, scale, error: self.first.map(|(_, e)| e), backward: first })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mismatch(index: usize, numeric: f64) -> GradcheckError {
        GradcheckError::Mismatch { input: 0, index, analytic: 1.0, numeric }
    }

    #[test]
    fn differences_that_agree_with_each_other_and_not_backward_are_a_finding() {
        // A wrong gradient: every step's differences give 2.0 for element 3.
        assert!(settled(&[mismatch(3, 2.0), mismatch(3, 2.0 + 1e-9), mismatch(3, 1.99)], 1e-5));
        // The fuzzer's steep program: the differences move with the step.
        assert!(!settled(&[mismatch(0, 2.96e4), mismatch(0, 1.35e5), mismatch(0, 9.0e5)], 1e-5));
        // Different elements at different steps say nothing about one of them.
        assert!(!settled(&[mismatch(0, 2.0), mismatch(1, 2.0)], 1e-5));
        assert!(!settled(&[mismatch(0, 2.0)], 1e-5));
    }
}
