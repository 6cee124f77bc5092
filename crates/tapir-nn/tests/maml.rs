//! A MAML step through a functional call ([`Ctx::with_params`]): the meta-gradient of
//! `L_q(θ − α∇L_s(θ))`, which differentiates through the inner gradient step, against
//! central finite differences in f64 of the same function with the inner gradient taken
//! by the first-order `backward_into` path (independent of the recorded derivatives).

use rand::SeedableRng;
use tapir::{Graph, ParamId, ParamStore, Tensor};
use tapir_nn::{flatten_params, unflatten_params, Activation, Ctx, Mlp, Module};

const ALPHA: f64 = 0.3;

struct Task {
    xs: Tensor<f64>,
    ys: Tensor<f64>,
    xq: Tensor<f64>,
    yq: Tensor<f64>,
}

fn task() -> Task {
    let t = |v: Vec<f64>| {
        let n = v.len();
        Tensor::from_vec(v, &[n, 1]).unwrap()
    };
    let xs = vec![-1.0, -0.4, 0.3, 0.9];
    let xq = vec![-0.7, 0.1, 0.6];
    let f = |x: &f64| (2.0 * x + 0.5).sin();
    Task { ys: t(xs.iter().map(f).collect()), yq: t(xq.iter().map(f).collect()), xs: t(xs), xq: t(xq) }
}

fn model(store: &mut ParamStore<f64>) -> (Mlp, Vec<ParamId>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let m = Mlp::builder(1).hidden(6).activation(Activation::Tanh).output(1).build(store, "mlp", &mut rng).unwrap();
    let ids = store.iter().map(|(id, _, _)| id).collect();
    (m, ids)
}

/// The meta-loss `L_q(θ − α∇L_s(θ))` at `theta`, with `∇L_s` from `backward_into`.
fn meta_loss_reference(store: &ParamStore<f64>, m: &Mlp, ids: &[ParamId], theta: &[f64], t: &Task) -> f64 {
    let mut store = store.clone();
    unflatten_params(&mut store, ids, theta).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    graph
        .scope(|s| {
            let l = (m.forward(Ctx::eval(s, &store), s.input(&t.xs)) - s.input(&t.ys)).square().mean();
            s.backward_into(l, &mut grads)
        })
        .unwrap();
    let mut g = Vec::new();
    for &id in ids {
        g.extend_from_slice(grads.get(id).unwrap().data());
    }
    let adapted: Vec<f64> = theta.iter().zip(&g).map(|(p, d)| p - ALPHA * d).collect();
    unflatten_params(&mut store, ids, &adapted).unwrap();
    graph.scope(|s| (m.forward(Ctx::eval(s, &store), s.input(&t.xq)) - s.input(&t.yq)).square().mean().item()).unwrap()
}

#[test]
fn maml_meta_gradient_matches_finite_differences() {
    let mut store = ParamStore::<f64>::new();
    let (m, ids) = model(&mut store);
    let t = task();
    let theta = flatten_params(&store, &ids).unwrap();
    let mut graph = Graph::<f64>::new();
    let (meta, meta_grad) = graph
        .scope(|s| {
            let th = s.leaf(&theta);
            let cx = Ctx::eval(s, &store);
            let inner = (m.forward(cx.with_params(th, &ids), s.input(&t.xs)) - s.input(&t.ys)).square().mean();
            let [g] = s.grad(inner, [th])?;
            let adapted = th - g * ALPHA;
            let outer = (m.forward(cx.with_params(adapted, &ids), s.input(&t.xq)) - s.input(&t.yq)).square().mean();
            let [dtheta] = s.grad(outer, [th])?;
            Ok::<_, tapir::Error>((outer.item()?, dtheta.to_tensor()?))
        })
        .unwrap();
    let theta = theta.data().to_vec();
    let reference = meta_loss_reference(&store, &m, &ids, &theta, &t);
    assert!((meta - reference).abs() <= 1e-12 * reference.abs().max(1.0), "{meta} vs {reference}");
    for (i, (&t_i, &analytic)) in theta.iter().zip(meta_grad.data()).enumerate() {
        let h = 1e-6 * t_i.abs().max(1.0);
        let (mut p, mut q) = (theta.clone(), theta.clone());
        p[i] += h;
        q[i] -= h;
        let numeric =
            (meta_loss_reference(&store, &m, &ids, &p, &t) - meta_loss_reference(&store, &m, &ids, &q, &t)) / (2.0 * h);
        assert!(
            (analytic - numeric).abs() <= 1e-6 + 1e-4 * analytic.abs().max(numeric.abs()),
            "θ[{i}]: {analytic} vs {numeric}"
        );
    }
}

