//! Adam (Kingma and Ba, 2015) and AdamW (Loshchilov and Hutter, 2019), as PyTorch's
//! `torch.optim.Adam` and `AdamW`. Per parameter `p` with gradient `g`, at step `t ≥ 1`:
//!
//! ```text
//! Adam:   g ← g + λ·p                          (L2 penalty in the gradient)
//! AdamW:  p ← p − η·λ·p                        (decoupled weight decay)
//! m ← β₁·m + (1 − β₁)·g
//! v ← β₂·v + (1 − β₂)·g²
//! p ← p − η · (m/(1 − β₁ᵗ)) / (√(v/(1 − β₂ᵗ)) + ε)
//! ```

use tapir::{Float, GradBuffer, ParamStore};

use rayon::prelude::*;

use crate::optim::{
    check_finite_grads, check_hyper, check_lr, check_shapes, next_step, split, zeros_like, Optimizer, Stateful, CHUNK,
};

/// Adam, with optional L2 weight decay; defaults `β = (0.9, 0.999)`, `ε = 1e-8`, `λ = 0`.
#[derive(Debug, Clone)]
pub struct Adam<T: Float> {
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
    decoupled: bool,
    check_finite: bool,
    t: u64,
    store: u64,
    m: Vec<Vec<T>>,
    v: Vec<Vec<T>>,
}

impl<T: Float> Adam<T> {
    /// Adam with learning rate `lr` for the parameters of `store`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `lr` is finite (in `T` too) and
    /// non-negative; [`tapir::Error::TensorOutOfMemory`] if the moments cannot be allocated.
    #[track_caller]
    pub fn new(store: &ParamStore<T>, lr: f64) -> tapir::Result<Adam<T>> {
        Self::make("Adam::new", store, lr, 0.0, false)
    }

    #[track_caller]
    fn make(
        op: &'static str,
        store: &ParamStore<T>,
        lr: f64,
        weight_decay: f64,
        decoupled: bool,
    ) -> tapir::Result<Self> {
        check_lr::<T>(op, lr)?;
        let weight_decay = check_hyper::<T>(op, "weight decay", weight_decay, 0.0..)?;
        Ok(Adam {
            lr,
            betas: (0.9, 0.999),
            eps: 1e-8,
            weight_decay,
            decoupled,
            check_finite: false,
            t: 0,
            store: store.id(),
            m: zeros_like(op, store)?,
            v: zeros_like(op, store)?,
        })
    }

    /// Sets `β₁` and `β₂`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless both are in `[0, 1)`.
    #[track_caller]
    pub fn betas(mut self, beta1: f64, beta2: f64) -> tapir::Result<Self> {
        let b1 = check_hyper::<T>("Adam::betas", "beta1", beta1, 0.0..1.0)?;
        let b2 = check_hyper::<T>("Adam::betas", "beta2", beta2, 0.0..1.0)?;
        self.betas = (b1, b2);
        Ok(self)
    }

    /// Sets `ε`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `ε` is finite and non-negative.
    #[track_caller]
    pub fn eps(mut self, eps: f64) -> tapir::Result<Self> {
        self.eps = check_hyper::<T>("Adam::eps", "eps", eps, 0.0..)?;
        Ok(self)
    }

    /// Sets the L2 weight decay `λ`, added to the gradient.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `λ` is finite and non-negative.
    #[track_caller]
    pub fn weight_decay(mut self, weight_decay: f64) -> tapir::Result<Self> {
        self.weight_decay = check_hyper::<T>("Adam::weight_decay", "weight decay", weight_decay, 0.0..)?;
        Ok(self)
    }

    /// Opt-in: when on, [`Optimizer::step`] fails with [`tapir::Error::NonFinite`] on a
    /// NaN or infinite gradient instead of writing it into the parameters and moments.
    #[must_use]
    pub fn check_finite(mut self, on: bool) -> Self {
        self.check_finite = on;
        self
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.t
    }

