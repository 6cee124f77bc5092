//! The tape's semantics: consumption, retention, no_grad, detach, the arena limit, the
//! first-error rule, anomaly detection, statistics and gradient buffers.

use tapir::{Error, Graph, ParamStore, Tensor};

fn t(data: &[f64], dims: &[usize]) -> Tensor<f64> {
    Tensor::from_slice(data, dims).unwrap()
}

#[test]
fn second_backward_is_an_error_unless_retained() {
    let x = t(&[3.0], &[1]);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        let y = (x * x).sum();
        s.backward(y).unwrap();
        assert_eq!(x.grad().unwrap(), &[6.0]); // d(x²)/dx = 2x
        let e = s.backward(y).unwrap_err();
        assert!(matches!(e, Error::BackwardTwice { .. }), "{e}");
        assert!(e.to_string().contains("semantics.rs"), "{e}");
    });
    g.scope(|s| {
        let x = s.leaf(&x);
        let y = (x * x * x).sum();
        s.backward_retain(y).unwrap();
        s.backward_retain(y).unwrap();
        // Each pass computes fresh gradients: 3x² = 27, not 54.
        assert_eq!(x.grad().unwrap(), &[27.0]);
        s.backward(y).unwrap();
        assert!(s.backward(y).is_err());
    });
}

#[test]
fn no_grad_and_detach_block_gradients() {
    let x = t(&[2.0, -1.0], &[2]);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        let frozen = s.no_grad(|| x.exp());
        assert!(!frozen.requires_grad());
        let stopped = x.square().detach();
        // L = Σ (x·frozen + stopped + x); dL/dx = frozen + 1 (frozen and stopped are constants).
        let loss = (x * frozen + stopped + x).sum();
        s.backward(loss).unwrap();
        let gx = x.grad().unwrap();
        assert!((gx[0] - (2f64.exp() + 1.0)).abs() < 1e-12);
        assert!((gx[1] - ((-1f64).exp() + 1.0)).abs() < 1e-12);
        assert!(frozen.grad().is_none());
    });
}

#[test]
fn with_grad_makes_a_new_leaf_sharing_the_value() {
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let c = s.tensor(&[1.0, 2.0], &[2]);
        let x = c.with_grad();
        assert_eq!(x.value().unwrap(), c.value().unwrap());
        let loss = (x * 3.0).sum();
        s.backward(loss).unwrap();
        assert_eq!(x.grad().unwrap(), &[3.0, 3.0]);
        assert!(c.grad().is_none());
    });
}

#[test]
fn branches_that_do_not_reach_the_loss_get_no_gradient() {
    let x = t(&[1.0], &[1]);
    let y = t(&[5.0], &[1]);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (x, y) = (s.leaf(&x), s.leaf(&y));
        let _unused = y.exp();
        let loss = (x * 2.0).sum();
        s.backward(loss).unwrap();
        assert_eq!(x.grad().unwrap(), &[2.0]);
        assert!(y.grad().is_none(), "y does not reach the loss");
    });
}

#[test]
fn arena_limit_is_an_error_not_an_abort() {
    let mut g = Graph::<f32>::new();
    g.set_arena_limit(Some(1024));
    g.scope(|s| {
        let a = s.zeros(&[100]); // 400 bytes
        let b = a.exp(); // 800
        let c = b.exp(); // 1200: over
        let d = c + a; // poisoned, no new error
        let e = s.check().unwrap_err();
        match &e {
            Error::ArenaLimit { op, requested, in_use, limit, .. } => {
                assert_eq!((*op, *requested, *in_use, *limit), ("exp", 400, 800, 1024));
            }
            other => panic!("expected ArenaLimit, got {other}"),
        }
        assert!(e.to_string().contains("requested 400 bytes") && e.to_string().contains("limit 1024"), "{e}");
        assert_eq!(d.value().unwrap_err(), e);
        // What was recorded before the error is still there.
        assert_eq!(s.stats().nodes, 2);
    });
    // The next scope starts clean.
    g.set_arena_limit(None);
    g.scope(|s| assert!(s.zeros(&[1000]).value().is_ok()));
}

