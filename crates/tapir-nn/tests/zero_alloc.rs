//! A whole warmed-up training step (forward, `backward_into`, gradient clipping, the
//! schedule and the optimizer's update) makes no heap allocation: the arena, the tape's
//! vectors, the gradient buffer and the optimizer's state are all reused.
//!
//! Its own test binary, because the counting allocator is global. Counts are per thread,
//! so the test harness's threads do not disturb them; matrix products run on the calling
//! thread (`Graph::set_threads(1)`).

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::optim::{clip_grad_norm, Adam, AdamW, CosineWarmup, Optimizer, Schedule, Sgd};
use tapir_nn::{
    Activation, AvgPool2d, Conv2d, Ctx, Dropout, Flatten, LayerNorm, Linear, MaxPool2d, Mlp, Module, Sequential,
};

/// The engine's counting allocator (per-thread counts), shared rather than copied.
#[path = "../../tapir/tests/common/mod.rs"]
mod common;

#[global_allocator]
static ALLOC: common::Counting = common::Counting::new();

fn allocations() -> usize {
    ALLOC.allocations()
}

/// Runs `steps` training steps of `model` and returns the heap allocations made by the
/// last `steps - warmup` of them, and the last loss.
fn train(
    model: &dyn Module<f32>,
    store: &mut ParamStore<f32>,
    opt: &mut dyn Optimizer<f32>,
    x: &Tensor<f32>,
    labels: &[usize],
    steps: usize,
) -> (usize, f32) {
    let warmup = 3;
    let schedule = CosineWarmup { base: 1e-2, min: 1e-4, warmup: 2, total: steps };
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let (mut before, mut loss) = (0, f32::NAN);
    for step in 0..steps {
        if step == warmup {
            before = allocations();
        }
        grads.zero();
        let store_ref = &*store;
        loss = graph
            .scope(|s| {
                let logits = model.forward(Ctx::train(s, store_ref), s.input(x));
                let loss = logits.cross_entropy(labels);
                s.backward_into(loss, &mut grads)?;
                loss.item()
            })
            .expect("the step succeeds");
        clip_grad_norm(store, &mut grads, 1.0).expect("grads match the store");
        opt.set_lr(schedule.lr(step));
        opt.step(store, &grads).expect("grads match the store");
    }
    (allocations() - before, loss)
}

#[test]
fn warmed_up_training_steps_allocate_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let labels: Vec<usize> = (0..32).map(|i| i % 10).collect();

    // An MLP with dropout, trained by Adam.
    let mut store = ParamStore::<f32>::new();
    let mlp = Mlp::builder(64).hidden(32).dropout(0.1, 7).output(10).build(&mut store, "mlp", &mut rng).unwrap();
    let x = Tensor::<f32>::normal(&[32, 64], 0.0, 1.0, &mut rng).unwrap();
    let mut adam = Adam::new(&store, 1e-2).unwrap();
    let (n, loss) = train(&mlp, &mut store, &mut adam, &x, &labels, 12);
    assert_eq!(n, 0, "an MLP step with Adam allocated {n} times");
    assert!(loss.is_finite());

    // Linear, LayerNorm, GELU: trained by SGD with Nesterov momentum and weight decay.
    let mut store = ParamStore::<f32>::new();
    let model = Sequential::new()
        .push(Linear::new(&mut store, "fc1", 64, 48, &mut rng).unwrap())
        .push(LayerNorm::new(&mut store, "ln", 48).unwrap())
        .push(Activation::Gelu)
        .push(Dropout::new(0.2, 3).unwrap())
        .push(Linear::new(&mut store, "fc2", 48, 10, &mut rng).unwrap());
    let mut sgd = Sgd::new(&store, 0.1).unwrap().momentum(0.9, true).unwrap().weight_decay(1e-4).unwrap();
    let (n, _) = train(&model, &mut store, &mut sgd, &x, &labels, 12);
    assert_eq!(n, 0, "a LayerNorm step with SGD allocated {n} times");

    // A small CNN, trained by AdamW.
    let mut store = ParamStore::<f32>::new();
    let cnn = Sequential::new()
        .push(Conv2d::new(&mut store, "c1", 1, 4, [3, 3], &mut rng).unwrap().padding([1, 1]))
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(&mut store, "c2", 4, 8, [3, 3], &mut rng).unwrap().padding([1, 1]).stride([2, 2]))
        .push(Activation::Relu)
        .push(AvgPool2d::new(2))
        .push(Flatten)
        .push(Linear::new(&mut store, "fc", 8, 10, &mut rng).unwrap());
    let images = Tensor::<f32>::normal(&[32, 1, 8, 8], 0.0, 1.0, &mut rng).unwrap();
    let mut adamw = AdamW::new(&store, 1e-2, 1e-2).unwrap();
    let (n, _) = train(&cnn, &mut store, &mut adamw, &images, &labels, 12);
    assert_eq!(n, 0, "a CNN step with AdamW allocated {n} times");
}

/// A `Sequential` checkpointed every 2 layers, dropout included: the view, the nested
/// scopes, the scratch arena and the recomputation reuse what the first steps set up.
#[test]
fn warmed_up_checkpointed_steps_allocate_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let labels: Vec<usize> = (0..16).map(|i| i % 10).collect();
    let mut store = ParamStore::<f32>::new();
    let mut model = Sequential::new();
    for i in 0..4 {
        model = model
            .push(Linear::new(&mut store, &format!("fc{i}"), 32, 32, &mut rng).unwrap())
            .push(Activation::Relu)
            .push(Dropout::new(0.1, i).unwrap());
    }
    let model = model.push(Linear::new(&mut store, "out", 32, 10, &mut rng).unwrap());
    let x = Tensor::<f32>::normal(&[16, 32], 0.0, 1.0, &mut rng).unwrap();
    let mut sgd = Sgd::new(&store, 0.05).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut counts = vec![];
    for _ in 0..10 {
        let before = allocations();
        grads.zero();
        let checkpointed = model.checkpointed(&store, 2).unwrap();
        graph
            .scope(|s| {
                let loss = checkpointed.forward(Ctx::train(s, &store), s.input(&x)).cross_entropy(&labels);
                s.backward_into(loss, &mut grads)
            })
            .expect("the step succeeds");
        sgd.step(&mut store, &grads).expect("grads match the store");
        counts.push(allocations() - before);
    }
    assert!(counts[3..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert!(graph.stats().scratch.high_water > 0, "the groups ran on the scratch arena");
}
