//! Optimizers that own their state buffers and update a [`ParamStore`] in place, after the
//! scope that filled the [`GradBuffer`] has ended; gradient clipping; learning-rate schedules.
//!
//! State (momentum, moments) is allocated once, in the constructor, with the shapes of the
//! store's parameters, so [`Optimizer::step`] never allocates.

mod adam;
mod schedule;
mod sgd;
mod state;

pub use adam::{Adam, AdamW};
pub use schedule::{Constant, CosineWarmup, Schedule, StepDecay};
pub use sgd::Sgd;
pub use state::Stateful;

use tapir::{Float, GradBuffer, ParamStore};

/// Elements per piece of a parameter whose update splits over threads.
pub(crate) const CHUNK: usize = 1 << 13;

/// Whether the update of a parameter of `len` elements splits over the threads of
/// rayon's pool: when [`tapir::init_threads`] built one (see [`tapir::pool_threads`]) and
/// the parameter has at least 32,768 elements. Every update is elementwise, so the result
/// is the same, bit for bit, whatever the split.
pub(crate) fn split(len: usize) -> bool {
    len >= 1 << 15 && tapir::pool_threads() > 1
}

/// Updates parameters from their gradients.
pub trait Optimizer<T: Float> {
    /// One update of every parameter of `store` from `grads` (which the caller zeroes
    /// between steps with [`GradBuffer::zero`]).
    ///
    /// # Errors
    /// [`tapir::Error::WrongStore`] if `store` or `grads` is not the store the optimizer
    /// was made for; [`tapir::Error::UnknownParam`] if `store`, `grads` and the optimizer's
    /// state do not hold the same parameters with the same shapes;
    /// [`tapir::Error::InvalidArgument`] for a learning rate that is not finite and
    /// non-negative; [`tapir::Error::NonFinite`] for a NaN or infinite gradient when the
    /// check is on (`check_finite(true)`). Nothing is updated then. Errors name the
    /// caller's line, calls through `dyn Optimizer` included.
    #[track_caller]
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()>;

    /// The learning rate of the next step.
    fn lr(&self) -> f64;

    /// Sets the learning rate (for schedules); [`Optimizer::step`] refuses one that is not
    /// finite and non-negative.
    fn set_lr(&mut self, lr: f64);
}

/// The Euclidean norm of `values`, scaled as BLAS `nrm2` does so that neither squares of
/// huge values overflow nor squares of tiny ones underflow; NaN if any value is NaN,
/// infinity if any is infinite.
///
/// One pass sums the squares in f64 directly. For f32 gradients that sum can neither
/// overflow nor lose anything to underflow, and for f64 ones it is exact enough whenever
/// it comes out finite and above `1e-280`: a square that underflowed then weighs less than
/// `1e-28` of it. Otherwise (an infinity, a NaN, huge or tiny f64 values) the scaled two
/// passes below decide.
pub(crate) fn norm2<T: Float>(grads: &GradBuffer<T>) -> f64 {
    let values = grads.as_slice();
    let direct = sum_sq(values);
    if direct.is_finite() && direct > 1e-280 {
        return direct.sqrt();
    }
    let mut max = 0.0f64;
    for v in values {
        let a = v.to_f64().abs();
        if a.is_nan() {
            return f64::NAN;
        }
        max = max.max(a);
    }
    if max == 0.0 || max.is_infinite() {
        return max;
    }
    // Every ratio is at most 1, so the sum is at most the element count.
    let sum: f64 = values.iter().map(|v| (v.to_f64() / max).powi(2)).sum();
    max * sum.sqrt()
}

/// `Σ v²` in f64, in eight independent partial sums so that the loop vectorises (one
/// running sum is a chain of dependent additions).
fn sum_sq<T: Float>(values: &[T]) -> f64 {
    const LANES: usize = 8;
    let mut acc = [0.0f64; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            let v = v.to_f64();
            *a += v * v;
        }
    }
    let tail: f64 = tail.iter().map(|v| v.to_f64() * v.to_f64()).sum();
    acc.iter().sum::<f64>() + tail
}

