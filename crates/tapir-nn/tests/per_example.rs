//! Per-example gradients of tapir-nn models (`Scope::per_example_store`) against B ≥ 3
//! separate `backward_into` passes, one per example, in f64 with random weights and
//! distinct examples: Linear, grouped and dilated Conv2d with pooling, Embedding and
//! LayerNorm. Dropout draws its mask per example; its per-example gradients are checked
//! to sum to the ordinary gradient of the same draw.

use rand::{RngExt, SeedableRng};
use tapir::{Conv2dOptions, Graph, ParamStore, Tensor, Var};
use tapir_nn::{
    Activation, Conv2d, Ctx, Dropout, Embedding, Flatten, LayerNorm, Linear, MaxPool2d, Module, Sequential,
};

/// The model's loss for examples `e0..e0 + n`: `(ctx, the examples' input) -> (loss, the
/// value to list as the examples)`.
type Model<'a> = &'a dyn for<'s, 'g> Fn(Ctx<'s, 'g, f64>, usize, usize) -> (Var<'s, f64>, Var<'s, f64>);

/// A loss of a model's input.
type Head<'a> = &'a dyn for<'s, 'g> Fn(Ctx<'s, 'g, f64>, Var<'s, f64>) -> Var<'s, f64>;

fn random(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = dims.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-1.0..1.0)).collect(), dims).unwrap()
}

/// `rows` rows per example of `t`, for examples `e0..e0 + n`, as a constant.
fn part<'s>(cx: Ctx<'s, '_, f64>, t: &Tensor<f64>, batch: usize, (e0, n): (usize, usize)) -> Var<'s, f64> {
    let per = t.numel() / batch;
    let mut dims = t.dims();
    dims[0] = dims[0] / batch * n;
    cx.scope().tensor(&t.data()[e0 * per..(e0 + n) * per], &dims)
}

/// Moves every parameter off its initial value (zero biases, unit gains) so that every
/// gradient is generic.
fn jiggle(store: &mut ParamStore<f64>, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (_, t) in store.iter_mut() {
        for v in t.data_mut() {
            *v += rng.random_range(-0.5..0.5);
        }
    }
}

fn check(store: &ParamStore<f64>, batch: usize, model: Model<'_>) {
    let mut graph = Graph::<f64>::new();
    // The reference: one backward pass per example.
    let mut want: Vec<Vec<f64>> = vec![vec![]; store.len()];
    for e in 0..batch {
        let mut grads = store.zeros_like().unwrap();
        graph.scope(|s| s.backward_into(model(Ctx::eval(s, store), e, 1).0, &mut grads)).unwrap();
        for (w, (_, g)) in want.iter_mut().zip(grads.iter()) {
            w.extend_from_slice(g.data());
        }
    }
    let got = graph.scope(|s| {
        let (loss, examples) = model(Ctx::eval(s, store), 0, batch);
        s.per_example_store(loss, (batch, &[examples]), store).unwrap().grads().unwrap()
    });
    let names: Vec<String> = store.iter().map(|(_, n, _)| n.to_string()).collect();
    for ((g, w), name) in got.iter().zip(&want).zip(&names) {
        assert_eq!(g.numel(), w.len(), "{name}");
        assert!(w.iter().any(|&v| v != 0.0), "{name}: the reference is all zeros");
        for (i, (a, b)) in g.data().iter().zip(w).enumerate() {
            assert!((a - b).abs() <= 1e-10 * (1.0 + a.abs().max(b.abs())), "{name}[{i}]: {a} vs {b}");
        }
    }
}

#[test]
fn mlp_with_layer_norm() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let model = Sequential::new()
        .push(Linear::new(&mut store, "fc1", 4, 6, &mut rng).unwrap())
        .push(LayerNorm::new(&mut store, "ln", 6).unwrap())
        .push(Activation::Gelu)
        .push(Linear::new(&mut store, "fc2", 6, 3, &mut rng).unwrap());
    jiggle(&mut store, 1);
    let (x, r, batch) = (random(&[4, 4], 2), random(&[4, 3], 3), 4);
    check(&store, batch, &|cx, e0, n| {
        let xv = part(cx, &x, batch, (e0, n));
        ((model.forward(cx, xv) * part(cx, &r, batch, (e0, n))).sum(), xv)
    });
}

