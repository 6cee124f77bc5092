//! A `Sequential` checkpointed every few layers: the same loss and gradients as the stack
//! recorded directly, dropout included (its masks repeat when a group is recomputed), and
//! finite differences agree.

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::{Activation, Ctx, Dropout, Linear, Module, Sequential};

fn model(store: &mut ParamStore<f64>, dropout: bool) -> Sequential<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut model = Sequential::new();
    for i in 0..7 {
        model = model.push(Linear::new(store, &format!("fc{i}"), 6, 6, &mut rng).unwrap()).push(Activation::Tanh);
        if dropout {
            model = model.push(Dropout::new(0.3, 100 + i).unwrap());
        }
    }
    model
}

/// Two training steps on a fresh graph; the second step's loss and gradients.
fn step(every: Option<usize>, dropout: bool) -> (f64, Vec<f64>) {
    step_with(every, dropout, false)
}

/// As [`step`]; with `penalty`, the loss gets an input-gradient penalty `Σ (∂L/∂x)²`
/// (WGAN-GP's form), so its parameter gradients are second derivatives through every
/// checkpointed group.
fn step_with(every: Option<usize>, dropout: bool, penalty: bool) -> (f64, Vec<f64>) {
    let mut store = ParamStore::new();
    let model = model(&mut store, dropout);
    let x = Tensor::<f64>::normal(&[5, 6], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(12)).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    let mut loss = 0.0;
    for _ in 0..2 {
        grads.zero();
        let checkpointed = every.map(|k| model.checkpointed(&store, k).unwrap());
        loss = graph.scope(|s| {
            let cx = Ctx::train(s, &store);
            let x = s.leaf(&x);
            let y = match &checkpointed {
                Some(c) => c.forward(cx, x),
                None => model.forward(cx, x),
            };
            let mut loss = y.square().mean();
            if penalty {
                let [gx] = s.grad(loss, [x]).unwrap();
                loss = loss + gx.square().sum();
            }
            s.backward_into(loss, &mut grads).unwrap();
            loss.item().unwrap()
        });
    }
    (loss, store.iter().flat_map(|(id, _, _)| grads.get(id).unwrap().data().to_vec()).collect())
}

fn assert_close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-12 * (1.0 + x.abs()), "gradient {i}: {x} vs {y}");
    }
}

#[test]
fn checkpointing_every_k_layers_keeps_the_gradients() {
    let (l0, g0) = step(None, false);
    for k in [1, 3, 4, 100] {
        let (l, g) = step(Some(k), false);
        assert_eq!(l0, l, "every {k}");
        assert_close(&g0, &g);
    }
}

#[test]
fn dropout_masks_repeat_under_recomputation() {
    let (l0, g0) = step(None, true);
    let (no_dropout, _) = step(None, false);
    assert_ne!(l0, no_dropout, "dropout is active");
    for k in [2, 3] {
        let (l, g) = step(Some(k), true);
        assert_eq!(l0, l, "every {k}");
        assert_close(&g0, &g);
    }
}

#[test]
fn second_order_penalties_through_checkpointed_groups_keep_the_gradients() {
    let (l0, g0) = step_with(None, true, true);
    let (first_order, _) = step_with(None, true, false);
    assert_ne!(l0, first_order, "the penalty counts");
    for k in [1, 2, 3, 100] {
        let (l, g) = step_with(Some(k), true, true);
        assert_eq!(l0, l, "every {k}");
        assert_close(&g0, &g);
    }
}

#[test]
fn a_group_of_zero_layers_is_an_error() {
    let mut store = ParamStore::new();
    let model = model(&mut store, false);
    assert!(matches!(model.checkpointed(&store, 0), Err(tapir::Error::InvalidArgument { .. })));
}

#[test]
fn checkpointed_gradients_match_finite_differences() {
    // The input as the variable: L = Σ (model(x) ⊙ r), through two checkpointed groups.
    let mut store = ParamStore::new();
    let model = model(&mut store, false);
    let checkpointed = model.checkpointed(&store, 4).unwrap();
    let x = Tensor::<f64>::normal(&[2, 6], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(13)).unwrap();
    let eval = |x: &Tensor<f64>, g: &mut Graph<f64>| {
        g.scope(|s| {
            let x = s.leaf(x);
            let loss = checkpointed.forward(Ctx::eval(s, &store), x).square().sum();
            s.backward(loss).unwrap();
            (loss.item().unwrap(), x.grad().unwrap().to_vec())
        })
    };
    let mut g = Graph::new();
    let (_, dx) = eval(&x, &mut g);
    for (i, &analytic) in dx.iter().enumerate() {
        let h = 1e-6;
        let mut xp = x.clone();
        xp.data_mut()[i] += h;
        let mut xm = x.clone();
        xm.data_mut()[i] -= h;
        let numeric = (eval(&xp, &mut g).0 - eval(&xm, &mut g).0) / (2.0 * h);
        assert!((analytic - numeric).abs() <= 1e-6 + 1e-4 * numeric.abs(), "{i}: {analytic} vs {numeric}");
    }
}
