//! Stochastic gradient descent with momentum, Nesterov momentum and weight decay, as
//! PyTorch's `torch.optim.SGD` (without dampening). Per parameter `p` with gradient `g`:
//!
//! ```text
//! g ← g + λ·p                       (weight decay λ)
//! b ← μ·b + g                       (momentum μ; b starts at 0, so b₁ = g₁)
//! g ← g + μ·b   if Nesterov, else g ← b
//! p ← p − η·g                       (learning rate η)
//! ```

use tapir::{Float, GradBuffer, ParamStore};

use rayon::prelude::*;

use crate::optim::{
    check_finite_grads, check_hyper, check_lr, check_shapes, split, zeros_of, Optimizer, Stateful, CHUNK,
};

/// SGD; see the module docs for the update.
#[derive(Debug, Clone)]
pub struct Sgd<T: Float> {
    lr: f64,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    check_finite: bool,
    store: u64,
    /// The parameters' shapes, for the velocity that [`momentum`](Sgd::momentum) allocates.
    shapes: Vec<tapir::Shape>,
    /// One buffer per parameter with momentum; none without (as PyTorch keeps no
    /// momentum buffer then): plain SGD holds no state.
    velocity: Vec<Vec<T>>,
}

impl<T: Float> Sgd<T> {
    /// Plain SGD with learning rate `lr` for the parameters of `store`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `lr` is finite (in `T` too) and
    /// non-negative; [`tapir::Error::TensorOutOfMemory`] if the state cannot be allocated.
    #[track_caller]
    pub fn new(store: &ParamStore<T>, lr: f64) -> tapir::Result<Sgd<T>> {
        check_lr::<T>("Sgd::new", lr)?;
        Ok(Sgd {
            lr,
            momentum: 0.0,
            nesterov: false,
            weight_decay: 0.0,
            check_finite: false,
            store: store.id(),
            shapes: store.iter().map(|(_, _, t)| t.shape()).collect(),
            velocity: Vec::new(),
        })
    }

    /// Sets the momentum `μ` (e.g. 0.9) and whether it is Nesterov's.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `μ` is finite and non-negative, and
    /// positive for Nesterov (as in PyTorch).
    #[track_caller]
    pub fn momentum(mut self, momentum: f64, nesterov: bool) -> tapir::Result<Self> {
        self.momentum = check_hyper::<T>("Sgd::momentum", "momentum", momentum, 0.0..)?;
        if nesterov && momentum == 0.0 {
            return Err(crate::invalid("Sgd::momentum", "Nesterov momentum needs a positive momentum".into()));
        }
        self.nesterov = nesterov;
        if momentum > 0.0 && self.velocity.is_empty() {
            self.velocity = zeros_of("Sgd::momentum", &self.shapes)?;
        }
        Ok(self)
    }

    /// Sets the L2 weight decay `λ`, added to the gradient.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `λ` is finite and non-negative.
    #[track_caller]
    pub fn weight_decay(mut self, weight_decay: f64) -> tapir::Result<Self> {
        self.weight_decay = check_hyper::<T>("Sgd::weight_decay", "weight decay", weight_decay, 0.0..)?;
        Ok(self)
    }

    /// Opt-in: when on, [`Optimizer::step`] fails with [`tapir::Error::NonFinite`] on a
    /// NaN or infinite gradient instead of writing it into the parameters (it costs one
    /// pass over the gradients).
    #[must_use]
    pub fn check_finite(mut self, on: bool) -> Self {
        self.check_finite = on;
        self
    }
}

impl<T: Float> Optimizer<T> for Sgd<T> {
    #[track_caller]
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()> {
        check_lr::<T>("Sgd::step", self.lr)?;
        check_shapes("Sgd::step", store, grads, Some((self.store, &self.velocity)))?;
        if self.check_finite {
            check_finite_grads("Sgd::step", store, grads)?;
        }
        let (lr, mu, wd) = (T::from_f64(self.lr), T::from_f64(self.momentum), T::from_f64(self.weight_decay));
        let nesterov = self.nesterov;
        let with_momentum = |p: &mut [T], g: &[T], buf: &mut [T]| {
            for ((p, &g), b) in p.iter_mut().zip(g).zip(buf.iter_mut()) {
                let g = g + wd * *p;
                *b = mu * *b + g;
                *p -= lr * if nesterov { g + mu * *b } else { *b };
            }
        };
        let plain = |p: &mut [T], g: &[T]| {
            for (p, &g) in p.iter_mut().zip(g) {
                *p -= lr * (g + wd * *p);
            }
        };
        if self.momentum != 0.0 {
            for (((_, p), buf), (_, g)) in store.iter_mut().zip(&mut self.velocity).zip(grads.iter()) {
                let (p, g) = (p.data_mut(), g.data());
                if split(p.len()) {
                    p.par_chunks_mut(CHUNK)
                        .zip(g.par_chunks(CHUNK))
                        .zip(buf.par_chunks_mut(CHUNK))
                        .for_each(|((p, g), b)| with_momentum(p, g, b));
                } else {
                    with_momentum(p, g, buf);
                }
            }
        } else {
            for ((_, p), (_, g)) in store.iter_mut().zip(grads.iter()) {
                let (p, g) = (p.data_mut(), g.data());
                if split(p.len()) {
                    p.par_chunks_mut(CHUNK).zip(g.par_chunks(CHUNK)).for_each(|(p, g)| plain(p, g));
                } else {
                    plain(p, g);
                }
            }
        }
        Ok(())
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
}

impl<T: Float> Stateful<T> for Sgd<T> {
    fn kind(&self) -> &'static str {
        "Sgd"
    }

