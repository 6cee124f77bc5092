//! Every differentiable op's backward against central finite differences in f64, over
//! random shapes (broadcasting, size-1 and zero-size dimensions, tile edges for matmul),
//! through the public `tapir::testing::gradcheck`. Inputs are steered away from kinks
//! (`abs`, `relu`, `clamp` edges, `max` ties) by construction.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use tapir::testing::{gradcheck, GradcheckOptions};
use tapir::{Graph, Scope, Tensor, Var};

/// How to draw input values.
#[derive(Clone, Copy)]
enum Draw {
    /// Uniform in [-2, 2].
    Any,
    /// Uniform in [0.5, 2].
    Positive,
    /// Magnitude in [0.2, 2], random sign: away from 0.
    AwayFromZero,
}

fn tensor(dims: &[usize], seed: u64, draw: Draw) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    let data = (0..n)
        .map(|_| match draw {
            Draw::Any => rng.random_range(-2.0..2.0),
            Draw::Positive => rng.random_range(0.5..2.0),
            Draw::AwayFromZero => {
                let m = rng.random_range(0.2..2.0);
                if rng.random_bool(0.5) {
                    m
                } else {
                    -m
                }
            }
        })
        .collect();
    Tensor::from_vec(data, dims).unwrap()
}

fn dims(
    rank: std::ops::RangeInclusive<usize>,
    size: std::ops::RangeInclusive<usize>,
) -> impl Strategy<Value = Vec<usize>> {
    prop::collection::vec(size, rank)
}

/// A pair of shapes that broadcast: the second drops leading axes and sets some to 1.
fn broadcast_pair() -> impl Strategy<Value = (Vec<usize>, Vec<usize>)> {
    (dims(0..=3, 0..=4), any::<u64>()).prop_map(|(a, bits)| {
        let drop = (bits % (a.len() as u64 + 1)) as usize;
        let b: Vec<usize> =
            a[drop..].iter().enumerate().map(|(i, &d)| if bits >> (8 + i) & 1 == 1 { 1 } else { d }).collect();
        if bits >> 20 & 1 == 1 {
            (b, a)
        } else {
            (a, b)
        }
    })
}

fn check<F>(inputs: &[Tensor<f64>], seed: u64, f: F) -> Result<(), TestCaseError>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    gradcheck(inputs, GradcheckOptions { seed, ..GradcheckOptions::default() }, f)
        .map(|_| ())
        .map_err(|e| TestCaseError::fail(e.to_string()))
}

macro_rules! binary_case {
    ($name:ident, $da:expr, $db:expr, $f:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(24))]
            #[test]
            fn $name((a, b) in broadcast_pair(), seed: u64) {
                check(&[tensor(&a, seed, $da), tensor(&b, seed ^ 1, $db)], seed, $f)?;
            }
        }
    };
}

binary_case!(add_broadcast, Draw::Any, Draw::Any, |_, v| v[0] + v[1]);
binary_case!(sub_broadcast, Draw::Any, Draw::Any, |_, v| v[0] - v[1]);
binary_case!(mul_broadcast, Draw::Any, Draw::Any, |_, v| v[0] * v[1]);
binary_case!(div_broadcast, Draw::Any, Draw::AwayFromZero, |_, v| v[0] / v[1]);
binary_case!(pow_broadcast, Draw::Positive, Draw::Any, |_, v| v[0].pow(v[1]));
binary_case!(maximum_broadcast, Draw::Any, Draw::Any, |_, v| v[0].maximum(v[1]));
binary_case!(minimum_broadcast, Draw::Any, Draw::Any, |_, v| v[0].minimum(v[1]));

macro_rules! unary_case {
    ($name:ident, $draw:expr, $f:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(16))]
            #[test]
            fn $name(d in dims(0..=3, 0..=5), seed: u64) {
                check(&[tensor(&d, seed, $draw)], seed, $f)?;
            }
        }
    };
}