#[test]
fn first_error_wins_and_names_op_shapes_and_line() {
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let a = s.zeros(&[2, 3]);
        let b = s.zeros(&[4]);
        let (bad, bad_line) = (a + b, line!());
        let worse = bad.matmul(a).softmax(7);
        let e = s.backward(worse.sum()).unwrap_err();
        let msg = e.to_string();
        assert!(matches!(e, Error::Broadcast { op: "add", .. }), "{msg}");
        assert!(msg.contains("[2, 3]") && msg.contains("[4]") && msg.contains("semantics.rs:"), "{msg}");
        assert_eq!(e.location().unwrap().line(), bad_line);
        assert!(bad.value().is_err() && worse.item().is_err() && bad.grad().is_none());
    });
}

#[test]
fn backward_needs_one_element() {
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let x = s.zeros(&[2, 2]).with_grad();
        let e = s.backward(x.exp()).unwrap_err();
        assert!(matches!(e, Error::NotScalar { op: "backward", .. }), "{e}");
        assert!(e.to_string().contains("[2, 2]"));
        // A one-element tensor of any rank is fine.
        s.backward(x.sum().reshape(&[1, 1])).unwrap();
    });
}

#[test]
fn anomaly_detection_names_the_first_non_finite_op() {
    let mut g = Graph::<f32>::new();
    g.set_anomaly_detection(true);
    g.scope(|s| {
        let x = s.tensor(&[-1.0, 4.0], &[2]);
        let ok = x.abs().sqrt();
        assert!(ok.value().is_ok());
        let bad = x.log(); // ln(-1) = NaN
        let e = s.check().unwrap_err();
        assert!(matches!(e, Error::NonFinite { op: "log", phase: "forward", .. }), "{e}");
        assert!(bad.value().is_err());
    });
    g.scope(|s| {
        // sqrt at 0 is finite forward, but its gradient 1/(2√0) is infinite.
        let x = s.tensor(&[0.0, 4.0], &[2]).with_grad();
        let y = x.sqrt().sum();
        let e = s.backward(y).unwrap_err();
        assert!(matches!(e, Error::NonFinite { op: "sqrt", phase: "backward", .. }), "{e}");
        assert!(e.to_string().contains("semantics.rs"), "{e}");
    });
}

#[test]
fn stats_report_nodes_bytes_and_high_water() {
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let a = s.zeros(&[256]);
        let _b = a.exp().sum();
        let st = s.stats();
        assert_eq!(st.nodes, 3);
        assert_eq!(st.arena.bytes_in_use, 256 * 4 * 2 + 4);
        // Three 40-byte nodes and two distinct shapes of 28 bytes ([256] is shared by the
        // zeros and their exp; the sum is []).
        assert_eq!(st.tape_bytes, 3 * 40 + 2 * 28);
    });
    let st = g.stats();
    assert_eq!(st.arena.bytes_in_use, 0);
    assert_eq!(st.arena.high_water, 256 * 4 * 2 + 4);
    assert!(st.arena.capacity >= st.arena.high_water);
}

#[test]
fn gradients_accumulate_into_a_buffer_and_mismatches_change_nothing() {
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", t(&[1.0, 2.0], &[2])).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    for _ in 0..2 {
        g.scope(|s| {
            let w = s.param(&store, w);
            // L = Σ w², so dL/dw = 2w; two passes add up to 4w.
            s.backward_into(w.square().sum(), &mut grads).unwrap();
        });
    }
    assert_eq!(grads.get(w).unwrap().data(), &[4.0, 8.0]);

    let mut other = ParamStore::<f64>::new();
    other.add("v", t(&[0.0; 3], &[3])).unwrap();
    let mut wrong = other.zeros_like().unwrap();
    g.scope(|s| {
        let w = s.param(&store, w);
        let e = s.backward_into(w.sum(), &mut wrong).unwrap_err();
        assert!(matches!(e, Error::WrongStore { op: "backward_into", .. }), "{e}");
    });
    assert_eq!(wrong.get(other.find("v").unwrap()).unwrap().data(), &[0.0; 3]);
}