    #[track_caller]
    fn update(&mut self, op: &'static str, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()> {
        check_lr::<T>(op, self.lr)?;
        check_shapes(op, store, grads, Some((self.store, &self.m)))?;
        if self.check_finite {
            check_finite_grads(op, store, grads)?;
        }
        let (b1, b2) = self.betas;
        self.t = next_step(op, self.t)?;
        let t = self.t.min(i32::MAX as u64) as i32;
        let (c1, c2) = (1.0 - b1.powi(t), 1.0 - b2.powi(t));
        // Fold the bias corrections into the step size and ε:
        // η·(m/c1)/(√(v/c2) + ε) = (η·√c2/c1)·m/(√v + ε·√c2).
        let step = T::from_f64(self.lr * c2.sqrt() / c1);
        let eps = T::from_f64(self.eps * c2.sqrt());
        let (b1, b2) = (T::from_f64(b1), T::from_f64(b2));
        let (one_b1, one_b2) = (T::ONE - b1, T::ONE - b2);
        let wd = T::from_f64(self.weight_decay);
        let shrink = T::ONE - T::from_f64(self.lr * self.weight_decay);
        let decoupled = self.decoupled;
        let update = |p: &mut [T], g: &[T], m: &mut [T], v: &mut [T]| {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                let g = if decoupled {
                    *p *= shrink;
                    g
                } else {
                    g + wd * *p
                };
                *m = b1 * *m + one_b1 * g;
                *v = b2 * *v + one_b2 * g * g;
                *p -= step * *m / (v.sqrt() + eps);
            }
        };
        for ((((_, p), m), v), (_, g)) in store.iter_mut().zip(&mut self.m).zip(&mut self.v).zip(grads.iter()) {
            let (p, g) = (p.data_mut(), g.data());
            if split(p.len()) {
                p.par_chunks_mut(CHUNK)
                    .zip(g.par_chunks(CHUNK))
                    .zip(m.par_chunks_mut(CHUNK))
                    .zip(v.par_chunks_mut(CHUNK))
                    .for_each(|(((p, g), m), v)| update(p, g, m, v));
            } else {
                update(p, g, m, v);
            }
        }
        Ok(())
    }
}

impl<T: Float> Optimizer<T> for Adam<T> {
    #[track_caller]
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()> {
        self.update("Adam::step", store, grads)
    }

    fn lr(&self) -> f64 {
        self.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.lr = lr;
    }
}

/// AdamW: Adam with decoupled weight decay (default `λ = 0.01`, as in PyTorch).
#[derive(Debug, Clone)]
pub struct AdamW<T: Float>(Adam<T>);

impl<T: Float> AdamW<T> {
    /// AdamW with learning rate `lr` and weight decay `weight_decay`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless both are finite (in `T` too) and
    /// non-negative; [`tapir::Error::TensorOutOfMemory`] if the moments cannot be allocated.
    #[track_caller]
    pub fn new(store: &ParamStore<T>, lr: f64, weight_decay: f64) -> tapir::Result<AdamW<T>> {
        Ok(AdamW(Adam::make("AdamW::new", store, lr, weight_decay, true)?))
    }

    /// Sets `β₁` and `β₂`.
    ///
    /// # Errors
    /// As [`Adam::betas`].
    #[track_caller]
    pub fn betas(self, beta1: f64, beta2: f64) -> tapir::Result<Self> {
        Ok(AdamW(self.0.betas(beta1, beta2)?))
    }

    /// Sets `ε`.
    ///
    /// # Errors
    /// As [`Adam::eps`].
    #[track_caller]
    pub fn eps(self, eps: f64) -> tapir::Result<Self> {
        Ok(AdamW(self.0.eps(eps)?))
    }

    /// Opt-in check of the gradients' finiteness; see [`Adam::check_finite`].
    #[must_use]
    pub fn check_finite(self, on: bool) -> Self {
        AdamW(self.0.check_finite(on))
    }

    /// Steps taken so far.
    pub fn steps(&self) -> u64 {
        self.0.t
    }
}

impl<T: Float> Optimizer<T> for AdamW<T> {
    #[track_caller]
    fn step(&mut self, store: &mut ParamStore<T>, grads: &GradBuffer<T>) -> tapir::Result<()> {
        self.0.update("AdamW::step", store, grads)
    }

