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

use crate::optim::{check_lr, check_shapes, zeros_like, Optimizer, Stateful};

/// SGD; see the module docs for the update.
#[derive(Debug, Clone)]
pub struct Sgd<T: Float> {
    lr: f64,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
    velocity: Vec<Vec<T>>,
}

impl<T: Float> Sgd<T> {
    /// Plain SGD with learning rate `lr` for the parameters of `store`.
    pub fn new(store: &ParamStore<T>, lr: f64) -> Sgd<T> {
        Sgd { lr, momentum: 0.0, nesterov: false, weight_decay: 0.0, velocity: zeros_like(store) }
    }

    /// Sets the momentum `μ` (e.g. 0.9) and whether it is Nesterov's.
    #[must_use]
    pub fn momentum(mut self, momentum: f64, nesterov: bool) -> Self {
        self.momentum = momentum;
        self.nesterov = nesterov;
        self
    }

    /// Sets the L2 weight decay `λ`, added to the gradient.
    #[must_use]
    pub fn weight_decay(mut self, weight_decay: f64) -> Self {
        self.weight_decay = weight_decay;
        self
    }
}

impl<T: Float> Optimizer<T> for Sgd<T> {
    #[track_caller]
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()> {
        check_lr("Sgd::step", self.lr)?;
        check_shapes("Sgd::step", store, grads, Some(&self.velocity))?;
        let (lr, mu, wd) = (T::from_f64(self.lr), T::from_f64(self.momentum), T::from_f64(self.weight_decay));
        for ((id, p), buf) in store.iter_mut().zip(&mut self.velocity) {
            let g = grads.get(id).expect("check_shapes saw every parameter's gradient").data();
            for ((p, &g), b) in p.data_mut().iter_mut().zip(g).zip(buf.iter_mut()) {
                let mut g = g + wd * *p;
                if self.momentum != 0.0 {
                    *b = mu * *b + g;
                    g = if self.nesterov { g + mu * *b } else { *b };
                }
                *p -= lr * g;
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

    fn buffers(&self) -> Vec<(&'static str, &[Vec<T>])> {
        vec![("velocity", &self.velocity)]
    }

    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut [Vec<T>])> {
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
        let grads = store.zeros_like();
        (store, grads, id)
    }

    /// Runs `steps` updates of `f(p) = p²/2` (gradient `p`), computing the gradient by hand.
    fn run(opt: &mut dyn Optimizer<f64>, steps: usize) -> Vec<f64> {
        let (mut store, _, id) = one_param(1.0);
        let mut out = Vec::new();
        for _ in 0..steps {
            let p = store.get(id).unwrap().data()[0];
            let mut s2 = ParamStore::new();
            s2.add("p", Tensor::from_vec(vec![p], &[1]).unwrap()).unwrap();
            let mut grads = s2.zeros_like();
            let mut g = tapir::Graph::new();
            g.scope(|s| {
                let x = s.param(&s2, id);
                s.backward_into((x * x).sum() * 0.5, &mut grads).unwrap();
            });
            opt.step(&mut store, &grads).unwrap();
            out.push(store.get(id).unwrap().data()[0]);
        }
        out
    }

    #[test]
    fn matches_pytorch_by_hand() {
        let (store, _, _) = one_param(1.0);
        // Plain: p ← p − 0.1·p.
        assert_eq!(run(&mut Sgd::new(&store, 0.1), 2), [0.9, 0.81]);
        // Momentum 0.9: b₁ = 1, p₁ = 0.9; b₂ = 0.9 + 0.9 = 1.8, p₂ = 0.9 − 0.18 = 0.72.
        let got = run(&mut Sgd::new(&store, 0.1).momentum(0.9, false), 2);
        assert!((got[0] - 0.9).abs() < 1e-12 && (got[1] - 0.72).abs() < 1e-12, "{got:?}");
        // Nesterov: b₁ = 1, g = 1 + 0.9 = 1.9, p₁ = 0.81; b₂ = 0.9 + 0.81 = 1.71,
        // g = 0.81 + 1.539 = 2.349, p₂ = 0.81 − 0.2349 = 0.5751.
        let got = run(&mut Sgd::new(&store, 0.1).momentum(0.9, true), 2);
        assert!((got[0] - 0.81).abs() < 1e-12 && (got[1] - 0.5751).abs() < 1e-12, "{got:?}");
        // Weight decay 1: g = p + p, p₁ = 1 − 0.2 = 0.8.
        assert!((run(&mut Sgd::new(&store, 0.1).weight_decay(1.0), 1)[0] - 0.8).abs() < 1e-12);
    }

    #[test]
    fn mismatched_gradients_change_nothing() {
        let (mut store, _, id) = one_param(1.0);
        let mut opt = Sgd::new(&store, 0.1);
        let empty = ParamStore::<f64>::new().zeros_like();
        let e = opt.step(&mut store, &empty).unwrap_err();
        assert!(e.to_string().contains("1 parameters but the gradients 0"), "{e}");
        assert_eq!(store.get(id).unwrap().data()[0], 1.0);
        let mut bad_lr = Sgd::new(&store, f64::NAN);
        let grads = store.zeros_like();
        assert!(bad_lr.step(&mut store, &grads).is_err());
    }
}