#[test]
fn backward_into_a_zeroed_buffer_writes_its_slots_and_matches_the_added_path() {
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", t(&[0.5, -1.0, 2.0, 0.25, 1.5, -0.75], &[3, 2])).unwrap();
    let b = store.add("b", t(&[0.1, -0.2], &[2])).unwrap();
    let x = t(&[1.0, 2.0, -1.0, 0.5, 0.0, 1.0], &[2, 3]);
    // L = Σ tanh(x·w + b)² + Σ w⊙w: w is read by three nodes (its slot is shared), b by one
    // (its slot is lent). dL/db_j = Σ_i 2 tanh(z_ij)(1 − tanh²(z_ij)), z = x·w + b.
    let z = |i: usize, j: usize| {
        let (xs, ws, bs) = (x.data(), store.get(w).unwrap().data(), store.get(b).unwrap().data());
        (0..3).map(|k| xs[i * 3 + k] * ws[k * 2 + j]).sum::<f64>() + bs[j]
    };
    let db: Vec<f64> =
        (0..2).map(|j| (0..2).map(|i| 2.0 * z(i, j).tanh() * (1.0 - z(i, j).tanh().powi(2))).sum()).collect();
    let mut g = Graph::<f64>::new();
    // The reference: a plain backward, each node's share of w's gradient added here.
    let (mut dw, mut lent_in_pass) = (vec![0.0; 6], Vec::new());
    g.scope(|s| {
        let (w1, w2, w3, bv) = (s.param(&store, w), s.param(&store, w), s.param(&store, w), s.param(&store, b));
        let loss = (s.input(&x).matmul(w1) + bv).tanh().square().sum() + (w2 * w3).sum();
        s.backward(loss).unwrap();
        for v in [w1, w2, w3] {
            dw.iter_mut().zip(v.grad().unwrap()).for_each(|(d, g)| *d += g);
        }
        assert_close(bv.grad().unwrap(), &db);
    });
    let mut run = |grads: &mut tapir::GradBuffer<f64>| {
        g.scope(|s| {
            let (w1, w2, w3, bv) = (s.param(&store, w), s.param(&store, w), s.param(&store, w), s.param(&store, b));
            let loss = (s.input(&x).matmul(w1) + bv).tanh().square().sum() + (w2 * w3).sum();
            s.backward_into(loss, grads).unwrap();
            lent_in_pass.push(s.memory_report().lent_bytes);
            assert_close(bv.grad().unwrap(), &db); // a node's gradient either way
        })
    };
    let mut direct = store.zeros_like().unwrap();
    run(&mut direct);
    let mut added = store.zeros_like().unwrap();
    let _ = added.get_mut(w).unwrap(); // written access: the buffer is no longer known zero
    run(&mut added);
    for grads in [&direct, &added] {
        assert_close(grads.get(w).unwrap().data(), &dw);
        assert_close(grads.get(b).unwrap().data(), &db);
    }
    // A second pass into the written buffer adds: 2 × the gradient.
    run(&mut direct);
    assert_close(direct.get(b).unwrap().data(), &[2.0 * db[0], 2.0 * db[1]]);
    // Only b's two elements were lent, and only to the zeroed buffer's first pass.
    assert_eq!(lent_in_pass, [16, 0, 0]);
}

#[test]
fn backward_into_a_parameter_that_is_the_loss_gets_the_seed() {
    let mut store = ParamStore::<f64>::new();
    let c = store.add("c", t(&[3.0], &[])).unwrap();
    let mut grads = store.zeros_like().unwrap();
    Graph::<f64>::new().scope(|s| s.backward_into(s.param(&store, c), &mut grads)).unwrap();
    assert_eq!(grads.get(c).unwrap().data(), &[1.0]);
}

#[test]
fn an_error_during_backward_into_leaves_a_zeroed_buffer_zero_and_lendable() {
    let mut store = ParamStore::<f64>::new();
    let z = store.add("z", t(&[0.0], &[1])).unwrap();
    let b = store.add("b", t(&[0.5, -2.0], &[2])).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    g.set_anomaly_detection(true);
    g.scope(|s| {
        // The walk reaches b's square first (writing 2b into b's lent slot), then sqrt at
        // 0, whose gradient is infinite.
        let (zv, bv) = (s.param(&store, z), s.param(&store, b));
        let loss = zv.sqrt().sum() + bv.square().sum();
        let e = s.backward_into(loss, &mut grads).unwrap_err();
        assert!(matches!(e, Error::NonFinite { op: "sqrt", phase: "backward", .. }), "{e}");
        assert_eq!((bv.grad(), zv.grad()), (None, None), "the lent slots were taken back");
    });
    assert!(grads.as_slice().iter().all(|&v| v == 0.0), "{:?}", grads.as_slice());
    let lent = g.scope(|s| {
        let loss = s.param(&store, b).square().sum();
        s.backward_into(loss, &mut grads).unwrap();
        s.memory_report().lent_bytes
    });
    assert_eq!(lent, 16, "the buffer is still known to be zero, so its slots are lent");
    assert_eq!(grads.get(b).unwrap().data(), &[1.0, -4.0]);
}

