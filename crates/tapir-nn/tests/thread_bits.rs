//! A whole training step gives the same bits whatever the graph's thread count: large
//! elementwise ops, reductions and the loss split into chunks fixed by the shapes, and
//! faer's GEMM does not change its sums when a product is split by output blocks (see
//! `crates/tapir/src/kernels/par.rs` and `kernels/matmul.rs`).

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::optim::{Adam, Optimizer};
use tapir_nn::{Activation, Conv2d, Ctx, Flatten, LayerNorm, Linear, MaxPool2d, Mlp, Module, Sequential};

/// Builds a model's parameters into a store and returns the model.
type Build = dyn Fn(&mut ParamStore<f32>) -> Box<dyn Module<f32>>;

/// Trains a fresh copy of `build`'s model on a batch of shape `input` (128 rows of 64
/// values) for `steps` Adam steps at `threads` threads and returns every parameter's bits
/// and every loss's bits.
fn train(threads: usize, steps: usize, input: &[usize], build: &Build) -> Vec<u32> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut store = ParamStore::<f32>::new();
    let model = build(&mut store);
    let x = Tensor::<f32>::normal(input, 0.0, 1.0, &mut rng).unwrap();
    let labels: Vec<usize> = (0..128).map(|i| (i * 7) % 10).collect();
    let mut adam = Adam::new(&store, 1e-2).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    assert_eq!(graph.set_threads(threads), threads);
    let mut bits = Vec::new();
    for _ in 0..steps {
        grads.zero();
        let store_ref = &store;
        let loss = graph
            .scope(|s| {
                let logits = model.forward(Ctx::train(s, store_ref), s.input(&x));
                // A log-softmax and a mean over the batch as well as the fused loss.
                let extra = logits.log_softmax(-1).square().mean() * 1e-3;
                let loss = logits.cross_entropy(&labels) + extra;
                s.backward_into(loss, &mut grads)?;
                loss.item()
            })
            .unwrap();
        bits.push(loss.to_bits());
        adam.step(&mut store, &grads).unwrap();
    }
    for (_, _, t) in store.iter() {
        bits.extend(t.data().iter().map(|v| v.to_bits()));
    }
    bits
}

#[test]
fn training_steps_give_the_same_bits_at_1_2_4_and_16_threads() {
    // The MLP: 64-256-128-10, batch 128 (its 128×256 activations are split).
    let mlp = |store: &mut ParamStore<f32>| -> Box<dyn Module<f32>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        Box::new(Mlp::builder(64).hidden(256).hidden(128).output(10).build(store, "mlp", &mut rng).unwrap())
    };
    // LayerNorm and GELU on the same activations.
    let norm = |store: &mut ParamStore<f32>| -> Box<dyn Module<f32>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        Box::new(
            Sequential::new()
                .push(Linear::new(store, "fc1", 64, 512, &mut rng).unwrap())
                .push(LayerNorm::new(store, "ln", 512).unwrap())
                .push(Activation::Gelu)
                .push(Linear::new(store, "fc2", 512, 10, &mut rng).unwrap()),
        )
    };
    // The digits CNN (W11's model) on 8×8 images: im2col, products with the weights
    // broadcast over the images (their gradients summed in groups), pooling.
    let cnn = |store: &mut ParamStore<f32>| -> Box<dyn Module<f32>> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        Box::new(
            Sequential::new()
                .push(Conv2d::new(store, "conv1", 1, 16, [3, 3], &mut rng).unwrap().padding([1, 1]))
                .push(Activation::Relu)
                .push(MaxPool2d::new(2))
                .push(Conv2d::new(store, "conv2", 16, 32, [3, 3], &mut rng).unwrap().padding([1, 1]))
                .push(Activation::Relu)
                .push(MaxPool2d::new(2))
                .push(Flatten)
                .push(Linear::new(store, "fc", 128, 10, &mut rng).unwrap()),
        )
    };
    let (rows, images) = (&[128, 64][..], &[128, 1, 8, 8][..]);
    for (name, input, build) in [("mlp", rows, &mlp as &Build), ("layernorm", rows, &norm), ("cnn", images, &cnn)] {
        let one = train(1, 4, input, build);
        // 16 threads oversubscribe a small machine: the split still depends on the shapes only.
        for threads in [2, 4, 16] {
            let many = train(threads, 4, input, build);
            let differ = one.iter().zip(&many).filter(|(a, b)| a != b).count();
            assert_eq!(differ, 0, "{name}: {differ} of {} values differ between 1 and {threads} threads", one.len());
        }
    }
}