unary_case!(neg, Draw::Any, |_, v| -v[0]);
unary_case!(add_scalar, Draw::Any, |_, v| v[0] + 1.5);
unary_case!(rsub_scalar, Draw::Any, |_, v| 1.5 - v[0]);
unary_case!(mul_scalar, Draw::Any, |_, v| v[0] * -2.5);
unary_case!(div_by_tensor_scalar, Draw::AwayFromZero, |_, v| 3.0 / v[0]);
unary_case!(powf, Draw::Positive, |_, v| v[0].powf(2.7));
unary_case!(exp, Draw::Any, |_, v| v[0].exp());
unary_case!(log, Draw::Positive, |_, v| v[0].log());
unary_case!(sqrt, Draw::Positive, |_, v| v[0].sqrt());
unary_case!(square, Draw::Any, |_, v| v[0].square());
unary_case!(recip, Draw::AwayFromZero, |_, v| v[0].recip());
unary_case!(abs, Draw::AwayFromZero, |_, v| v[0].abs());
unary_case!(sin, Draw::Any, |_, v| v[0].sin());
unary_case!(cos, Draw::Any, |_, v| v[0].cos());
unary_case!(tanh, Draw::Any, |_, v| v[0].tanh());
unary_case!(sigmoid, Draw::Any, |_, v| v[0].sigmoid());
unary_case!(relu, Draw::AwayFromZero, |_, v| v[0].relu());
unary_case!(leaky_relu, Draw::AwayFromZero, |_, v| v[0].leaky_relu(0.1));
unary_case!(gelu, Draw::Any, |_, v| v[0].gelu());
unary_case!(gelu_tanh, Draw::Any, |_, v| v[0].gelu_tanh());
unary_case!(softplus, Draw::Any, |_, v| v[0].softplus());
unary_case!(erf, Draw::Any, |_, v| v[0].erf());
// log1p on (-0.5, 1.5]: Positive draws shifted down, away from the pole at -1.
unary_case!(log1p, Draw::Positive, |_, v| (v[0] - 1.0).log1p());
unary_case!(expm1, Draw::Any, |_, v| v[0].expm1());
unary_case!(atan, Draw::Any, |_, v| v[0].atan());
unary_case!(silu, Draw::Any, |_, v| v[0].silu());
unary_case!(rsqrt, Draw::Positive, |_, v| v[0].rsqrt());
// Bounds at ±0.1 + 1e-3 offsets never meet AwayFromZero draws at |x| >= 0.2 exactly.
unary_case!(clamp, Draw::AwayFromZero, |_, v| v[0].clamp(-1.1, 0.9));
unary_case!(sum_all, Draw::Any, |_, v| v[0].sum());
unary_case!(square_via_self_mul, Draw::Any, |_, v| v[0] * v[0]);

