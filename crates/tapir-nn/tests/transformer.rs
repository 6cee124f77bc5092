//! The transformer layers: parameter gradients against central finite differences in
//! `f64` (as in `layer_gradients.rs`), causality bit for bit, exact zeros under the mask
//! with anomaly detection on, and weight tying.

use rand::{RngExt, SeedableRng};
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::{CausalSelfAttention, Ctx, Gpt, GptConfig, Init, Module, TransformerBlock};

type Forward<'a> = &'a dyn for<'s, 'g> Fn(Ctx<'s, 'g, f64>) -> tapir::Var<'s, f64>;

/// Every parameter's gradient from `backward_into` against central differences of
/// `L = Σ out ⊙ r`, `r` fixed and random.
fn check(store: &mut ParamStore<f64>, forward: Forward<'_>) {
    let mut graph = Graph::<f64>::new();
    graph.set_threads(1);
    let n = graph.scope(|s| forward(Ctx::eval(s, store)).value().unwrap().len());
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let r: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
    let loss = |graph: &mut Graph<f64>, store: &ParamStore<f64>| {
        graph.scope(|s| {
            let out = forward(Ctx::eval(s, store));
            let dims = out.shape().to_vec();
            (out * s.tensor(&r, &dims)).sum().item().unwrap()
        })
    };
    let mut grads = store.zeros_like().unwrap();
    graph.scope(|s| {
        let out = forward(Ctx::eval(s, store));
        let dims = out.shape().to_vec();
        s.backward_into((out * s.tensor(&r, &dims)).sum(), &mut grads).unwrap();
    });
    let ids: Vec<_> = store.iter().map(|(id, name, _)| (id, name.to_string())).collect();
    let mut checked = 0;
    for (id, name) in ids {
        for i in 0..store.get(id).unwrap().numel() {
            let x = store.get(id).unwrap().data()[i];
            let h = 1e-6 * x.abs().max(1.0);
            store.get_mut(id).unwrap().data_mut()[i] = x + h;
            let up = loss(&mut graph, store);
            store.get_mut(id).unwrap().data_mut()[i] = x - h;
            let down = loss(&mut graph, store);
            store.get_mut(id).unwrap().data_mut()[i] = x;
            let numeric = (up - down) / (2.0 * h);
            let analytic = grads.get(id).unwrap().data()[i];
            let tol = 1e-6 + 1e-4 * analytic.abs().max(numeric.abs());
            assert!((analytic - numeric).abs() <= tol, "{name}[{i}]: analytic {analytic:e} vs numeric {numeric:e}");
            checked += 1;
        }
    }
    assert!(checked > 0);
}

/// Moves every parameter by up to `±spread`, so that zero biases and unit LayerNorm
/// scales do not hide a gradient.
fn jitter(store: &mut ParamStore<f64>, spread: f64, seed: u64) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for (_, t) in store.iter_mut() {
        for v in t.data_mut() {
            *v += rng.random_range(-spread..spread);
        }
    }
}

fn input(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Tensor::normal(dims, 0.0, 1.0, &mut rng).unwrap()
}

const TINY: GptConfig = GptConfig { vocab: 7, context: 5, dim: 4, heads: 2, layers: 2 };

#[test]
fn attention_gradients_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let attn = CausalSelfAttention::new(&mut store, "attn", 6, 2, 5, Init::LINEAR, &mut rng).unwrap();
    jitter(&mut store, 0.2, 1);
    // T = 4 < context = 5: the mask is narrowed.
    let x = input(&[2, 4, 6], 2);
    check(&mut store, &|cx| attn.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
    let x = input(&[1, 5, 6], 3);
    check(&mut store, &|cx| attn.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
}

#[test]
fn block_gradients_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let block = TransformerBlock::new(&mut store, "b", 4, 2, 3, 0.5, 0.3, &mut rng).unwrap();
    jitter(&mut store, 0.2, 1);
    let x = input(&[2, 3, 4], 4);
    check(&mut store, &|cx| block.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
}

#[test]
fn gpt_gradients_with_tied_and_positional_embeddings_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let gpt = Gpt::new(&mut store, TINY, &mut rng).unwrap();
    jitter(&mut store, 0.3, 1);
    // Token 6 appears twice and token 1 three times: the table gathers several rows.
    let tokens = [6, 1, 0, 1, 3, 6, 2, 1];
    check(&mut store, &|cx| gpt.forward(cx, &tokens, 4));
    // Also through the loss the example trains with.
    check(&mut store, &|cx| gpt.loss(cx, &tokens[..6], &[1, 0, 1, 3, 6, 2], 3).0);
}

