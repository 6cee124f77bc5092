//! A warmed-up training step of a tied GPT (embeddings, causal attention with dropout on
//! its weights, LayerNorms, GELU MLPs, the tied head, cross-entropy; `backward_into`,
//! gradient clipping and AdamW) makes no heap allocation.
//!
//! Its own test binary, because the counting allocator is global; counts are per thread
//! and matrix products run on the calling thread (`Graph::set_threads(1)`).

use rand::{RngExt, SeedableRng};
use tapir::{Graph, ParamStore};
use tapir_nn::optim::{clip_grad_norm, AdamW, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{CausalSelfAttention, Ctx, Gpt, GptConfig, Init};

/// The engine's counting allocator (per-thread counts), shared rather than copied.
#[path = "../../tapir/tests/common/mod.rs"]
mod common;

#[global_allocator]
static ALLOC: common::Counting = common::Counting::new();

#[test]
fn warmed_up_transformer_steps_allocate_nothing() {
    let config = GptConfig { vocab: 96, context: 16, dim: 32, heads: 4, layers: 2 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f32>::new();
    let mut gpt = Gpt::new(&mut store, config, &mut rng).unwrap();
    gpt.blocks[1].attn = CausalSelfAttention::new(&mut store, "drop", 32, 4, 16, Init::LINEAR, &mut rng)
        .unwrap()
        .with_dropout(0.1, 5)
        .unwrap();
    let x: Vec<usize> = (0..4 * 16).map(|_| rng.random_range(0..96)).collect();
    let y: Vec<usize> = (0..4 * 16).map(|_| rng.random_range(0..96)).collect();
    let (steps, warmup) = (10, 3);
    let schedule = CosineWarmup { base: 3e-3, min: 1e-4, warmup: 2, total: steps };
    let mut opt = AdamW::new(&store, schedule.lr(0), 0.01).unwrap().betas(0.9, 0.95).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let (mut before, mut losses) = (0, [f32::NAN; 10]);
    for (step, slot) in losses.iter_mut().enumerate() {
        if step == warmup {
            before = ALLOC.allocations();
        }
        grads.zero();
        let store_ref = &store;
        *slot = graph
            .scope(|s| {
                let (loss, _) = gpt.loss(Ctx::train(s, store_ref), &x, &y, 16);
                s.backward_into(loss, &mut grads)?;
                loss.item()
            })
            .expect("the step succeeds");
        clip_grad_norm(&store, &mut grads, 1.0).expect("grads match the store");
        opt.set_lr(schedule.lr(step));
        opt.step(&mut store, &grads).expect("grads match the store");
    }
    let n = ALLOC.allocations() - before;
    assert_eq!(n, 0, "a transformer step with AdamW allocated {n} times");
    // The same batch ten times: the loss must fall.
    assert!(losses[9] < losses[0], "{losses:?}");
}
