//! Second derivatives of every op family over random shapes, as `tests/gradients.rs` does
//! for first derivatives: the recorded gradient (`Scope::grad`) equals the fast backward's,
//! and `gradgradcheck` (its derivative against central differences of the fast backward's
//! gradient) passes. Inputs are steered away from kinks and ties by construction. Case
//! counts are modest: each case runs two backward passes per input element.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use tapir::testing::{gradgradcheck, GradcheckOptions};
use tapir::{Graph, Scope, Tensor, Var};

#[derive(Clone, Copy)]
enum Draw {
    Any,
    Positive,
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
    (dims(0..=3, 1..=3), any::<u64>()).prop_map(|(a, bits)| {
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

/// The recorded gradient of `L = Σ f ⊙ r` equals backward's to 1e-12, and gradgradcheck passes.
fn check<F>(inputs: &[Tensor<f64>], seed: u64, f: F) -> Result<(), TestCaseError>
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    let mut g = Graph::<f64>::new();
    g.scope(|s| -> Result<(), TestCaseError> {
        let v: Vec<_> = inputs.iter().map(|t| s.leaf(t)).collect();
        let out = f(s, &v);
        let n = out.shape().numel();
        let r: Vec<f64> = (0..n).map(|i| ((i as f64 + seed as f64 % 7.0) * 0.61).sin()).collect();
        let l = (out * s.tensor(&r, &out.shape().to_vec())).sum();
        if !l.requires_grad() {
            return Ok(());
        }
        let mut recorded = vec![l; v.len()];
        s.grad_into(l, &v, &mut recorded).map_err(|e| TestCaseError::fail(e.to_string()))?;
        s.backward(l).map_err(|e| TestCaseError::fail(e.to_string()))?;
        for (x, dx) in v.iter().zip(&recorded) {
            let dx = dx.value().unwrap();
            let fast = x.grad().map_or_else(|| vec![0.0; dx.len()], <[f64]>::to_vec);
            for (a, b) in dx.iter().zip(&fast) {
                prop_assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "recorded {} vs backward {}", a, b);
            }
        }
        Ok(())
    })?;
    gradgradcheck(inputs, GradcheckOptions { seed, ..GradcheckOptions::default() }, f)
        .map(|_| ())
        .map_err(|e| TestCaseError::fail(e.to_string()))
}

macro_rules! unary_case {
    ($name:ident, $draw:expr, $f:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(6))]
            #[test]
            fn $name(d in dims(0..=3, 0..=4), seed: u64) {
                check(&[tensor(&d, seed, $draw)], seed, $f)?;
            }
        }
    };
}

unary_case!(neg, Draw::Any, |_, v| -v[0] * v[0]);
unary_case!(add_mul_scalar, Draw::Any, |_, v| (v[0] + 1.5).square() * -2.5);
unary_case!(powf, Draw::Positive, |_, v| v[0].powf(2.7));
unary_case!(exp, Draw::Any, |_, v| v[0].exp());
unary_case!(log, Draw::Positive, |_, v| v[0].log());
unary_case!(log1p, Draw::Positive, |_, v| (v[0] - 1.0).log1p());
unary_case!(expm1, Draw::Any, |_, v| v[0].expm1());
unary_case!(sqrt, Draw::Positive, |_, v| v[0].sqrt());
unary_case!(rsqrt, Draw::Positive, |_, v| v[0].rsqrt());
unary_case!(recip, Draw::AwayFromZero, |_, v| v[0].recip());
unary_case!(abs, Draw::AwayFromZero, |_, v| v[0].abs() * v[0]);
unary_case!(sin_cos, Draw::Any, |_, v| v[0].sin() * v[0].cos());
unary_case!(tanh, Draw::Any, |_, v| v[0].tanh());
unary_case!(atan, Draw::Any, |_, v| v[0].atan());
unary_case!(erf, Draw::Any, |_, v| v[0].erf());
unary_case!(sigmoid, Draw::Any, |_, v| v[0].sigmoid());
unary_case!(relu, Draw::AwayFromZero, |_, v| v[0].relu().square());
unary_case!(leaky_relu, Draw::AwayFromZero, |_, v| v[0].leaky_relu(0.1) * v[0]);
unary_case!(gelu, Draw::Any, |_, v| v[0].gelu());
unary_case!(gelu_tanh, Draw::Any, |_, v| v[0].gelu_tanh());
unary_case!(softplus, Draw::Any, |_, v| v[0].softplus());
unary_case!(silu, Draw::Any, |_, v| v[0].silu());
unary_case!(clamp, Draw::AwayFromZero, |_, v| v[0].clamp(-1.1, 0.9).square());