/// Scales every gradient by `min(1, max_norm/‖g‖)`, where `‖g‖` is the Euclidean norm of
/// all gradients together (PyTorch's `clip_grad_norm_`), and returns `‖g‖` before
/// clipping. The norm is computed with scaling (as BLAS `nrm2`), so gradients near the
/// dtype's largest values give a finite norm and are clipped. A non-finite norm (a NaN or
/// infinite gradient) is returned as is and leaves the gradients unchanged.
///
/// # Errors
/// [`tapir::Error::InvalidArgument`] if `max_norm` is not positive and finite;
/// [`tapir::Error::WrongStore`] if `grads` was made for another store;
/// [`tapir::Error::UnknownParam`] if its shapes do not match `store`.
#[track_caller]
pub fn clip_grad_norm<T: Float>(store: &ParamStore<T>, grads: &mut GradBuffer<T>, max_norm: f64) -> tapir::Result<f64> {
    if !(max_norm > 0.0 && max_norm.is_finite()) {
        return Err(crate::invalid("clip_grad_norm", format!("max_norm {max_norm} must be positive and finite")));
    }
    check_shapes("clip_grad_norm", store, grads, None)?;
    let norm = norm2(grads);
    if norm.is_finite() && norm > max_norm {
        // In f64 first: max_norm/norm is in (0, 1), so it cannot overflow `T`.
        let scale = T::from_f64(max_norm / (norm + 1e-6));
        grads.as_mut_slice().iter_mut().for_each(|v| *v *= scale);
    }
    Ok(norm)
}

/// Checks that the store, the gradients and (if given) each state buffer agree: the same
/// store identity, the same parameters and the same shapes.
#[track_caller]
pub(crate) fn check_shapes<T: Float>(
    op: &'static str,
    store: &ParamStore<T>,
    grads: &GradBuffer<T>,
    state: Option<(u64, &[Vec<T>])>,
) -> tapir::Result<()> {
    let location = std::panic::Location::caller();
    if let Some((id, _)) = state {
        if id != store.id() {
            return Err(tapir::Error::WrongStore {
                op,
                what: "the optimizer".into(),
                expected: id,
                found: store.id(),
                location,
            });
        }
    }
    grads.check_store(op, store.id())?;
    let fail = |detail: String| tapir::Error::UnknownParam { op, detail, location };
    if grads.len() != store.len() {
        return Err(fail(format!("the store holds {} parameters but the gradients {}", store.len(), grads.len())));
    }
    // An optimizer without per-parameter state (plain SGD) passes an empty list.
    let state = state.filter(|(_, s)| !s.is_empty());
    if let Some((_, state)) = state {
        if state.len() != store.len() {
            return Err(fail(format!(
                "the optimizer was made for {} parameters but the store holds {}",
                state.len(),
                store.len()
            )));
        }
    }
    for ((i, (_, name, p)), (_, g)) in store.iter().enumerate().zip(grads.iter()) {
        if g.shape() != p.shape() {
            return Err(fail(format!("parameter {name:?} has shape {} but its gradient {}", p.shape(), g.shape())));
        }
        if let Some((_, state)) = state {
            if state[i].len() != p.numel() {
                return Err(fail(format!(
                    "parameter {name:?} has shape {} ({} elements) but the optimizer's state {} elements",
                    p.shape(),
                    p.numel(),
                    state[i].len()
                )));
            }
        }
    }
    Ok(())
}

/// With the opt-in check on, fails with [`tapir::Error::NonFinite`] naming the first
/// parameter whose gradient holds a NaN or an infinity, before anything is updated.
#[track_caller]
pub(crate) fn check_finite_grads<T: Float>(
    op: &'static str,
    store: &ParamStore<T>,
    grads: &GradBuffer<T>,
) -> tapir::Result<()> {
    for ((_, _, p), (_, g)) in store.iter().zip(grads.iter()) {
        if !g.data().iter().all(|v| v.is_finite()) {
            return Err(tapir::Error::NonFinite {
                op,
                phase: "gradient",
                shape: p.shape(),
                location: std::panic::Location::caller(),
            });
        }
    }
    Ok(())
}

/// One zeroed buffer per parameter, allocated fallibly.
#[track_caller]
pub(crate) fn zeros_like<T: Float>(op: &'static str, store: &ParamStore<T>) -> tapir::Result<Vec<Vec<T>>> {
    let shapes: Vec<tapir::Shape> = store.iter().map(|(_, _, t)| t.shape()).collect();
    zeros_of(op, &shapes)
}

/// One zeroed buffer per shape, allocated fallibly.
#[track_caller]
pub(crate) fn zeros_of<T: Float>(op: &'static str, shapes: &[tapir::Shape]) -> tapir::Result<Vec<Vec<T>>> {
    let location = std::panic::Location::caller();
    let oom = |shape: tapir::Shape, n: usize| tapir::Error::TensorOutOfMemory {
        op,
        shape,
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        location,
    };
    let mut out = Vec::new();
    out.try_reserve_exact(shapes.len()).map_err(|_| oom(tapir::Shape::scalar(), 0))?;
    for &shape in shapes {
        let mut v = Vec::new();
        v.try_reserve_exact(shape.numel()).map_err(|_| oom(shape, shape.numel()))?;
        v.resize(shape.numel(), T::ZERO);
        out.push(v);
    }
    Ok(out)
}

