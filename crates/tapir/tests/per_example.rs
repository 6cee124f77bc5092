//! `Scope::per_example` against independent references: each example's gradient from a
//! separate backward pass over that example alone (a batch of one), in f64, on distinct
//! random examples and weights; the norms and weighted sums against those same separate
//! gradients; and every refusal naming its op and the caller's line.

use rand::{RngExt, SeedableRng};
use tapir::{Error, Graph, Scope, Tensor, Var};

/// A loss of a batch: `(scope, the batch's example values, parameters, first example,
/// number of examples) -> loss`, where the loss is the sum of per-example terms.
type Loss<'a> =
    &'a dyn for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, Var<'s, f64>, &[Var<'s, f64>], usize, usize) -> Var<'s, f64>;

fn random(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n = dims.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-1.0..1.0)).collect(), dims).unwrap()
}

/// Example `e`'s rows of `x` (axis 0 holds `batch` examples).
fn rows(x: &Tensor<f64>, batch: usize, e: usize) -> Tensor<f64> {
    let per = x.numel() / batch;
    let mut dims = x.dims();
    dims[0] /= batch;
    Tensor::from_vec(x.data()[e * per..(e + 1) * per].to_vec(), &dims).unwrap()
}

/// Each parameter's gradient for each example alone: `[param][example] -> gradient`.
fn separate(x: &Tensor<f64>, batch: usize, params: &[Tensor<f64>], loss: Loss<'_>) -> Vec<Vec<Vec<f64>>> {
    let mut graph = Graph::<f64>::new();
    let mut out = vec![vec![]; params.len()];
    for e in 0..batch {
        let xe = rows(x, batch, e);
        graph.scope(|s| {
            let ps: Vec<_> = params.iter().map(|p| s.leaf(p)).collect();
            s.backward(loss(s, s.input(&xe), &ps, e, 1)).unwrap();
            for (o, p) in out.iter_mut().zip(&ps) {
                o.push(p.grad().map_or(vec![0.0; p.shape().numel()], <[f64]>::to_vec));
            }
        });
    }
    out
}

fn close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-10 * (1.0 + x.abs().max(y.abs())), "{what}[{i}]: {x} vs {y}");
    }
}

/// Runs the batched transform and checks grads, norms, weighted and clipped sums against
/// the separate passes.
fn check(x: &Tensor<f64>, batch: usize, params: &[Tensor<f64>], loss: Loss<'_>) {
    let want = separate(x, batch, params, loss);
    let weights: Vec<f64> = (0..batch).map(|e| 0.5 + e as f64).collect();
    let want_norms: Vec<f64> =
        (0..batch).map(|e| want.iter().map(|w| w[e].iter().map(|v| v * v).sum::<f64>()).sum::<f64>().sqrt()).collect();
    // A bound between the norms: some examples are scaled, some are not.
    let mut sorted = want_norms.clone();
    sorted.sort_by(f64::total_cmp);
    let bound = sorted[batch / 2];
    assert!(sorted[0] < bound, "the norms must differ: {sorted:?}");
    let mut graph = Graph::<f64>::new();
    let (grads, norms, sums, (clip_norms, clipped)) = graph.scope(|s| {
        let ps: Vec<_> = params.iter().map(|p| s.leaf(p)).collect();
        let xv = s.input(x);
        let per = s.per_example(loss(s, xv, &ps, 0, batch), (batch, &[xv]), &ps).unwrap();
        assert_eq!(per.batch(), batch);
        (
            per.grads().unwrap(),
            per.norms().unwrap(),
            per.weighted_sum(&weights).unwrap(),
            per.clipped_sum(bound).unwrap(),
        )
    });
    for (i, (g, w)) in grads.iter().zip(&want).enumerate() {
        let mut dims = vec![batch];
        dims.extend(params[i].dims());
        assert_eq!(g.dims(), dims, "parameter {i}'s per-example shape");
        let flat: Vec<f64> = w.concat();
        close(g.data(), &flat, &format!("parameter {i}"));
        let mut sum = vec![0.0; params[i].numel()];
        for (e, we) in w.iter().enumerate() {
            for (s, v) in sum.iter_mut().zip(we) {
                *s += weights[e] * v;
            }
        }
        close(sums[i].data(), &sum, &format!("weighted sum of parameter {i}"));
    }
    close(&norms, &want_norms, "norms");
    close(&clip_norms, &want_norms, "clipped_sum's norms");
    for (i, w) in want.iter().enumerate() {
        let mut sum = vec![0.0; params[i].numel()];
        for (e, we) in w.iter().enumerate() {
            for (s, v) in sum.iter_mut().zip(we) {
                *s += (bound / want_norms[e]).min(1.0) * v;
            }
        }
        close(clipped[i].data(), &sum, &format!("clipped sum of parameter {i}"));
    }
}

