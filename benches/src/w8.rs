//! W8: a deep MLP whose activations dominate its weights, trained with and without
//! gradient checkpointing. Input width 256, [`W8_HIDDEN`] hidden layers of width 256 with
//! ReLU, 256 classes, batch 4096 (one activation is 4 MiB), cross-entropy on labels
//! `i mod 256`, inputs from a seeded normal, one SGD step. Checkpointed, every
//! [`W8_EVERY`] hidden layers form one [`Scope::checkpoint`](tapir::Scope::checkpoint).

use tapir::{Checkpoint, GradBuffer, Graph, ParamId, ParamStore, Scope, Tensor, Var};
use tapir_nn::optim::{Optimizer, Sgd};

/// Width of the input, of every hidden layer and of the output (classes).
pub const W8_WIDTH: usize = 256;
/// Hidden layers.
pub const W8_HIDDEN: usize = 32;
/// Batch size.
pub const W8_BATCH: usize = 4096;
/// Hidden layers per checkpoint.
pub const W8_EVERY: usize = 4;
/// Learning rate of the SGD step.
pub const W8_LR: f32 = 0.01;

/// The W8 model, its batch and its gradient buffer.
pub struct DeepMlp {
    store: ParamStore<f32>,
    /// `W8_HIDDEN` hidden layers, then the output layer.
    layers: Vec<(ParamId, ParamId)>,
    grads: GradBuffer<f32>,
    sgd: Sgd<f32>,
    x: Tensor<f32>,
    labels: Vec<usize>,
    checkpoint: bool,
}

/// Hidden layers `W8_EVERY·part ..` as one checkpointed block.
struct Group<'a> {
    store: &'a ParamStore<f32>,
    layers: &'a [(ParamId, ParamId)],
}

impl Checkpoint<f32> for Group<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], part: u32) -> Var<'c, f32> {
        let start = part as usize * W8_EVERY;
        layers(s, self.store, &self.layers[start..start + W8_EVERY], x[0])
    }
}

/// `relu(h·W + b)` for each layer.
fn layers<'s, 'g>(
    s: &'s Scope<'s, 'g, f32>,
    store: &'g ParamStore<f32>,
    layers: &[(ParamId, ParamId)],
    mut h: Var<'s, f32>,
) -> Var<'s, f32> {
    for &(w, b) in layers {
        h = h.linear(s.param(store, w), s.param(store, b)).relu();
    }
    h
}

impl DeepMlp {
    /// Kaiming-scaled weights, zero biases, a normal batch; `checkpoint` every
    /// [`W8_EVERY`] hidden layers or not.
    pub fn new(checkpoint: bool) -> DeepMlp {
        let mut r = crate::rng(8);
        let mut store = ParamStore::new();
        let mut layers = Vec::new();
        let std = (2.0 / W8_WIDTH as f32).sqrt();
        for i in 0..=W8_HIDDEN {
            let w = Tensor::normal(&[W8_WIDTH, W8_WIDTH], 0.0, std, &mut r).expect("a valid shape");
            let w = store.add(format!("w{i}"), w).expect("a fresh name");
            let b =
                store.add(format!("b{i}"), Tensor::zeros(&[W8_WIDTH]).expect("a valid shape")).expect("a fresh name");
            layers.push((w, b));
        }
        let x = Tensor::normal(&[W8_BATCH, W8_WIDTH], 0.0, 1.0, &mut r).expect("a valid shape");
        let labels = (0..W8_BATCH).map(|i| i % W8_WIDTH).collect();
        let grads = store.zeros_like().expect("room for the gradients");
        let sgd = Sgd::new(&store, W8_LR.into()).expect("a valid learning rate");
        DeepMlp { store, layers, grads, sgd, x, labels, checkpoint }
    }

    /// One step: forward, cross-entropy, backward into the gradient buffer, SGD in place.
    /// Returns the loss.
    pub fn step(&mut self, g: &mut Graph<f32>) -> f32 {
        self.grads.zero();
        let (store, all, grads, x, labels) = (&self.store, &self.layers, &mut self.grads, &self.x, &self.labels);
        let (hidden, out) = all.split_at(W8_HIDDEN);
        let group = Group { store, layers: hidden };
        let checkpoint = self.checkpoint;
        let loss = g.scope(|s| {
            let mut h = s.input(x);
            if checkpoint {
                for part in 0..(W8_HIDDEN / W8_EVERY) as u32 {
                    h = s.checkpoint_part(&group, part, &[h]);
                }
            } else {
                h = layers(s, store, hidden, h);
            }
            let (w, b) = out[0];
            let loss = h.linear(s.param(store, w), s.param(store, b)).cross_entropy(labels);
            s.backward_into(loss, grads).expect("W8 records no error");
            loss.item().expect("a scalar")
        });
        self.sgd.step(&mut self.store, &self.grads).expect("the store the optimizer was made for");
        loss
    }
}