#[test]
fn grouped_dilated_conv_with_pooling() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let mut store = ParamStore::new();
    let opts = Conv2dOptions::new().padding([2, 1]).dilation([2, 1]).groups(2);
    let model = Sequential::new()
        .push(Conv2d::with_options(&mut store, "conv", 4, 6, [3, 2], opts, &mut rng).unwrap())
        .push(Activation::Tanh)
        .push(MaxPool2d::new(2))
        .push(Conv2d::with_options(&mut store, "dw", 6, 6, [2, 2], Conv2dOptions::new().groups(6), &mut rng).unwrap())
        .push(Flatten)
        .push(Linear::new(&mut store, "head", 12, 2, &mut rng).unwrap());
    jiggle(&mut store, 11);
    let (x, batch) = (random(&[3, 4, 5, 5], 12), 3);
    let r = random(&[3, 2], 13);
    check(&store, batch, &|cx, e0, n| {
        let xv = part(cx, &x, batch, (e0, n));
        ((model.forward(cx, xv) * part(cx, &r, batch, (e0, n))).sum(), xv)
    });
}

#[test]
fn embedding_lookup_of_each_examples_tokens() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(20);
    let mut store = ParamStore::new();
    let (t, d, batch) = (3, 4, 4);
    let emb = Embedding::new(&mut store, "emb", 7, d, &mut rng).unwrap();
    let ln = LayerNorm::new(&mut store, "ln", d).unwrap();
    let head = Linear::new(&mut store, "head", t * d, 2, &mut rng).unwrap();
    jiggle(&mut store, 21);
    // Token 5 appears in two examples and twice in one: rows are summed per example.
    let tokens = [1usize, 5, 5, 0, 2, 3, 6, 5, 4, 2, 2, 1];
    let r = random(&[batch, 2], 22);
    check(&store, batch, &|cx, e0, n| {
        let e = emb.forward(cx, &tokens[e0 * t..(e0 + n) * t]);
        let h = ln.forward(cx, e).reshape(&[n, t * d]);
        ((head.forward(cx, h).tanh() * part(cx, &r, batch, (e0, n))).sum(), e)
    });
}

#[test]
fn dropout_draws_per_example_and_the_gradients_sum_to_the_batch_gradient() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(30);
    let mut store = ParamStore::new();
    let model = Sequential::new()
        .push(Linear::new(&mut store, "fc1", 5, 16, &mut rng).unwrap())
        .push(Dropout::new(0.5, 7).unwrap())
        .push(Linear::new(&mut store, "fc2", 16, 2, &mut rng).unwrap());
    let (x, r, batch) = (random(&[4, 5], 31), random(&[4, 2], 32), 4);
    let loss: Head<'_> = &|cx, xv| (model.forward(cx, xv) * part(cx, &r, batch, (0, batch))).sum();
    // Two graphs on their first step draw the same masks.
    let (mut g1, mut g2) = (Graph::<f64>::new(), Graph::<f64>::new());
    let mut whole = store.zeros_like().unwrap();
    g1.scope(|s| s.backward_into(loss(Ctx::train(s, &store), s.input(&x)), &mut whole)).unwrap();
    let per = g2.scope(|s| {
        let xv = s.input(&x);
        s.per_example_store(loss(Ctx::train(s, &store), xv), (batch, &[xv]), &store).unwrap().grads().unwrap()
    });
    // fc1.weight's per-example gradients: the masks differ between examples, so the
    // examples' zero columns (dropped units) differ.
    let w1 = &per[0];
    let dropped =
        |e: usize| -> Vec<bool> { (0..16).map(|j| (0..5).all(|i| w1.data()[e * 80 + i * 16 + j] == 0.0)).collect() };
    assert!((1..batch).any(|e| dropped(e) != dropped(0)), "every example dropped the same units");
    for (g, (_, w)) in per.iter().zip(whole.iter()) {
        let n = w.data().len();
        for (i, &v) in w.data().iter().enumerate() {
            let sum: f64 = (0..batch).map(|e| g.data()[e * n + i]).sum();
            assert!((sum - v).abs() <= 1e-12 * (1.0 + v.abs()), "{sum} vs {v}");
        }
    }
}