#[test]
fn backward_into_reuses_the_buffers_of_consumed_intermediate_gradients() {
    // h_{k+1} = tanh(h_k · w_k), three layers, x [2, 4] and w_k [4, 4] all leaves (no
    // parameters, so nothing is lent and the difference is the release alone).
    let x = t(&[0.5, -1.0, 0.25, 2.0, -0.5, 1.5, 1.0, -2.0], &[2, 4]);
    let w: Vec<Tensor<f64>> = (0..3)
        .map(|k| t(&(0..16).map(|i| ((i * 7 + k * 3) % 11) as f64 / 11.0 - 0.5).collect::<Vec<_>>(), &[4, 4]))
        .collect();
    let store = ParamStore::<f64>::new();
    let run = |release: bool| {
        let mut g = Graph::<f64>::new();
        let mut grads = store.zeros_like().unwrap();
        let (gx, gw, report, hidden_grad) = g.scope(|s| {
            let (xv, wv) = (s.leaf(&x), [s.leaf(&w[0]), s.leaf(&w[1]), s.leaf(&w[2])]);
            let h0 = xv.matmul(wv[0]).tanh();
            let loss = h0.matmul(wv[1]).tanh().matmul(wv[2]).tanh().sum();
            if release { s.backward_into(loss, &mut grads) } else { s.backward(loss) }.unwrap();
            let gw: Vec<Vec<f64>> = wv.iter().map(|v| v.grad().unwrap().to_vec()).collect();
            (xv.grad().unwrap().to_vec(), gw, s.memory_report(), h0.grad().is_some())
        });
        (gx, gw, report, hidden_grad, g.stats().arena.high_water)
    };
    let (kept, released) = (run(false), run(true));
    // The same gradients for every leaf either way.
    assert_close(&released.0, &kept.0);
    for (r, k) in released.1.iter().zip(&kept.1) {
        assert_close(r, k);
    }
    // Intermediate gradients are kept by `backward` only.
    assert_eq!((kept.3, released.3), (true, false));
    // Of the seven [2, 4] gradients `backward` allocates (six intermediate nodes and x),
    // the releasing pass allocates two and reuses them alternately; x takes one of them.
    // What is left unreused at the end: the seed (1 element) and the other [2, 4] buffer.
    assert_eq!(kept.4 - released.4, 5 * 8 * 8, "arena high-water marks {} and {}", kept.4, released.4);
    assert_eq!((kept.2.released_bytes, released.2.released_bytes), (0, 8 + 8 * 8));
}