#[test]
fn maml_differs_from_first_order() {
    // Dropping the second-order term (treating ∇L_s as a constant) changes the
    // meta-gradient, so the test above checks the differentiation through the inner step.
    let mut store = ParamStore::<f64>::new();
    let (m, ids) = model(&mut store);
    let t = task();
    let theta = flatten_params(&store, &ids).unwrap();
    let mut graph = Graph::<f64>::new();
    let diff = graph
        .scope(|s| {
            let th = s.leaf(&theta);
            let cx = Ctx::eval(s, &store);
            let inner = (m.forward(cx.with_params(th, &ids), s.input(&t.xs)) - s.input(&t.ys)).square().mean();
            let [g] = s.grad(inner, [th])?;
            let g_const = s.tensor(g.value()?, &[theta.numel()]);
            let full =
                (m.forward(cx.with_params(th - g * ALPHA, &ids), s.input(&t.xq)) - s.input(&t.yq)).square().mean();
            let first = (m.forward(cx.with_params(th - g_const * ALPHA, &ids), s.input(&t.xq)) - s.input(&t.yq))
                .square()
                .mean();
            let [a] = s.grad(full, [th])?;
            let [b] = s.grad(first, [th])?;
            let (a, b) = (a.to_tensor()?, b.to_tensor()?);
            Ok::<_, tapir::Error>(a.data().iter().zip(b.data()).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max))
        })
        .unwrap();
    assert!(diff > 1e-4, "second-order term {diff}");
}

#[test]
fn with_params_of_the_wrong_length_is_an_error() {
    let mut store = ParamStore::<f64>::new();
    let (m, ids) = model(&mut store);
    let t = task();
    let short = Tensor::<f64>::zeros(&[3]).unwrap();
    let mut graph = Graph::<f64>::new();
    let err = graph
        .scope(|s| m.forward(Ctx::eval(s, &store).with_params(s.leaf(&short), &ids), s.input(&t.xs)).sum().item())
        .unwrap_err();
    assert!(err.to_string().contains("reshape"), "{err}");
}

#[test]
fn with_params_of_another_store_is_a_wrong_store_error_at_the_call() {
    let mut store = ParamStore::<f64>::new();
    let (m, _) = model(&mut store);
    // A second model of the same architecture: its ids are valid positions in `store`, so
    // before the check the layers read `store`'s values and ignored the override.
    let mut other = ParamStore::<f64>::new();
    let (_, foreign) = model(&mut other);
    let t = task();
    let theta = flatten_params(&other, &foreign).unwrap();
    let mut graph = Graph::<f64>::new();
    let mut line = 0;
    let err = graph
        .scope(|s| {
            let cx = Ctx::eval(s, &store);
            line = line!() + 1;
            let cx = cx.with_params(s.leaf(&theta), &foreign);
            m.forward(cx, s.input(&t.xs)).sum().item()
        })
        .unwrap_err();
    let (expected, found) = (other.id(), store.id());
    assert!(
        matches!(err, tapir::Error::WrongStore { op: "Ctx::with_params", expected: e, found: f, .. } if e == expected && f == found),
        "{err}"
    );
    let at = err.location().expect("a located error");
    assert_eq!((at.file(), at.line()), (file!(), line), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "Ctx::with_params: parameter #0 belongs to parameter store #{expected}, but was used with store #{found} (at {at})"
        )
    );
}
