//! W7: the Hessian-vector product of the W2 MLP's loss with respect to all its
//! parameters, `H v = ∇_θ ⟨∇_θ L, v⟩`, by reverse over reverse ([`Scope::grad_into`]
//! recorded, then differentiated again by the fast [`Scope::backward_into`], which
//! records nothing: the PyTorch peer's `autograd.grad(create_graph=True)` followed by a
//! plain `autograd.grad`), beside the loss's plain gradient from `backward_into`, so that
//! the figure is the ratio time(HVP)/time(gradient).
//! The network, batch and labels are W2's ([`crate::Mlp`]); `v` is a fixed normal vector.

use tapir::{GradBuffer, Graph, ParamId, ParamStore, Scope, Tensor, Var};

use crate::{rng, MLP_BATCH, MLP_DIMS};

/// The W2 network with a direction `v` for the Hessian-vector product.
pub struct MlpHvp {
    store: ParamStore<f32>,
    /// Weights and biases in layer order: `w0, b0, w1, b1, w2, b2`.
    ids: Vec<ParamId>,
    /// One direction tensor per parameter, in the order of `ids`.
    v: Vec<Tensor<f32>>,
    grads: GradBuffer<f32>,
    /// `H v`, one slot per parameter, written by [`hvp`](MlpHvp::hvp).
    hv: GradBuffer<f32>,
    x: Tensor<f32>,
    labels: Vec<usize>,
}

impl MlpHvp {
    /// W2's weights (Kaiming-scaled, seed 2), zero biases, batch and labels; `v` normal.
    pub fn new() -> MlpHvp {
        let mut r = rng(2);
        let mut store = ParamStore::new();
        let mut ids = Vec::new();
        for (i, w) in MLP_DIMS.windows(2).enumerate() {
            let std = (2.0 / w[0] as f32).sqrt();
            let wt = Tensor::normal(&[w[0], w[1]], 0.0, std, &mut r).expect("a valid shape");
            ids.push(store.add(format!("w{i}"), wt).expect("a fresh name"));
            ids.push(store.add(format!("b{i}"), Tensor::zeros(&[w[1]]).expect("a valid shape")).expect("a fresh name"));
        }
        let x = Tensor::normal(&[MLP_BATCH, MLP_DIMS[0]], 0.0, 1.0, &mut r).expect("a valid shape");
        let labels = (0..MLP_BATCH).map(|i| i % MLP_DIMS[3]).collect();
        let mut rv = rng(7);
        let v = ids
            .iter()
            .map(|&id| {
                let dims = store.get(id).expect("a parameter of this store").shape();
                let d: Vec<usize> = (0..dims.rank()).map(|i| dims.dim(i)).collect();
                Tensor::normal(&d, 0.0, 1.0, &mut rv).expect("a valid shape")
            })
            .collect();
        let grads = store.zeros_like().expect("a store of six tensors");
        let hv = store.zeros_like().expect("a store of six tensors");
        MlpHvp { store, ids, v, grads, hv, x, labels }
    }

    /// The loss on batch `x`, recorded in `s` on the parameter leaves `params`.
    fn loss<'s, 'g>(
        s: &'s Scope<'s, 'g, f32>,
        x: &'g Tensor<f32>,
        labels: &[usize],
        params: &[Var<'s, f32>],
    ) -> Var<'s, f32> {
        let mut h = s.input(x);
        let layers = params.len() / 2;
        for i in 0..layers {
            h = h.linear(params[2 * i], params[2 * i + 1]);
            if i + 1 < layers {
                h = h.relu();
            }
        }
        h.cross_entropy(labels)
    }

    /// The gradient of the loss into the reused buffer by `backward_into` (no update);
    /// returns the loss.
    pub fn grad(&mut self, g: &mut Graph<f32>) -> f32 {
        self.grads.zero();
        let (store, ids, x, labels, grads) = (&self.store, &self.ids, &self.x, &self.labels, &mut self.grads);
        g.scope(|s| {
            let params: Vec<Var<'_, f32>> = ids.iter().map(|&id| s.param(store, id)).collect();
            let loss = Self::loss(s, x, labels, &params);
            s.backward_into(loss, grads).expect("W7 records no error");
            loss.item().expect("a scalar")
        })
    }

    /// The Hessian-vector product `H v`, into [`hv`](MlpHvp::hv) (one slot per
    /// parameter); returns `Σ vᵀ H v` as a checksum.
    pub fn hvp(&mut self, g: &mut Graph<f32>) -> f32 {
        self.hv.zero();
        let (store, ids, x, labels, v, hv) = (&self.store, &self.ids, &self.x, &self.labels, &self.v, &mut self.hv);
        g.scope(|s| {
            let params: Vec<Var<'_, f32>> = ids.iter().map(|&id| s.param(store, id)).collect();
            let loss = Self::loss(s, x, labels, &params);
            let mut gs = params.clone();
            s.grad_into(loss, &params, &mut gs).expect("W7 records no error");
            let mut dot = (gs[0] * s.input(&v[0])).sum();
            for (g, v) in gs.iter().zip(v).skip(1) {
                dot = dot + (*g * s.input(v)).sum();
            }
            s.backward_into(dot, hv).expect("W7 records no error");
        });
        self.hv.iter().zip(&self.v).map(|((_, h), v)| dot_lanes(h.data(), v.data())).sum()
    }

    /// `H v` from the last [`hvp`](MlpHvp::hvp), one slot per parameter in layer order.
    pub fn hv(&self) -> &GradBuffer<f32> {
        &self.hv
    }
}

/// `Σ aᵢbᵢ` in 16 lanes, so that it vectorises: the checksum of 1.8 million products as
/// one sequential `f32` sum was a chain of dependent additions (about 2 ms, a serial part
/// of every timed HVP), where the PyTorch peer sums `h * v` with its own vectorised ops.
fn dot_lanes(a: &[f32], b: &[f32]) -> f32 {
    let mut lanes = [0.0f32; 16];
    let (ca, cb) = (a.chunks_exact(16), b.chunks_exact(16));
    let tail: f32 = ca.remainder().iter().zip(cb.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in ca.zip(cb) {
        for ((l, x), y) in lanes.iter_mut().zip(x).zip(y) {
            *l += x * y;
        }
    }
    lanes.iter().sum::<f32>() + tail
}

impl Default for MlpHvp {
    fn default() -> Self {
        MlpHvp::new()
    }
}
