//! W10: one training step of the character-level GPT of `tapir-nn`'s `train_chars`
//! example (vocabulary 96, context 64, width 128, 4 heads, 4 layers, tied output, 814k
//! parameters; batch 32): forward, cross-entropy, backward, gradient clipping to norm 1
//! and an AdamW update. `torch_peer.py` builds the same model with the same
//! initialisation scheme (GPT-2's `N(0, 0.02²)`, residual projections scaled by
//! `1/√(2·layers)`).

use rand::{RngExt, SeedableRng};
use tapir::{GradBuffer, Graph, ParamStore};
use tapir_nn::optim::{clip_grad_norm, AdamW, Optimizer};
use tapir_nn::{Ctx, Gpt, GptConfig};

/// The model's shape, as in the example.
pub const W10_CONFIG: GptConfig = GptConfig { vocab: 96, context: 64, dim: 128, heads: 4, layers: 4 };
/// Sequences per batch.
pub const W10_BATCH: usize = 32;
/// Tokens per step.
pub const W10_TOKENS: usize = W10_BATCH * 64;

/// The model, its optimizer and one fixed batch.
pub struct CharStep {
    model: Gpt,
    store: ParamStore<f32>,
    grads: GradBuffer<f32>,
    opt: AdamW<f32>,
    x: Vec<usize>,
    y: Vec<usize>,
}

impl CharStep {
    /// The model drawn from seed 0, AdamW (lr 1e-3, weight decay 0.01, betas 0.9/0.95)
    /// and one random batch.
    #[allow(clippy::new_without_default)]
    pub fn new() -> CharStep {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut store = ParamStore::new();
        let model = Gpt::new(&mut store, W10_CONFIG, &mut rng).expect("a valid configuration");
        let grads = store.zeros_like().expect("gradient buffers fit in memory");
        let opt = AdamW::new(&store, 1e-3, 0.01)
            .and_then(|o| o.betas(0.9, 0.95))
            .expect("valid hyper-parameters and moments that fit in memory");
        let x = (0..W10_TOKENS).map(|_| rng.random_range(0..W10_CONFIG.vocab)).collect();
        let y = (0..W10_TOKENS).map(|_| rng.random_range(0..W10_CONFIG.vocab)).collect();
        CharStep { model, store, grads, opt, x, y }
    }

    /// One step; returns the loss.
    pub fn step(&mut self, graph: &mut Graph<f32>) -> f32 {
        let CharStep { model, store, grads, opt, x, y } = self;
        grads.zero();
        let loss = graph
            .scope(|s| {
                let (loss, _) = model.loss(Ctx::train(s, store), x, y, W10_CONFIG.context);
                s.backward_into(loss, grads)?;
                loss.item()
            })
            .expect("the step runs");
        clip_grad_norm(store, grads, 1.0).expect("a positive norm");
        opt.step(store, grads).expect("matching shapes");
        loss
    }
}
