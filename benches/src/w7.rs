//! W7: the Hessian-vector product of the W2 MLP's loss with respect to all its
//! parameters, `H v = ∇_θ ⟨∇_θ L, v⟩`, by reverse over reverse ([`Scope::grad_into`]
//! recorded, then differentiated again), beside the loss's plain gradient from the fast
//! [`Scope::backward_into`] path, so that the figure is the ratio time(HVP)/time(gradient).
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
        MlpHvp { store, ids, v, grads, x, labels }
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

    /// The Hessian-vector product `H v`, written into `out` (one vector per parameter, in
    /// layer order); returns `Σ vᵀ H v` as a checksum.
    pub fn hvp(&self, g: &mut Graph<f32>, out: &mut [Vec<f32>]) -> f32 {
        g.scope(|s| {
            let params: Vec<Var<'_, f32>> = self.ids.iter().map(|&id| s.param(&self.store, id)).collect();
            let loss = Self::loss(s, &self.x, &self.labels, &params);
            let mut gs = params.clone();
            s.grad_into(loss, &params, &mut gs).expect("W7 records no error");
            let mut dot = (gs[0] * s.input(&self.v[0])).sum();
            for (g, v) in gs.iter().zip(&self.v).skip(1) {
                dot = dot + (*g * s.input(v)).sum();
            }
            let mut hv = params.clone();
            s.grad_into(dot, &params, &mut hv).expect("W7 records no error");
            let mut check = 0.0;
            for ((o, h), v) in out.iter_mut().zip(&hv).zip(&self.v) {
                let h = h.value().expect("W7 records no error");
                o.clear();
                o.extend_from_slice(h);
                check += dot_lanes(h, v.data());
            }
            check
        })
    }

    /// Buffers for [`hvp`](MlpHvp::hvp)'s output.
    pub fn out(&self) -> Vec<Vec<f32>> {
        self.v.iter().map(|v| Vec::with_capacity(v.numel())).collect()
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