#[test]
fn a_parameter_used_twice_gets_both_contributions() {
    // The tied model against the same model with the head's use of the table replaced by
    // a separate copy: the tied gradient must be the sum of the two copies' gradients.
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f64>::new();
    let gpt = Gpt::new(&mut store, TINY, &mut rng).unwrap();
    jitter(&mut store, 0.3, 2);
    let table = store.get(gpt.tok.weight).unwrap().clone();
    let head = store.add("head.weight", table).unwrap();
    let (tokens, targets) = ([1, 2, 3, 1, 5, 0], [2, 3, 1, 5, 0, 6]);
    let mut graph = Graph::<f64>::new();
    let mut tied = store.zeros_like().unwrap();
    graph.scope(|s| s.backward_into(gpt.loss(Ctx::eval(s, &store), &tokens, &targets, 3).0, &mut tied).unwrap());
    let mut split = store.zeros_like().unwrap();
    graph.scope(|s| {
        let cx = Ctx::eval(s, &store);
        let mut h = gpt.tok.forward(cx, &tokens).reshape(&[2, 3, 4]) + gpt.pos.forward(cx, 3);
        for b in &gpt.blocks {
            h = b.forward(cx, h);
        }
        let logits = gpt.ln_f.forward(cx, h).reshape(&[6, 4]).matmul(cx.param(head).t());
        s.backward_into(logits.cross_entropy(&targets), &mut split).unwrap();
    });
    let (t, e, o) = (tied.get(gpt.tok.weight).unwrap(), split.get(gpt.tok.weight).unwrap(), split.get(head).unwrap());
    assert!(e.data().iter().any(|&v| v != 0.0) && o.data().iter().all(|&v| v != 0.0));
    for ((&t, &e), &o) in t.data().iter().zip(e.data()).zip(o.data()) {
        assert!((t - (e + o)).abs() <= 1e-12 * (1.0 + t.abs()), "{t} vs {e} + {o}");
    }
    // Every other parameter's gradient is the same in both.
    for (id, name, _) in store.iter().filter(|(id, _, _)| *id != gpt.tok.weight && *id != head) {
        assert_eq!(tied.get(id).unwrap().data(), split.get(id).unwrap().data(), "{name}");
    }
}