/// Checks a hyper-parameter: finite both in `f64` and in the element type `T` (a value
/// that overflows `f32` would poison every parameter), and within `range`.
#[track_caller]
pub(crate) fn check_hyper<T: Float>(
    op: &'static str,
    name: &str,
    v: f64,
    range: impl std::ops::RangeBounds<f64> + std::fmt::Debug,
) -> tapir::Result<f64> {
    if v.is_finite() && T::from_f64(v).is_finite() && range.contains(&v) {
        Ok(v)
    } else {
        Err(crate::invalid(op, format!("{name} {v} must be finite in {} and in {range:?}", T::NAME)))
    }
}

/// The learning-rate rule of every constructor, [`Optimizer::step`] and checkpoint
/// loading: finite in `f64` and in `T`, and non-negative.
#[track_caller]
pub(crate) fn check_lr<T: Float>(op: &'static str, lr: f64) -> tapir::Result<()> {
    check_hyper::<T>(op, "learning rate", lr, 0.0..).map(|_| ())
}

/// The step after `steps`, checked: the counter of a step-counting optimizer, in its
/// `step` and when a checkpoint is loaded (a counter that cannot advance is refused there,
/// so loading never yields an optimizer whose next step fails).
#[track_caller]
pub(crate) fn next_step(op: &'static str, steps: u64) -> tapir::Result<u64> {
    // Not `ok_or_else(|| ..)`: `#[track_caller]` does not pass through closures.
    match steps.checked_add(1) {
        Some(next) => Ok(next),
        None => {
            Err(crate::invalid(op, format!("step count {steps} is the u64 limit; the next step cannot be counted")))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::{Graph, Tensor};

    /// `‖k·(3, 4, 0, …)‖ = 5k`, for magnitudes on both sides of the direct sum's `1e-280`
    /// switch, in both dtypes and with a tail after the 8-lane chunks.
    #[test]
    fn norm_of_scaled_three_four_five() {
        fn norm_of<T: Float>(k: f64, len: usize) -> f64 {
            let mut store = ParamStore::<T>::new();
            let mut v = vec![T::ZERO; len];
            v[0] = T::from_f64(3.0 * k);
            v[len - 1] = T::from_f64(4.0 * k);
            store.add("p", Tensor::from_vec(v, &[len]).unwrap()).unwrap();
            let mut grads = store.zeros_like().unwrap();
            grads.as_mut_slice().copy_from_slice(store.iter().next().unwrap().2.data());
            norm2(&grads)
        }
        for len in [2, 8, 11, 1000] {
            for k in [1e-150, 1e-140, 1e-3, 1.0, 1e3, 1e140, 1e160] {
                let n = norm_of::<f64>(k, len);
                assert!((n / (5.0 * k) - 1.0).abs() < 1e-14, "f64 k={k} len={len}: {n}");
            }
            for k in [1e-30, 1.0, 1e30] {
                // 3k and 4k are rounded to f32 first.
                let n = norm_of::<f32>(k, len);
                assert!((n / (5.0 * k) - 1.0).abs() < 1e-6, "f32 k={k} len={len}: {n}");
            }
        }
    }

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let mut store = ParamStore::<f64>::new();
        let a = store.add("a", Tensor::from_vec(vec![3.0], &[1]).unwrap()).unwrap();
        let b = store.add("b", Tensor::from_vec(vec![4.0], &[1]).unwrap()).unwrap();
        let mut grads = store.zeros_like().unwrap();
        let mut g = Graph::new();
        g.scope(|s| {
            // L = a² + b², so the gradients are 2a = 6 and 2b = 8: norm 10.
            let l = s.param(&store, a).square().sum() + s.param(&store, b).square().sum();
            s.backward_into(l, &mut grads).unwrap();
        });
        let norm = clip_grad_norm(&store, &mut grads, 5.0).unwrap();
        assert!((norm - 10.0).abs() < 1e-12);
        let (ga, gb) = (grads.get(a).unwrap().data()[0], grads.get(b).unwrap().data()[0]);
        assert!((ga - 3.0).abs() < 1e-5 && (gb - 4.0).abs() < 1e-5, "{ga} {gb}");
        // Below the limit nothing changes.
        assert!((clip_grad_norm(&store, &mut grads, 100.0).unwrap() - 5.0).abs() < 1e-5);
        assert_eq!(grads.get(a).unwrap().data()[0], ga);
        assert!(clip_grad_norm(&store, &mut grads, 0.0).is_err());
        let other = ParamStore::<f64>::new();
        assert!(matches!(clip_grad_norm(&other, &mut grads, 1.0), Err(tapir::Error::WrongStore { .. })));
    }
}
