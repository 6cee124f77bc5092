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

/// Updates parameters from their gradients.
pub trait Optimizer<T: Float> {
    /// One update of every parameter of `store` from `grads` (which the caller zeroes
    /// between steps with [`GradBuffer::zero`]).
    ///
    /// # Errors
    /// [`tapir::Error::UnknownParam`] if `store`, `grads` and the optimizer's state do not
    /// hold the same parameters with the same shapes; nothing is updated then.
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()>;

    /// The learning rate of the next step.
    fn lr(&self) -> f64;

    /// Sets the learning rate (for schedules).
    fn set_lr(&mut self, lr: f64);
}

/// Scales every gradient by `min(1, max_norm/‖g‖)`, where `‖g‖` is the Euclidean norm of
/// all gradients together (PyTorch's `clip_grad_norm_`), and returns `‖g‖` before
/// clipping. A non-finite norm is returned as is and leaves the gradients unchanged.
///
/// # Errors
/// [`tapir::Error::InvalidArgument`] if `max_norm` is not positive and finite;
/// [`tapir::Error::UnknownParam`] if `grads` does not match `store`.
#[track_caller]
pub fn clip_grad_norm<T: Float>(store: &ParamStore<T>, grads: &mut GradBuffer<T>, max_norm: f64) -> tapir::Result<f64> {
    if !(max_norm > 0.0 && max_norm.is_finite()) {
        return Err(crate::invalid("clip_grad_norm", format!("max_norm {max_norm} must be positive and finite")));
    }
    check_shapes("clip_grad_norm", store, grads, None)?;
    let norm = grads.iter().flat_map(|(_, g)| g.data()).map(|&v| v.to_f64() * v.to_f64()).sum::<f64>().sqrt();
    if norm.is_finite() && norm > max_norm {
        let scale = T::from_f64(max_norm / (norm + 1e-6));
        for (id, _, _) in store.iter() {
            if let Some(g) = grads.get_mut(id) {
                g.data_mut().iter_mut().for_each(|v| *v *= scale);
            }
        }
    }
    Ok(norm)
}

/// Checks that the store, the gradients and (if given) each state buffer agree.
#[track_caller]
pub(crate) fn check_shapes<T: Float>(
    op: &'static str,
    store: &ParamStore<T>,
    grads: &GradBuffer<T>,
    state: Option<&[Vec<T>]>,
) -> tapir::Result<()> {
    let location = std::panic::Location::caller();
    let fail = |detail: String| tapir::Error::UnknownParam { op, detail, location };
    if grads.len() != store.len() {
        return Err(fail(format!("the store holds {} parameters but the gradients {}", store.len(), grads.len())));
    }
    if let Some(state) = state {
        if state.len() != store.len() {
            return Err(fail(format!(
                "the optimizer was made for {} parameters but the store holds {}",
                state.len(),
                store.len()
            )));
        }
    }
    for (i, (id, name, p)) in store.iter().enumerate() {
        let g = grads.get(id).map(|g| g.shape());
        if g != Some(p.shape()) {
            let g = g.map_or("nothing".to_string(), |s| s.to_string());
            return Err(fail(format!("parameter {name:?} has shape {} but its gradient {g}", p.shape())));
        }
        if let Some(state) = state {
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

/// One zeroed buffer per parameter.
pub(crate) fn zeros_like<T: Float>(store: &ParamStore<T>) -> Vec<Vec<T>> {
    store.iter().map(|(_, _, t)| vec![T::ZERO; t.numel()]).collect()
}

#[track_caller]
pub(crate) fn check_lr(op: &'static str, lr: f64) -> tapir::Result<()> {
    if lr >= 0.0 && lr.is_finite() {
        Ok(())
    } else {
        Err(crate::invalid(op, format!("learning rate {lr} must be finite and non-negative")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::{Graph, Tensor};

    #[test]
    fn clipping_scales_to_the_max_norm() {
        let mut store = ParamStore::<f64>::new();
        let a = store.add("a", Tensor::from_vec(vec![3.0], &[1]).unwrap()).unwrap();
        let b = store.add("b", Tensor::from_vec(vec![4.0], &[1]).unwrap()).unwrap();
        let mut grads = store.zeros_like();
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
        assert!(matches!(clip_grad_norm(&other, &mut grads, 1.0), Err(tapir::Error::UnknownParam { .. })));
    }
}