#[test]
fn mlp_with_bias_gain_and_a_sum_loss() {
    let (b, k, h, o) = (4, 3, 5, 2);
    let x = random(&[b, k], 1);
    let r = random(&[b, o], 2);
    let params = [random(&[k, h], 3), random(&[h], 4), random(&[h, o], 5), random(&[o], 6), random(&[o], 7)];
    check(&x, b, &params, &|s, x, p, e0, n| {
        let r = s.tensor(&r.data()[e0 * o..(e0 + n) * o], &[n, o]);
        let z = x.linear(p[0], p[1]).tanh();
        let y = (z.matmul(p[2]) + p[3]) * p[4];
        (y.square() * r).sum()
    });
}

#[test]
fn sequences_through_linear_layer_norm_and_a_product() {
    // Two rows per example (the Gram form of the norm for w2: 2·(8 + 8) ≤ 8·8), and a
    // linear with 3·(3 + 4) > 3·4 (the norm formed per example).
    let (b, t, k, c, d) = (3, 2, 3, 4, 8);
    let x = random(&[b, t, k], 11);
    let r = random(&[b, t, d], 12);
    let params = [random(&[k, c], 13), random(&[c], 14), random(&[c], 15), random(&[c], 16), random(&[c, d], 17)];
    let _ = (t, d);
    check(&x, b, &params, &|s, x, p, e0, n| {
        let r = s.tensor(&r.data()[e0 * t * d..(e0 + n) * t * d], &[n, t, d]);
        let y = x.linear(p[0], p[1]).layer_norm(p[2], p[3], 1e-5);
        (y.matmul(p[4]).tanh() * r).sum()
    });
}

#[test]
fn mean_cross_entropy_carries_the_means_share() {
    let (b, k, c) = (5, 4, 3);
    let x = random(&[b, k], 21);
    let labels = [0usize, 2, 1, 1, 0];
    let params = [random(&[k, c], 22), random(&[c], 23)];
    // The batched loss is the mean of the terms; the separate pass is one term (a mean
    // over one), so the reference is scaled by 1/B.
    let loss: Loss<'_> = &|_, x, p, e0, n| {
        let term = x.linear(p[0], p[1]).cross_entropy(&labels[e0..e0 + n]);
        if n == 1 {
            term.mul_scalar(1.0 / b as f64)
        } else {
            term
        }
    };
    check(&x, b, &params, loss);
}

#[test]
fn a_weight_read_twice_sums_its_uses_per_example() {
    // `w` in a product and, transposed, in another: two boundaries, one parameter.
    let (b, k) = (3, 4);
    let x = random(&[b, k], 31);
    let params = [random(&[k, k], 32)];
    check(&x, b, &params, &|_, x, p, _, _| {
        let h = x.matmul(p[0]).tanh();
        h.matmul(p[0].t()).square().sum()
    });
}

/// The error of `per_example` over a program of `x: [4, 3]` and `w: [3, 3]`, and the
/// line it was called from; the tape must still run an ordinary backward afterwards.
fn refusal(batch: usize, program: Loss<'_>) -> (Error, u32) {
    let x = random(&[4, 3], 41);
    let w = random(&[3, 3], 42);
    let mut graph = Graph::<f64>::new();
    graph.scope(|s| {
        let (xv, wv) = (s.input(&x), s.leaf(&w));
        let loss = program(s, xv, &[wv], 0, 4);
        let (e, line) = (s.per_example(loss, (batch, &[xv]), &[wv]).unwrap_err(), line!());
        s.backward(loss).expect("a refused transform leaves the tape as it was");
        assert!(wv.grad().is_some());
        (e, line)
    })
}

fn refused_at(batch: usize, culprit: &str, program: Loss<'_>) {
    refused_naming(batch, (culprit, "[4, 3]"), program);
}

fn refused_naming(batch: usize, (culprit, shape): (&str, &str), program: Loss<'_>) {
    let (e, line) = refusal(batch, program);
    match &e {
        Error::PerExampleUnsupported { culprit: c, location, .. } => {
            assert_eq!(*c, culprit, "{e}");
            assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
        }
        _ => panic!("expected PerExampleUnsupported naming {culprit}, got {e}"),
    }
    assert!(e.to_string().contains(shape), "shapes named: {e}");
}