macro_rules! binary_case {
    ($name:ident, $da:expr, $db:expr, $f:expr) => {
        proptest! {
            #![proptest_config(ProptestConfig::with_cases(8))]
            #[test]
            fn $name((a, b) in broadcast_pair(), seed: u64) {
                check(&[tensor(&a, seed, $da), tensor(&b, seed ^ 1, $db)], seed, $f)?;
            }
        }
    };
}

binary_case!(add_broadcast, Draw::Any, Draw::Any, |_, v| (v[0] + v[1]).square());
binary_case!(sub_broadcast, Draw::Any, Draw::Any, |_, v| (v[0] - v[1]).square());
binary_case!(mul_broadcast, Draw::Any, Draw::Any, |_, v| v[0] * v[1]);
binary_case!(div_broadcast, Draw::Any, Draw::AwayFromZero, |_, v| v[0] / v[1]);
binary_case!(pow_broadcast, Draw::Positive, Draw::Any, |_, v| v[0].pow(v[1]));
binary_case!(maximum_broadcast, Draw::Any, Draw::Any, |_, v| v[0].maximum(v[1]) * v[0]);
binary_case!(minimum_broadcast, Draw::Any, Draw::Any, |_, v| v[0].minimum(v[1]) * v[1]);

fn axes_of(rank: usize, bits: u64) -> Vec<isize> {
    (0..rank).filter(|i| bits >> i & 1 == 1).map(|i| i as isize).collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn reductions(d in dims(1..=3, 1..=4), bits: u64, keep: bool, seed: u64) {
        let axes = axes_of(d.len(), bits);
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].square().sum_axes(&axes, keep).square())?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].exp().mean_axes(&axes, keep).log())?;
        check(std::slice::from_ref(&x), seed, |_, v| (v[0] * v[0].sin()).max_axes(&axes, keep).square())?;
        check(std::slice::from_ref(&x), seed, |_, v| (v[0] * v[0].sin()).min_axes(&axes, keep).square())?;
        check(&[x], seed, |_, v| v[0].square().sum().sqrt())?;
    }

    #[test]
    fn logsumexp_var_softmax(d in dims(1..=3, 2..=4), axis in 0usize..3, seed: u64) {
        let axis = (axis % d.len()) as isize;
        let x = tensor(&d, seed, Draw::Any);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].logsumexp(axis, false))?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].var(&[axis], true, 1))?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].softmax(axis))?;
        check(&[x], seed, |_, v| v[0].log_softmax(axis - d.len() as isize))?;
    }

    #[test]
    fn losses(n in 1usize..=4, c in 1usize..=5, seed: u64) {
        let labels: Vec<usize> = (0..n).map(|i| (seed as usize >> i) % c).collect();
        let x = tensor(&[n, c], seed, Draw::Any);
        let y = tensor(&[n, c], seed ^ 7, Draw::Positive).map(|v| v / 2.0).unwrap();
        check(std::slice::from_ref(&x), seed, |_, v| v[0].cross_entropy(&labels))?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].log_softmax(-1).nll_loss(&labels).square())?;
        check(&[x.clone(), y], seed, |_, v| v[0].bce_with_logits(v[1]))?;
        check(&[x.clone(), x], seed, |_, v| v[0].tanh().mse_loss(v[1].sin()))?;
    }

    #[test]
    fn shape_ops(d in dims(2..=3, 1..=4), start_frac in 0.0f64..1.0, picks in prop::collection::vec(0usize..6, 1..6), seed: u64) {
        let n: usize = d.iter().product();
        let x = tensor(&d, seed, Draw::Any);
        let r = d.len();
        let axes: Vec<usize> = (0..r).rev().collect();
        check(std::slice::from_ref(&x), seed, |_, v| v[0].reshape(&[n]).square().reshape(&[n, 1]))?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].permute(&axes).square())?;
        let mut big = vec![3];
        big.extend(&d);
        check(std::slice::from_ref(&x), seed, |_, v| v[0].broadcast_to(&big).square() * v[0])?;
        let start = ((d[0] as f64) * start_frac) as usize;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].narrow(0, start, d[0] - start).square())?;
        check(std::slice::from_ref(&x), seed, |s, v| s.concat(&[v[0], v[0].square()], 1).square())?;
        check(std::slice::from_ref(&x), seed, |s, v| s.stack(&[v[0], v[0].exp()], 0).square())?;
        let picks: Vec<usize> = picks.into_iter().map(|p| p % d[0]).collect();
        check(std::slice::from_ref(&x), seed, |_, v| v[0].index_select(0, &picks).square())?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].pad_axis(-1, 1, 2).square())?;
        let targets: Vec<usize> = (0..d[0]).map(|i| (i * 7 + seed as usize) % 5).collect();
        check(std::slice::from_ref(&x), seed, |_, v| v[0].scatter_add(0, &targets, 5).square())?;
        let cond = tensor(&d, seed ^ 9, Draw::AwayFromZero).map(|v| if v > 0.0 { 1.0 } else { 0.0 }).unwrap();
        check(&[x.clone(), x], seed, move |s, v| s.where_(s.tensor(cond.data(), &cond.dims()), v[0].square(), v[1].exp()))?;
    }

    #[test]
    fn matmul(b in 1usize..=2, m in 1usize..=3, k in 1usize..=3, n in 1usize..=3, which in 0u8..3, seed: u64) {
        let (da, db) = match which {
            0 => (vec![m, k], vec![k, n]),
            1 => (vec![b, m, k], vec![k, n]),
            _ => (vec![1, m, k], vec![2, b, k, n]),
        };
        check(&[tensor(&da, seed, Draw::Any), tensor(&db, seed ^ 1, Draw::Any)], seed, |_, v| v[0].matmul(v[1]).tanh())?;
        check(&[tensor(&[m, m], seed, Draw::Any)], seed, |_, v| v[0].matmul(v[0]).square())?;
    }

    #[test]
    fn conv_and_pooling(c in 1usize..=2, h in 2usize..=4, w in 2usize..=4, k in 1usize..=2, stride in 1usize..=2, pad in 0usize..=1, seed: u64) {
        let pad = pad.min(k / 2);
        let x = tensor(&[1, c, h, w], seed, Draw::Any);
        let wt = tensor(&[2, c, k, k], seed ^ 3, Draw::Any);
        check(&[x.clone(), wt], seed, |_, v| v[0].conv2d(v[1], [stride, stride], [pad, pad]).tanh())?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].square().max_pool2d([k, k], [stride, stride], [pad, pad]))?;
        check(std::slice::from_ref(&x), seed, |_, v| v[0].avg_pool2d([k, k], [stride, stride], [pad, pad]).square())?;
        let oh = (h + 2 * pad - k) / stride + 1;
        let ow = (w + 2 * pad - k) / stride + 1;
        let cols = tensor(&[1, c * k * k, oh * ow], seed ^ 5, Draw::Any);
        check(&[cols], seed, |_, v| v[0].col2im([h, w], [k, k], [stride, stride], [pad, pad]).square())?;
    }
}