    fn lr(&self) -> f64 {
        self.0.lr
    }

    fn set_lr(&mut self, lr: f64) {
        self.0.lr = lr;
    }
}

impl<T: Float> Stateful<T> for Adam<T> {
    fn kind(&self) -> &'static str {
        if self.decoupled {
            "AdamW"
        } else {
            "Adam"
        }
    }

    fn step_count(&self) -> u64 {
        self.t
    }

    fn set_step_count(&mut self, steps: u64) {
        self.t = steps;
    }

    fn buffers(&self) -> Vec<(&'static str, &[Vec<T>])> {
        vec![("m", &self.m), ("v", &self.v)]
    }

    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut [Vec<T>])> {
        vec![("m", &mut self.m), ("v", &mut self.v)]
    }
}

impl<T: Float> Stateful<T> for AdamW<T> {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }

    fn step_count(&self) -> u64 {
        self.0.t
    }

    fn set_step_count(&mut self, steps: u64) {
        self.0.t = steps;
    }

    fn buffers(&self) -> Vec<(&'static str, &[Vec<T>])> {
        self.0.buffers()
    }

    fn buffers_mut(&mut self) -> Vec<(&'static str, &mut [Vec<T>])> {
        self.0.buffers_mut()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::{Graph, Tensor};

    /// Steps `opt` on `f(p) = Σ (p − c)²` from `p = 0` and returns the final `p`.
    fn minimise(opt: &mut dyn Optimizer<f64>, store: &mut ParamStore<f64>, steps: usize) -> Vec<f64> {
        let c = Tensor::from_vec(vec![1.0, -2.0, 3.0], &[3]).unwrap();
        let id = store.find("p").unwrap();
        let mut grads = store.zeros_like().unwrap();
        let mut g = Graph::new();
        for _ in 0..steps {
            grads.zero();
            g.scope(|s| {
                let l = (s.param(store, id) - s.input(&c)).square().sum();
                s.backward_into(l, &mut grads).unwrap();
            });
            opt.step(store, &grads).unwrap();
        }
        store.get(id).unwrap().data().to_vec()
    }

    fn store() -> ParamStore<f64> {
        let mut s = ParamStore::new();
        s.add("p", Tensor::zeros(&[3]).unwrap()).unwrap();
        s
    }

    #[test]
    fn first_adam_step_is_lr_times_sign() {
        // After one step m̂ = g and v̂ = g², so the update is η·g/(|g| + ε) ≈ η·sign(g).
        let mut s = store();
        let p = minimise(&mut Adam::new(&s.clone(), 0.1).unwrap(), &mut s, 1);
        for (got, want) in p.iter().zip([0.1, -0.1, 0.1]) {
            assert!((got - want).abs() < 1e-6, "{p:?}");
        }
    }

    #[test]
    fn adam_and_adamw_converge() {
        let mut s = store();
        let p = minimise(&mut Adam::new(&s.clone(), 0.1).unwrap(), &mut s, 500);
        assert!(p.iter().zip([1.0, -2.0, 3.0]).all(|(a, b)| (a - b).abs() < 1e-3), "{p:?}");
        // Decoupled decay pulls the minimum towards 0 a little: p* solves 2(p − c)·(η/…) ...
        // so check only that it ends close to, and inside, the undecayed minimum.
        let mut s = store();
        let p = minimise(&mut AdamW::new(&s.clone(), 0.1, 0.01).unwrap(), &mut s, 500);
        assert!(p.iter().zip([1.0, -2.0, 3.0]).all(|(a, b)| (a - b).abs() < 0.1 && a.abs() < b.abs()), "{p:?}");
    }

    #[test]
    fn bad_betas_are_errors() {
        let s = store();
        let e = Adam::new(&s, 0.1).unwrap().betas(1.0, 0.999).unwrap_err();
        assert!(matches!(e, tapir::Error::InvalidArgument { op: "Adam::betas", .. }), "{e}");
    }
}