/// `backward_into` of `loss(p, leaves)`, `leaves` the scope's leaves of `extra`: `p`'s
/// gradient, written into a zeroed buffer.
fn grad_into(
    p: &Tensor<f64>,
    extra: &[Tensor<f64>],
    loss: impl for<'s> Fn(tapir::Var<'s, f64>, &[tapir::Var<'s, f64>]) -> tapir::Var<'s, f64>,
) -> Vec<f64> {
    let mut store = ParamStore::<f64>::new();
    let id = store.add("p", p.clone()).unwrap();
    let mut grads = store.zeros_like().unwrap();
    Graph::<f64>::new()
        .scope(|s| {
            let leaves: Vec<_> = extra.iter().map(|e| s.leaf(e)).collect();
            s.backward_into(loss(s.param(&store, id), &leaves), &mut grads)
        })
        .unwrap();
    grads.get(id).unwrap().data().to_vec()
}

#[test]
fn first_product_gradients_written_into_reused_buffers_are_exact() {
    // A product writes its input's first gradient (no zero-fill, no add) where it covers
    // every element. In each case below `h = 2p` (6 elements) takes its first gradient
    // from a product, after `q = 3p` (recorded later, so walked earlier) released a
    // 6-element buffer still holding `∂L/∂q = 1`: any element the product does not write
    // would read 1 and show up in `∂L/∂p = 2·∂L/∂h + 3`.
    let p = t(&[0.5, -1.0, 2.0, 0.25, 1.5, -0.75], &[3, 2]);

    // An empty product: `h [3, 2] · z [2, 0]` has no element, so `∂L/∂h = 0`.
    let z = Tensor::<f64>::zeros(&[2, 0]).unwrap();
    let got = grad_into(&p, &[z], |pv, l| {
        let e = pv.mul_scalar(2.0).matmul(l[0]);
        e.sum() + pv.mul_scalar(3.0).sum()
    });
    assert_eq!(got, [3.0; 6], "empty matmul");
    // The same through `linear`, whose batch is empty: `x [0, 3] · h [3, 2] + b`.
    let (x0, b) = (Tensor::<f64>::zeros(&[0, 3]).unwrap(), t(&[0.1, -0.2], &[2]));
    let got = grad_into(&p, &[x0, b], |pv, l| {
        let e = l[0].linear(pv.mul_scalar(2.0), l[1]);
        e.sum() + pv.mul_scalar(3.0).sum()
    });
    assert_eq!(got, [3.0; 6], "empty linear");

    // A broadcast operand: `h [2, 3]` times `c [4, 3, 5]` sums four products into `∂L/∂h`,
    // `∂L/∂h[i][j] = Σ_b Σ_n c[b][j][n]` for `L = Σ h·c`.
    let p23 = t(&[0.5, -1.0, 2.0, 0.25, 1.5, -0.75], &[2, 3]);
    let cv: Vec<f64> = (0..60).map(|i| ((i * 7) % 13) as f64 / 13.0 - 0.5).collect();
    let c = t(&cv, &[4, 3, 5]);
    let got = grad_into(&p23, &[c], |pv, l| {
        let e = pv.mul_scalar(2.0).matmul(l[0]);
        e.sum() + pv.mul_scalar(3.0).sum()
    });
    let want: Vec<f64> = (0..6)
        .map(|ij| {
            let j = ij % 3;
            2.0 * (0..4).map(|b| (0..5).map(|n| cv[b * 15 + j * 5 + n]).sum::<f64>()).sum::<f64>() + 3.0
        })
        .collect();
    assert_close(&got, &want);

    // A parameter used as both operands, its slot lent: the first product is written,
    // the second added. `L = Σ (X·X)`: `∂L/∂X[i][j] = Σ_k X[j][k] + Σ_k X[k][i]`.
    let xv = [0.5, -1.0, 2.0, 0.25, 1.5, -0.75, 1.0, 0.0, -2.0];
    let got = grad_into(&t(&xv, &[3, 3]), &[], |pv, _| pv.matmul(pv).sum());
    let want: Vec<f64> = (0..9)
        .map(|ij| {
            let (i, j) = (ij / 3, ij % 3);
            (0..3).map(|k| xv[j * 3 + k] + xv[k * 3 + i]).sum()
        })
        .collect();
    assert_close(&got, &want);

    // A broadcast operand over a batch large enough that its gradient sums in groups
    // (`h [16, 24]` times `c [64, 24, 32]`: 11 groups): the group sums are written over
    // the reused buffer. `∂L/∂h[i][j] = Σ_b Σ_n c[b][j][n]`.
    let pg = Tensor::from_vec((0..384).map(|i| ((i * 5) % 17) as f64 / 17.0 - 0.5).collect(), &[16, 24]).unwrap();
    let cg: Vec<f64> = (0..64 * 24 * 32).map(|i| ((i * 7) % 13) as f64 / 13.0 - 0.5).collect();
    let got = grad_into(&pg, &[t(&cg, &[64, 24, 32])], |pv, l| {
        pv.mul_scalar(2.0).matmul(l[0]).sum() + pv.mul_scalar(3.0).sum()
    });
    let want: Vec<f64> = (0..384)
        .map(|ij| {
            let j = ij % 24;
            2.0 * (0..64).map(|b| (0..32).map(|n| cg[b * 768 + j * 32 + n]).sum::<f64>()).sum::<f64>() + 3.0
        })
        .collect();
    assert_close(&got, &want);

    // 2×2 max pooling with stride 2 on an even-sized image writes every element of its
    // input's first gradient: `∂L/∂h` is 1 at each window's maximum and 0 elsewhere.
    let pv16: Vec<f64> = (0..16).map(|i| ((i * 7) % 16) as f64).collect();
    let got = grad_into(&t(&pv16, &[1, 1, 4, 4]), &[], |pv, _| {
        pv.mul_scalar(2.0).max_pool2d([2, 2], [2, 2], [0, 0]).sum() + pv.mul_scalar(3.0).sum()
    });
    let want: Vec<f64> = (0..16)
        .map(|i| {
            let (r, c) = (i / 4, i % 4);
            let window = (0..4).map(|t| (r / 2 * 2 + t / 2) * 4 + c / 2 * 2 + t % 2);
            let top = window.max_by(|&a, &b| pv16[a].total_cmp(&pv16[b])).unwrap();
            if top == i {
                2.0 + 3.0
            } else {
                3.0
            }
        })
        .collect();
    assert_close(&got, &want);
}

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len());
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() <= 1e-12 * (1.0 + w.abs()), "{got:?} vs {want:?}");
    }
}

