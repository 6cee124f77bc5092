//! Instances of this crate's generic code for `f32` and `f64`, compiled once here.
//!
//! The layers, optimizers and checkpoint functions are generic over [`Float`]. In the dev
//! profile rustc shares generic instances between crates (`-Z share-generics`, on by
//! default below `opt-level = 2`), so a test or example that finds `Linear`'s `forward`
//! for `f32` already compiled in this rlib links to it instead of compiling its own copy.
//! [`INSTANCES`] names a function per type that builds and steps every layer and
//! optimizer, so that those instances exist here; it never runs. Release builds do not
//! share generics and leave this module out. The engine does the same for its own code
//! (`tapir`'s `mono.rs`; docs/architecture.md, "Cold build").

use crate::layer::{
    AvgPool2d, CausalSelfAttention, Conv2d, Ctx, Dropout, Embedding, Flatten, Gpt, GptConfig, LayerNorm, Linear,
    MaxPool2d, Mlp, Module, Sequential,
};
use crate::optim::{clip_grad_norm, Adam, AdamW, Optimizer, Sgd};
use crate::{functional, init::Init, io};
use rand::rngs::StdRng;
use rand::SeedableRng;
use tapir::{Float, Graph, ParamStore, Tensor};

/// Kept in the rlib by `#[used]`: the roots from which rustc instantiates this crate.
#[used]
static INSTANCES: [fn() -> tapir::Result<()>; 2] = [exercise::<f32>, exercise::<f64>];

/// Builds every layer, runs a training step through each optimizer and round-trips the
/// store and the optimizer state through bytes.
fn exercise<T: Float>() -> tapir::Result<()> {
    let mut rng = StdRng::seed_from_u64(0);
    let mut store = ParamStore::<T>::new();
    let linear = Linear::new(&mut store, "l", 2, 2, &mut rng)?;
    let mlp = Mlp::builder(2).hidden(2).output(2).build(&mut store, "m", &mut rng)?;
    let conv = Conv2d::new(&mut store, "c", 1, 1, [1, 1], &mut rng)?;
    let norm = LayerNorm::new(&mut store, "n", 2)?;
    let embed = Embedding::new(&mut store, "e", 2, 2, &mut rng)?;
    let attn = CausalSelfAttention::new(&mut store, "a", 2, 1, 2, Init::LINEAR, &mut rng)?;
    let gpt = Gpt::new(&mut store, GptConfig { vocab: 2, context: 2, dim: 2, heads: 1, layers: 1 }, &mut rng)?;
    let seq = Sequential::<T>::new().push(linear).push(Dropout::new(0.5, 0)?).push(norm);
    let image = Tensor::<T>::zeros(&[1, 1, 2, 2])?;
    let batch = Tensor::<T>::zeros(&[1, 2, 2])?;
    let mut grads = store.zeros_like()?;
    let mut graph = Graph::<T>::new();
    graph.scope(|s| {
        let cx = Ctx::train(s, &store);
        let img = s.leaf(&image);
        let x = s.leaf(&batch);
        let pooled = Module::forward(&MaxPool2d::new(1), cx, img) + Module::forward(&AvgPool2d::new(1), cx, img);
        let flat = Module::forward(&Flatten, cx, Module::forward(&conv, cx, pooled));
        let h = Module::forward(&mlp, cx, Module::forward(&seq, cx, flat));
        let e = embed.forward(cx, &[0, 1]);
        let a = Module::forward(&attn, cx, x);
        let (loss, _) = gpt.loss(cx, &[0, 1], &[1, 0], 2);
        let loss = loss + h.sum() + e.sum() + a.sum();
        s.backward_into(loss, &mut grads)
    })?;
    clip_grad_norm(&store, &mut grads, 1.0)?;
    Sgd::new(&store, 0.1)?.momentum(0.9, true)?.step(&mut store, &grads)?;
    let mut adam = Adam::new(&store, 0.1)?;
    adam.step(&mut store, &grads)?;
    AdamW::new(&store, 0.1, 0.1)?.step(&mut store, &grads)?;
    let state = io::optimizer_to_bytes(&store, &adam)?;
    io::load_optimizer_bytes(&store, &mut adam, &state)?;
    let bytes = io::to_bytes(&store)?;
    io::load_bytes(&mut store, &bytes)?;
    let ids: Vec<_> = store.iter().map(|(id, _, _)| id).collect();
    let flat = functional::flatten_params(&store, &ids)?;
    functional::unflatten_params(&mut store, &ids, flat.data())?;
    Ok(())
}