#[test]
fn ops_that_combine_examples_are_refused_by_name() {
    refused_at(4, "softmax", &|_, x, p, _, _| x.matmul(p[0]).softmax(0).square().sum());
    refused_at(4, "permute", &|_, x, p, _, _| x.t().matmul(x.matmul(p[0])).square().sum());
    refused_naming(4, ("matmul", "[3, 4], [4, 3]"), &|s, x, p, _, _| {
        s.full(&[3, 4], 1.0).matmul(x.matmul(p[0])).square().sum()
    });
    refused_naming(4, ("tanh", "[3]"), &|_, x, p, _, _| x.matmul(p[0]).sum_axes(&[0], false).tanh().sum());
    refused_at(4, "max_axes", &|_, x, p, _, _| x.matmul(p[0]).max_axes(&[0], false).sum());
}

#[test]
fn a_parameter_through_an_op_without_a_rule_is_refused() {
    refused_naming(4, ("exp", "[3, 3]"), &|_, x, p, _, _| x.matmul(p[0].exp()).square().sum());
}

#[test]
fn a_loss_term_without_examples_is_refused() {
    refused_naming(4, ("add", "[], []"), &|_, x, p, _, _| x.matmul(p[0]).square().sum() + p[0].square().sum());
}

#[test]
fn a_batch_that_does_not_divide_the_rows_is_refused() {
    let (e, _) = refusal(3, &|_, x, p, _, _| x.matmul(p[0]).square().sum());
    assert!(matches!(e, Error::PerExampleUnsupported { .. }), "{e}");
    assert!(e.to_string().contains("3 examples"), "{e}");
}

#[test]
fn nodes_beside_the_loss_may_combine_examples() {
    // A batch statistic that the loss does not read, and one read under no_grad.
    let x = random(&[4, 3], 51);
    let w = random(&[3, 2], 52);
    let mut graph = Graph::<f64>::new();
    let per = graph.scope(|s| {
        let (xv, wv) = (s.input(&x), s.leaf(&w));
        let y = xv.matmul(wv);
        let _accuracy_like = y.softmax(0).max_axes(&[0], false);
        s.per_example(y.square().sum(), (4, &[xv]), &[wv]).unwrap().grads().unwrap()
    });
    // gₑ = 2 xₑᵀ (xₑ w): an independent closed form.
    for e in 0..4 {
        let xe = &x.data()[e * 3..(e + 1) * 3];
        let ye: Vec<f64> = (0..2).map(|j| (0..3).map(|i| xe[i] * w.data()[i * 2 + j]).sum()).collect();
        for (i, &xi) in xe.iter().enumerate() {
            for (j, &yj) in ye.iter().enumerate() {
                let got = per[0].data()[e * 6 + i * 2 + j];
                assert!((got - 2.0 * xi * yj).abs() < 1e-12);
            }
        }
    }
}

#[test]
fn grads_into_overwrites_reused_tensors_and_replaces_misshapen_ones() {
    let (b, k) = (3, 4);
    let x = random(&[b, k], 61);
    let (w, v) = (random(&[k, k], 62), random(&[k, 2], 63));
    let mut graph = Graph::<f64>::new();
    // Stale values everywhere: one tensor of the right shape, one of a wrong shape.
    let mut out = vec![Tensor::from_vec(vec![7.0; b * k * k], &[b, k, k]).unwrap(), Tensor::zeros(&[1]).unwrap()];
    let fresh = graph.scope(|s| {
        let (xv, wv, vv) = (s.input(&x), s.leaf(&w), s.leaf(&v));
        // `w` read twice (through the lane's buffers), `v` once (written directly).
        let loss = x_loss(xv, wv, vv);
        let per = s.per_example(loss, (b, &[xv]), &[wv, vv]).unwrap();
        per.grads_into(&mut out).unwrap();
        per.grads().unwrap()
    });
    assert_eq!(out.len(), 2);
    for (a, f) in out.iter().zip(&fresh) {
        assert_eq!(a.dims(), f.dims());
        assert_eq!(a.data(), f.data());
    }
}

fn x_loss<'s>(x: Var<'s, f64>, w: Var<'s, f64>, v: Var<'s, f64>) -> Var<'s, f64> {
    x.matmul(w).tanh().matmul(w).matmul(v).square().sum()
}