fn axes_of(rank: usize, bits: u64) -> Vec<isize> {
    (0..rank)
        .filter(|i| bits >> i & 1 == 1)
        .map(|i| if bits >> (8 + i) & 1 == 1 { i as isize - rank as isize } else { i as isize })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(20))]

    /// The mean of an empty tensor is NaN (as in PyTorch), so sizes start at 1 here.
    #[test]
    fn mean_all(d in dims(0..=3, 1..=5), seed: u64) {
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].mean())?;
    }

    #[test]
    fn sum_axes(d in dims(1..=4, 0..=4), bits: u64, keep: bool, seed: u64) {
        let axes = axes_of(d.len(), bits);
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].sum_axes(&axes, keep))?;
    }

    #[test]
    fn mean_axes(d in dims(1..=4, 1..=4), bits: u64, keep: bool, seed: u64) {
        let axes = axes_of(d.len(), bits);
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].mean_axes(&axes, keep))?;
    }

    #[test]
    fn max_and_min_axes(d in dims(1..=3, 1..=4), bits: u64, keep: bool, seed: u64) {
        let axes = axes_of(d.len(), bits);
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].max_axes(&axes, keep))?;
        check(&[x], seed, |_, v| v[0].min_axes(&axes, keep))?;
    }

    #[test]
    fn max_and_min_all(d in dims(0..=3, 1..=4), seed: u64) {
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].max())?;
        check(&[x], seed, |_, v| v[0].min())?;
    }

    #[test]
    fn logsumexp(d in dims(1..=3, 1..=5), axis in 0usize..3, keep: bool, seed: u64) {
        let axis = (axis % d.len()) as isize;
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].logsumexp(axis, keep))?;
    }

    #[test]
    fn var(d in dims(1..=3, 2..=4), bits: u64, correction in 0usize..=1, seed: u64) {
        let axes = axes_of(d.len(), bits | 1);
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].var(&axes, false, correction))?;
    }

    #[test]
    fn softmax_and_log_softmax(d in dims(1..=3, 1..=5), axis in 0usize..3, seed: u64) {
        let axis = (axis % d.len()) as isize - d.len() as isize;
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].softmax(axis))?;
        check(&[x], seed, |_, v| v[0].log_softmax(axis))?;
    }

    #[test]
    fn cross_entropy_and_nll(n in 1usize..=5, c in 1usize..=6, seed: u64) {
        let labels: Vec<usize> = (0..n).map(|i| (seed as usize >> i) % c).collect();
        let x = tensor(&[n, c], seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].cross_entropy(&labels))?;
        check(&[x], seed, |_, v| v[0].log_softmax(-1).nll_loss(&labels))?;
    }

    #[test]
    fn bce_with_logits_both_inputs(d in dims(0..=3, 1..=4), seed: u64) {
        let x = tensor(&d, seed, Draw::Any);
        let y = tensor(&d, seed ^ 7, Draw::Positive).map(|v| v / 2.0).expect("a small tensor");
        check(&[x, y], seed, |_, v| v[0].bce_with_logits(v[1]))?;
    }

    #[test]
    fn mse_loss(d in dims(0..=3, 1..=4), seed: u64) {
        check(&[tensor(&d, seed, Draw::Any), tensor(&d, seed ^ 3, Draw::Any)], seed, |_, v| v[0].mse_loss(v[1]))?;
    }

    #[test]
    fn reshape_and_unsqueeze_squeeze(d in dims(1..=3, 1..=4), seed: u64) {
        let n: usize = d.iter().product();
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| (v[0].reshape(&[n]).unsqueeze(0).squeeze(0) * v[0].reshape(&[n])).sum_axes(&[0], true))?;
    }

    #[test]
    fn permute_and_transpose(d in dims(2..=4, 1..=4), seed: u64) {
        let r = d.len();
        let axes: Vec<usize> = (0..r).rev().collect();
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].permute(&axes))?;
        check(&[x], seed, |_, v| v[0].transpose(0, -1))?;
    }

    #[test]
    fn broadcast_to((a, b) in broadcast_pair(), seed: u64) {
        // Broadcast the smaller-or-equal operand to the joint shape.
        let ta = Tensor::<f64>::zeros(&a).unwrap();
        let tb = Tensor::<f64>::zeros(&b).unwrap();
        let joint = ta.add(&tb).unwrap().dims();
        check(&[tensor(&b, seed, Draw::Any)], seed, |_, v| v[0].broadcast_to(&joint))?;
    }

    #[test]
    fn narrow(d in dims(1..=3, 1..=6), axis in 0usize..3, start_frac in 0.0f64..1.0, seed: u64) {
        let axis = axis % d.len();
        let start = ((d[axis] as f64) * start_frac) as usize;
        let len = d[axis] - start;
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].narrow(axis as isize, start, len))?;
    }

    #[test]
    fn concat_and_stack(d in dims(1..=3, 1..=4), extra in 0usize..=3, seed: u64) {
        let mut d2 = d.clone();
        d2[0] = extra;
        let (a, b) = (tensor(&d, seed, Draw::Any), tensor(&d2, seed ^ 5, Draw::Any));
        check(&[a.clone(), b], seed, |s, v| s.concat(&[v[0], v[1], v[0]], 0))?;
        check(&[a.clone(), a], seed, |s, v| s.stack(&[v[0], v[1]], -1))?;
    }

    #[test]
    fn index_select_with_repeats(rows in 1usize..=6, cols in 1usize..=4, picks in prop::collection::vec(0usize..6, 0..8), seed: u64) {
        let picks: Vec<usize> = picks.into_iter().map(|p| p % rows).collect();
        let x = tensor(&[rows, cols], seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].index_select(0, &picks))?;
        let cpicks: Vec<usize> = picks.iter().map(|p| p % cols).collect();
        check(&[x], seed, |_, v| v[0].index_select(1, &cpicks))?;
    }

    #[test]
    fn where_with_broadcast((a, b) in broadcast_pair(), seed: u64) {
        let cond = tensor(&a, seed ^ 9, Draw::AwayFromZero).map(|v| if v > 0.0 { 1.0 } else { 0.0 }).expect("a small tensor");
        check(&[tensor(&a, seed, Draw::Any), tensor(&b, seed ^ 1, Draw::Any)], seed, move |s, v| {
            let c = s.tensor(cond.data(), &cond.dims());
            s.where_(c, v[0], v[1])
        })?;
    }

    #[test]
    fn pad_axis(d in dims(1..=3, 0..=4), axis in 0usize..3, before in 0usize..=2, after in 0usize..=2, seed: u64) {
        let axis = (axis % d.len()) as isize - d.len() as isize;
        check(&[tensor(&d, seed, Draw::Any)], seed, |_, v| v[0].pad_axis(axis, before, after))?;
    }

    #[test]
    fn scatter_add_with_repeats(rows in 1usize..=5, cols in 1usize..=4, len in 1usize..=6, seed: u64) {
        let targets: Vec<usize> = (0..rows).map(|i| (seed as usize >> (2 * i)) % len).collect();
        let x = tensor(&[rows, cols], seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].scatter_add(0, &targets, len))?;
        let ctargets: Vec<usize> = (0..cols).map(|i| (seed as usize >> (3 * i)) % len).collect();
        check(&[x], seed, |_, v| v[0].scatter_add(-1, &ctargets, len))?;
    }

    #[test]
    fn col2im(n in 1usize..=2, c in 1usize..=2, h in 1usize..=5, w in 1usize..=5, k in 1usize..=3, st in 1usize..=2, pad in 0usize..=1, seed: u64) {
        prop_assume!(h + 2 * pad >= k && w + 2 * pad >= k);
        let (oh, ow) = ((h + 2 * pad - k) / st + 1, (w + 2 * pad - k) / st + 1);
        let cols = tensor(&[n, c * k * k, oh * ow], seed, Draw::Any);
        check(&[cols], seed, |_, v| v[0].col2im([h, w], [k, k], [st, st], [pad, pad]))?;
    }

    #[test]
    fn matmul_2d(m in 0usize..=5, k in 0usize..=5, n in 0usize..=5, seed: u64) {
        check(&[tensor(&[m, k], seed, Draw::Any), tensor(&[k, n], seed ^ 1, Draw::Any)], seed, |_, v| v[0].matmul(v[1]))?;
    }

    #[test]
    fn matmul_batched_broadcast(b in 1usize..=3, m in 1usize..=4, k in 1usize..=4, n in 1usize..=4, which in 0u8..3, seed: u64) {
        let (da, db) = match which {
            0 => (vec![b, m, k], vec![b, k, n]),
            1 => (vec![b, m, k], vec![k, n]),
            _ => (vec![1, m, k], vec![2, b, k, n]),
        };
        check(&[tensor(&da, seed, Draw::Any), tensor(&db, seed ^ 1, Draw::Any)], seed, |_, v| v[0].matmul(v[1]))?;
    }

    #[test]
    fn linear(lead in dims(1..=2, 0..=4), k in 0usize..=4, n in 0usize..=4, seed: u64) {
        let mut dx = lead.clone();
        dx.push(k);
        let inputs = [tensor(&dx, seed, Draw::Any), tensor(&[k, n], seed ^ 1, Draw::Any), tensor(&[n], seed ^ 2, Draw::Any)];
        check(&inputs, seed, |_, v| v[0].linear(v[1], v[2]))?;
        // The same value as the two-node form, to rounding.
        let mut g = Graph::<f64>::new();
        let (a, b) = g.scope(|s| {
            let v: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
            (v[0].linear(v[1], v[2]).to_tensor().unwrap(), (v[0].matmul(v[1]) + v[2]).to_tensor().unwrap())
        });
        prop_assert_eq!(a.shape(), b.shape());
        for (p, q) in a.data().iter().zip(b.data()) {
            prop_assert!((p - q).abs() <= 1e-12 * (1.0 + q.abs()), "{} vs {}", p, q);
        }
    }

    #[test]
    fn layer_norm(lead in dims(0..=2, 0..=4), c in 0usize..=6, seed: u64) {
        let mut dx = lead.clone();
        dx.push(c);
        let inputs = [tensor(&dx, seed, Draw::Any), tensor(&[c], seed ^ 1, Draw::Any), tensor(&[c], seed ^ 2, Draw::Any)];
        check(&inputs, seed, |_, v| v[0].layer_norm(v[1], v[2], 1e-3))?;
        // The same value as the composition, to rounding.
        let mut g = Graph::<f64>::new();
        let (a, b) = g.scope(|s| {
            let v: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
            let centred = v[0] - v[0].mean_axes(&[-1], true);
            let composed = centred * centred.square().mean_axes(&[-1], true).add_scalar(1e-3).rsqrt() * v[1] + v[2];
            (v[0].layer_norm(v[1], v[2], 1e-3).to_tensor().unwrap(), composed.to_tensor().unwrap())
        });
        prop_assert_eq!(a.shape(), b.shape());
        for (p, q) in a.data().iter().zip(b.data()) {
            prop_assert!((p - q).abs() <= 1e-12 * (1.0 + q.abs()), "{} vs {}", p, q);
        }
    }

    #[test]
    fn matmul_same_handle_gets_both_terms(n in 1usize..=5, seed: u64) {
        // y = x·x: dL/dx = dout·xᵀ + xᵀ·dout, both through the same gradient buffer.
        check(&[tensor(&[n, n], seed, Draw::Any)], seed, |_, v| v[0].matmul(v[0]))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3))]

    /// Sizes straddling faer's tile edges.
    #[test]
    fn matmul_tile_edges(m in prop::sample::select(vec![1usize, 15, 16, 17]), k in prop::sample::select(vec![1usize, 16, 17]), n in prop::sample::select(vec![15usize, 16, 17]), seed: u64) {
        check(&[tensor(&[m, k], seed, Draw::Any), tensor(&[k, n], seed ^ 1, Draw::Any)], seed, |_, v| v[0].matmul(v[1]).tanh())?;
    }
}

