//! Every layer's parameter gradients, as `backward_into` delivers them, against central
//! finite differences in `f64` on the store itself, with the loss `L = Σ out ⊙ r` for a
//! fixed random `r` (a plain sum would hide a transposed gradient).

use rand::{RngExt, SeedableRng};
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::{
    Activation, AvgPool2d, Conv2d, Ctx, Embedding, Flatten, LayerNorm, Linear, MaxPool2d, Mlp, Module, Sequential,
};

/// The model as a function of the store: `out` for the fixed input (copied into the
/// arena, since the closure must work for any borrow of the store).
type Forward<'a> = &'a dyn for<'s, 'g> Fn(Ctx<'s, 'g, f64>) -> tapir::Var<'s, f64>;

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

fn input(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Tensor::normal(dims, 0.0, 1.0, &mut rng).unwrap()
}

#[test]
fn mlp_with_smooth_activations() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let mlp = Mlp::builder(5).hidden(7).hidden(4).activation(Activation::Tanh).output(3);
    let mlp = mlp.build(&mut store, "mlp", &mut rng).unwrap();
    let x = input(&[6, 5], 1);
    check(&mut store, &|cx| mlp.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
}

#[test]
fn linear_layernorm_gelu_on_a_batch_of_sequences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let model = Sequential::new()
        .push(Linear::new(&mut store, "fc", 4, 6, &mut rng).unwrap())
        .push(LayerNorm::new(&mut store, "ln", 6).unwrap())
        .push(Activation::Gelu);
    // LayerNorm's γ and β start at 1 and 0; move them so their gradients are generic.
    for (_, t) in store.iter_mut() {
        for v in t.data_mut() {
            *v += rng.random_range(-0.3..0.3);
        }
    }
    let x = input(&[2, 3, 4], 2);
    check(&mut store, &|cx| model.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
}

#[test]
fn conv_pool_flatten_linear() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let model = Sequential::new()
        .push(Conv2d::new(&mut store, "c1", 2, 3, [3, 3], &mut rng).unwrap().padding([1, 1]))
        .push(Activation::Softplus)
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(&mut store, "c2", 3, 2, [2, 2], &mut rng).unwrap().stride([1, 1]))
        .push(AvgPool2d { kernel: [2, 2], stride: [1, 1], padding: [1, 1] })
        .push(Flatten)
        .push(Linear::new(&mut store, "fc", 2 * 3 * 3, 3, &mut rng).unwrap());
    for (_, t) in store.iter_mut() {
        for v in t.data_mut() {
            *v += rng.random_range(-0.1..0.1);
        }
    }
    let x = input(&[2, 2, 6, 6], 3);
    check(&mut store, &|cx| model.forward(cx, cx.scope().tensor(x.data(), &x.dims())));
}

#[test]
fn embedding_with_repeated_indices() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::new();
    let emb = Embedding::new(&mut store, "emb", 6, 3, &mut rng).unwrap();
    let fc = Linear::new(&mut store, "fc", 3, 2, &mut rng).unwrap();
    check(&mut store, &|cx| fc.forward(cx, emb.forward(cx, &[5, 0, 5, 2]).tanh()));
}