#[test]
fn operators_read_like_the_math() {
    // f(x, y) = (2x + y) / y - x·3 + 1 - y, at x = 1, y = 2:
    // ∂f/∂x = 2/y - 3 = -2; ∂f/∂y = -2x/y² - 1 = -1.5.
    let (x0, y0) = (t(&[1.0], &[]), t(&[2.0], &[]));
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (x, y) = (s.leaf(&x0), s.leaf(&y0));
        let f = (2.0 * x + y) / y - x * 3.0 + 1.0 - y;
        assert_eq!(f.item().unwrap(), 2.0 - 3.0 + 1.0 - 2.0);
        s.backward(f).unwrap();
        assert_eq!(x.grad().unwrap(), &[-2.0]);
        assert_eq!(y.grad().unwrap(), &[-1.5]);
    });
}

#[test]
fn tape_dump_and_dot_show_ops_and_shapes() {
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let x = s.zeros(&[2, 3]).with_grad();
        let _ = (x * x).sum();
        let dump = s.dump();
        assert!(dump.contains("%2 = mul %1 %1 : [2, 3] grad"), "{dump}");
        let dot = s.to_dot();
        assert!(dot.starts_with("digraph") && dot.contains("n1 -> n2"), "{dot}");
    });
}

/// A unary op's first gradient is built in one pass (on one thread) or zeroed and added to
/// (on several, for long values): both give the same bits, and a second contribution adds
/// to the first. `x·(−0)` has the gradient `−0·1`, which an accumulating buffer stores as
/// `0 + (−0) = +0`; the one-pass path must too.
#[test]
fn first_gradients_written_in_one_pass_match_the_accumulating_path() {
    for n in [4usize, 17, 100, 40_000] {
        let data: Vec<f32> = (0..n).map(|i| ((i % 97) as f32 - 48.0) / 20.0).collect();
        let x = Tensor::from_slice(&data, &[n]).unwrap();
        let mut bits = Vec::new();
        for threads in [1, 2] {
            let mut g = Graph::<f32>::new();
            g.set_threads(threads);
            g.scope(|s| {
                let x = s.leaf(&x);
                // L = Σ tanh(x) + Σ 3x + Σ x·(−0): tanh's first gradient, then two added.
                let loss = x.tanh().sum() + (x * 3.0).sum() + x.mul_scalar(-0.0).sum();
                s.backward(loss).unwrap();
                let gx = x.grad().unwrap().to_vec();
                for (&v, &xi) in gx.iter().zip(&data) {
                    let want = 1.0 - (xi as f64).tanh().powi(2) + 3.0;
                    assert!((v as f64 - want).abs() < 1e-5, "n {n}: {v} against {want}");
                }
                bits.push(gx.iter().map(|v| v.to_bits()).collect::<Vec<_>>());
            });
            g.scope(|s| {
                let x = s.leaf(&x);
                s.backward(x.mul_scalar(-0.0).sum()).unwrap();
                assert!(x.grad().unwrap().iter().all(|v| v.to_bits() == 0), "n {n}, {threads} threads: −0 kept");
            });
        }
        assert_eq!(bits[0], bits[1], "n {n}: 1 and 2 threads differ");
    }
}
