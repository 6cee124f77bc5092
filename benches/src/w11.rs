//! W11: the digits CNN of tapir-nn's `train_digits --cnn`, one training step at batch
//! [`W11_BATCH`]: `[B, 1, 8, 8]` → conv 3×3 (padding 1) → 16 channels → ReLU → max-pool 2
//! → conv 3×3 (padding 1) → 32 channels → ReLU → max-pool 2 → flatten `[B, 128]` →
//! linear → 10 classes; cross-entropy on labels `i mod 10`, inputs from a seeded normal,
//! one SGD step. It measures convolution (im2col/col2im), pooling and their backward,
//! which the other workloads do not.

use rand::SeedableRng;
use tapir::{GradBuffer, Graph, ParamStore, Tensor};
use tapir_nn::optim::{Optimizer, Sgd};
use tapir_nn::{Activation, Conv2d, Ctx, Flatten, Linear, MaxPool2d, Module, Sequential};

/// Batch size.
pub const W11_BATCH: usize = 256;
/// Learning rate of the SGD step.
const W11_LR: f32 = 0.01;

/// The W11 model, its batch and its gradient buffer.
pub struct CnnStep {
    store: ParamStore<f32>,
    model: Sequential<f32>,
    grads: GradBuffer<f32>,
    sgd: Sgd<f32>,
    x: Tensor<f32>,
    labels: Vec<usize>,
}

impl CnnStep {
    /// The `train_digits --cnn` model with seeded weights, a normal batch of 8×8 images.
    pub fn new() -> CnnStep {
        let mut r = rand::rngs::StdRng::seed_from_u64(11);
        let mut store = ParamStore::new();
        let model = Sequential::new()
            .push(Conv2d::new(&mut store, "conv1", 1, 16, [3, 3], &mut r).expect("a valid layer").padding([1, 1]))
            .push(Activation::Relu)
            .push(MaxPool2d::new(2))
            .push(Conv2d::new(&mut store, "conv2", 16, 32, [3, 3], &mut r).expect("a valid layer").padding([1, 1]))
            .push(Activation::Relu)
            .push(MaxPool2d::new(2))
            .push(Flatten)
            .push(Linear::new(&mut store, "fc", 128, 10, &mut r).expect("a valid layer"));
        let x = Tensor::normal(&[W11_BATCH, 1, 8, 8], 0.0, 1.0, &mut r).expect("a valid shape");
        let labels = (0..W11_BATCH).map(|i| i % 10).collect();
        let grads = store.zeros_like().expect("room for the gradients");
        let sgd = Sgd::new(&store, W11_LR.into()).expect("a valid learning rate");
        CnnStep { store, model, grads, sgd, x, labels }
    }

    /// One step: forward, cross-entropy, backward into the gradient buffer, SGD in place.
    /// Returns the loss.
    pub fn step(&mut self, g: &mut Graph<f32>) -> f32 {
        self.grads.zero();
        let (store, model, grads, x, labels) = (&self.store, &self.model, &mut self.grads, &self.x, &self.labels);
        let loss = g.scope(|s| {
            let loss = model.forward(Ctx::train(s, store), s.input(x)).cross_entropy(labels);
            s.backward_into(loss, grads).expect("W11 records no error");
            loss.item().expect("a scalar")
        });
        self.sgd.step(&mut self.store, &self.grads).expect("the store the optimizer was made for");
        loss
    }
}

impl Default for CnnStep {
    fn default() -> Self {
        Self::new()
    }
}