#[test]
fn matmul_large_edges_63_64_65() {
    // One deterministic case at the larger tile edges; gradcheck costs 2 forward passes per
    // input element, so the inputs stay modest.
    for (m, k, n) in [(63, 2, 65), (2, 64, 3)] {
        check(&[tensor(&[m, k], 1, Draw::Any), tensor(&[k, n], 2, Draw::Any)], 3, |_, v| v[0].matmul(v[1])).unwrap();
    }
}

#[test]
fn composite_mlp_step() {
    // A two-layer MLP with every family of op, checked end to end.
    let x = tensor(&[4, 3], 11, Draw::Any);
    let w1 = tensor(&[3, 5], 12, Draw::Any);
    let b1 = tensor(&[5], 13, Draw::Any);
    let w2 = tensor(&[5, 2], 14, Draw::Any);
    check(&[x, w1, b1, w2], 15, |_, v| (v[0].matmul(v[1]) + v[2]).gelu().matmul(v[3]).cross_entropy(&[0, 1, 1, 0]))
        .unwrap();
}

/// `layer_norm` above the parallel threshold (1024 rows of 40, the last chunk short): the
/// value and all three gradients have the same bits at 1 and 2 threads, and match the
/// composition to rounding.
#[test]
fn layer_norm_large_is_thread_independent() {
    let inputs = [tensor(&[1024, 40], 3, Draw::Any), tensor(&[40], 4, Draw::Any), tensor(&[40], 5, Draw::Any)];
    let run = |threads: usize, composed: bool| {
        let mut g = Graph::<f64>::new();
        g.set_threads(threads);
        g.scope(|s| {
            let v: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
            let y = if composed {
                let centred = v[0] - v[0].mean_axes(&[-1], true);
                centred * centred.square().mean_axes(&[-1], true).add_scalar(1e-5).rsqrt() * v[1] + v[2]
            } else {
                v[0].layer_norm(v[1], v[2], 1e-5)
            };
            let l = (y * y.detach().sin()).sum();
            s.backward(l).unwrap();
            let mut out = y.value().unwrap().to_vec();
            for x in &v {
                out.extend_from_slice(x.grad().unwrap());
            }
            out
        })
    };
    let one = run(1, false);
    assert_eq!(one, run(2, false), "bits at 2 threads");
    for (p, q) in one.iter().zip(run(1, true)) {
        assert!((p - q).abs() <= 1e-11 * (1.0 + q.abs()), "{p} vs {q}");
    }
}