#[test]
fn later_tokens_leave_earlier_logits_bitwise_unchanged() {
    let config = GptConfig { vocab: 11, context: 8, dim: 16, heads: 4, layers: 2 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f32>::new();
    let gpt = Gpt::new(&mut store, config, &mut rng).unwrap();
    let mut graph = Graph::<f32>::new();
    let mut logits =
        |tokens: &[usize]| graph.scope(|s| gpt.forward(Ctx::eval(s, &store), tokens, 8).to_tensor().unwrap());
    let base: Vec<usize> = (0..16).map(|_| rng.random_range(0..11)).collect();
    let before = logits(&base);
    for t in 0..8 {
        let mut changed = base.clone();
        for (p, tok) in changed.iter_mut().enumerate() {
            if p % 8 > t {
                *tok = (*tok + 1 + p % 8) % 11; // 1 + p % 8 < 11: always a change
            }
        }
        let after = logits(&changed);
        for row in 0..2 {
            for p in 0..8 {
                let at = |l: &Tensor<f32>| l.data()[(row * 8 + p) * 11..(row * 8 + p + 1) * 11].to_vec();
                let (a, b) = (at(&before), at(&after));
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                if p <= t {
                    assert!(same, "sequence {row}, position {p} changed after editing tokens past {t}");
                } else if t + 1 < 8 && p == t + 1 {
                    assert!(!same, "position {p} should see its own changed token");
                }
            }
        }
    }
}

/// Causal attention's NaN policy through the layer (docs/design.md, "NaN policy"): a NaN
/// in the input at position `t` of sequence 0 leaves every output row before `t` (and all
/// of sequence 1) with the bits of the run without it, and so does the input's gradient
/// for a loss that reads only those rows (the masked weights and the rows with a zero
/// gradient are skipped, not multiplied by the NaN). The parameters' gradients are NaN:
/// they sum over every position, the NaN one included.
#[test]
fn a_nan_input_reaches_only_the_positions_that_see_it() {
    for (t, c, heads) in [(6, 6, 2), (40, 32, 4)] {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut store = ParamStore::new();
        let attn = CausalSelfAttention::new(&mut store, "attn", c, heads, t, Init::LINEAR, &mut rng).unwrap();
        jitter(&mut store, 0.2, 1);
        let clean = input(&[2, t, c], 5);
        let mut graph = Graph::<f64>::new();
        let mut run = |x: &Tensor<f64>, rows: usize| {
            graph.scope(|s| {
                let x = s.leaf(x);
                let y = attn.forward(Ctx::eval(s, &store), x);
                let read = y.narrow(1, 0, rows);
                let dims = read.shape().to_vec();
                let r: Vec<f64> = (0..read.shape().numel()).map(|i| ((i * 7919) % 13) as f64 / 13.0 - 0.4).collect();
                s.backward((read * s.tensor(&r, &dims)).sum()).unwrap();
                (y.value().unwrap().to_vec(), x.grad().unwrap().to_vec())
            })
        };
        for pos in [1, t / 2, t - 1] {
            for channels in [0..c, 1..2] {
                let mut data = clean.data().to_vec();
                data[pos * c..(pos + 1) * c][channels.clone()].fill(f64::NAN);
                let nan = Tensor::from_vec(data, &[2, t, c]).unwrap();
                let (v0, g0) = run(&clean, pos);
                let (v1, g1) = run(&nan, pos);
                // Positions before `pos` in sequence 0, and all of sequence 1.
                let unseen = |x: &[f64]| -> Vec<f64> { x[..pos * c].iter().chain(&x[t * c..]).copied().collect() };
                let same = |a: Vec<f64>, b: Vec<f64>| a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                let what = format!("t {t}, NaN at position {pos}, channels {channels:?}");
                assert!(same(unseen(&v0), unseen(&v1)), "output, {what}");
                assert!(v1[pos * c..(pos + 1) * c].iter().all(|v| v.is_nan()), "output at {pos}, {what}");
                assert!(same(unseen(&g0), unseen(&g1)), "input gradient, {what}");
            }
        }
    }
}

#[test]
fn masked_steps_are_finite_under_anomaly_detection_and_dropout_is_off_in_eval() {
    let config = GptConfig { vocab: 13, context: 6, dim: 8, heads: 2, layers: 1 };
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f32>::new();
    let mut gpt = Gpt::new(&mut store, config, &mut rng).unwrap();
    gpt.blocks[0].attn = CausalSelfAttention::new(&mut store, "drop", 8, 2, 6, Init::LINEAR, &mut rng)
        .unwrap()
        .with_dropout(0.5, 9)
        .unwrap();
    // Large weights: scores in the hundreds, so the masked exponentials are far below f32's range.
    for (_, t) in store.iter_mut() {
        for v in t.data_mut() {
            *v *= 40.0;
        }
    }
    let mut graph = Graph::<f32>::new();
    graph.set_anomaly_detection(true);
    let tokens: Vec<usize> = (0..12).map(|i| (i * 5) % 13).collect();
    let targets: Vec<usize> = (0..12).map(|i| (i * 7 + 1) % 13).collect();
    let mut grads = store.zeros_like().unwrap();
    let train = graph.scope(|s| {
        let (loss, logits) = gpt.loss(Ctx::train(s, &store), &tokens, &targets, 6);
        s.backward_into(loss, &mut grads).unwrap();
        logits.to_tensor().unwrap()
    });
    assert!(grads.iter().all(|(_, g)| g.data().iter().all(|v| v.is_finite())));
    let eval =
        |graph: &mut Graph<f32>| graph.scope(|s| gpt.forward(Ctx::eval(s, &store), &tokens, 6).to_tensor().unwrap());
    let (e1, e2) = (eval(&mut graph), eval(&mut graph));
    assert_eq!(e1, e2);
    assert_ne!(train, e1, "dropout on the attention weights changes the training logits");
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f32>::new();
    let gpt = Gpt::new(&mut store, TINY, &mut rng).unwrap();
    let mut graph = Graph::<f32>::new();
    // Longer than the context, a length that is not a multiple of T, a token ≥ V.
    for (tokens, t) in [(vec![0; 6], 6), (vec![0; 7], 3), (vec![7; 3], 3)] {
        let e = graph.scope(|s| gpt.forward(Ctx::eval(s, &store), &tokens, t).value().map(|_| ()).unwrap_err());
        assert!(!e.to_string().is_empty());
    }
    let attn = &gpt.blocks[0].attn;
    for dims in [vec![2, 3], vec![1, 3, 5], vec![1, 2, 3, 4]] {
        let x = Tensor::<f32>::zeros(&dims).unwrap();
        let e = graph.scope(|s| attn.forward(Ctx::eval(s, &store), s.input(&x)).value().map(|_| ()).unwrap_err());
        assert!(!e.to_string().is_empty(), "{dims:?}");
    }
    // Six positions for a context of five: the layer's own check, through `Scope::invalid`.
    let x = Tensor::<f32>::zeros(&[1, 6, 4]).unwrap();
    let e = graph.scope(|s| attn.forward(Ctx::eval(s, &store), s.input(&x)).value().map(|_| ()).unwrap_err());
    let tapir::Error::InvalidArgument { op, detail, location } = &e else { panic!("{e:?}") };
    assert_eq!(*op, "CausalSelfAttention::forward");
    assert!(detail.contains("[1, 6, 4]") && detail.contains("context of 5"), "{detail}");
    assert!(location.file().ends_with("transformer.rs"), "{location}");
    assert!(CausalSelfAttention::new(&mut store, "x", 6, 4, 3, Init::LINEAR, &mut rng).is_err());
    assert!(Gpt::new(&mut store, TINY, &mut rng).is_err(), "names are taken");
}