    fn step_count(&self) -> u64 {
        0
    }

    fn set_step_count(&mut self, _steps: u64) {}

    /// `"velocity"` with momentum; nothing without.
    fn buffers(&self) -> Vec<(&'static str, &[Vec<T>])> {
        if self.velocity.is_empty() {
            return Vec::new();
        }
        vec![("velocity", &self.velocity)]
    }

    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut [Vec<T>])> {
        if self.velocity.is_empty() {
            return Vec::new();
        }
        vec![("velocity", &mut self.velocity)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::Tensor;

    fn one_param(v: f64) -> (ParamStore<f64>, GradBuffer<f64>, tapir::ParamId) {
        let mut store = ParamStore::new();
        let id = store.add("p", Tensor::from_vec(vec![v], &[1]).unwrap()).unwrap();
        let grads = store.zeros_like().unwrap();
        (store, grads, id)
    }

    /// Runs `steps` updates of `f(p) = p²/2` (gradient `p`) on a copy of `store` (a clone
    /// keeps the store's identity, so the optimizer made for `store` accepts it).
    fn run(store: &ParamStore<f64>, opt: &mut dyn Optimizer<f64>, steps: usize) -> Vec<f64> {
        let mut store = store.clone();
        let id = store.find("p").unwrap();
        let mut out = Vec::new();
        for _ in 0..steps {
            let mut grads = store.zeros_like().unwrap();
            let mut g = tapir::Graph::new();
            g.scope(|s| {
                let x = s.param(&store, id);
                s.backward_into((x * x).sum() * 0.5, &mut grads).unwrap();
            });
            opt.step(&mut store, &grads).unwrap();
            out.push(store.get(id).unwrap().data()[0]);
        }
        out
    }

    /// Plain SGD keeps no state (as PyTorch keeps no momentum buffer); momentum allocates
    /// one buffer per parameter, shaped like it.
    #[test]
    fn only_momentum_holds_state() {
        let (store, _, _) = one_param(1.0);
        assert!(Sgd::new(&store, 0.1).unwrap().buffers().is_empty());
        let with = Sgd::new(&store, 0.1).unwrap().momentum(0.9, false).unwrap();
        let buffers = with.buffers();
        assert_eq!(buffers.len(), 1);
        assert_eq!((buffers[0].0, buffers[0].1.len(), buffers[0].1[0].len()), ("velocity", 1, 1));
    }

    #[test]
    fn matches_pytorch_by_hand() {
        let (store, _, _) = one_param(1.0);
        // Plain: p ← p − 0.1·p.
        assert_eq!(run(&store, &mut Sgd::new(&store, 0.1).unwrap(), 2), [0.9, 0.81]);
        // Momentum 0.9: b₁ = 1, p₁ = 0.9; b₂ = 0.9 + 0.9 = 1.8, p₂ = 0.9 − 0.18 = 0.72.
        let got = run(&store, &mut Sgd::new(&store, 0.1).unwrap().momentum(0.9, false).unwrap(), 2);
        assert!((got[0] - 0.9).abs() < 1e-12 && (got[1] - 0.72).abs() < 1e-12, "{got:?}");
        // Nesterov: b₁ = 1, g = 1 + 0.9 = 1.9, p₁ = 0.81; b₂ = 0.9 + 0.81 = 1.71,
        // g = 0.81 + 1.539 = 2.349, p₂ = 0.81 − 0.2349 = 0.5751.
        let got = run(&store, &mut Sgd::new(&store, 0.1).unwrap().momentum(0.9, true).unwrap(), 2);
        assert!((got[0] - 0.81).abs() < 1e-12 && (got[1] - 0.5751).abs() < 1e-12, "{got:?}");
        // Weight decay 1: g = p + p, p₁ = 1 − 0.2 = 0.8.
        assert!(
            (run(&store, &mut Sgd::new(&store, 0.1).unwrap().weight_decay(1.0).unwrap(), 1)[0] - 0.8).abs() < 1e-12
        );
    }

    #[test]
    fn mismatched_gradients_change_nothing() {
        let (mut store, _, id) = one_param(1.0);
        let mut opt = Sgd::new(&store, 0.1).unwrap();
        let empty = ParamStore::<f64>::new().zeros_like().unwrap();
        let e = opt.step(&mut store, &empty).unwrap_err();
        assert!(matches!(e, tapir::Error::WrongStore { op: "Sgd::step", .. }), "{e}");
        assert_eq!(store.get(id).unwrap().data()[0], 1.0);
        assert!(Sgd::new(&store, f64::NAN).is_err());
        let grads = store.zeros_like().unwrap();
        opt.set_lr(f64::NAN);
        assert!(opt.step(&mut store, &grads).is_err());
    }
}
