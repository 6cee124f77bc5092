//! Products (`ops/matmul.rs`): `matmul` and `linear` against finite differences, first and
//! second order.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{Graph, Tensor};

fn tensor(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0..2.0)).collect(), dims).unwrap()
}

/// The stored shapes of `a` and `b` for `op(a): [..., m, k]`, `op(b): [..., k, n]`:
/// plain, `a` batched, `b` batched with a broadcast batch axis.
fn stored(which: u8, batch: usize, (m, k, n): (usize, usize, usize), ta: bool, tb: bool) -> (Vec<usize>, Vec<usize>) {
    let a = if ta { vec![k, m] } else { vec![m, k] };
    let b = if tb { vec![n, k] } else { vec![k, n] };
    let lead = |x: Vec<usize>, l: &[usize]| l.iter().copied().chain(x).collect::<Vec<_>>();
    match which {
        0 => (a, b),
        1 => (lead(a, &[batch]), b),
        _ => (lead(a, &[1]), lead(b, &[2, batch])),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// `matmul_t` equals `matmul` of explicitly transposed operands; its fast backward
    /// and its recorded derivative match central differences.
    #[test]
    fn transposed_operands(which in 0u8..3, batch in 1usize..=2, m in 1usize..=3, k in 1usize..=3, n in 1usize..=3, ta: bool, tb: bool, seed: u64) {
        let (sa, sb) = stored(which, batch, (m, k, n), ta, tb);
        let inputs = [tensor(&sa, seed), tensor(&sb, seed ^ 1)];
        let mut g = Graph::<f64>::new();
        let (fused, explicit) = g.scope(|s| {
            let (a, b) = (s.input(&inputs[0]), s.input(&inputs[1]));
            let (oa, ob) = (if ta { a.t() } else { a }, if tb { b.t() } else { b });
            (a.matmul_t(b, ta, tb).value().unwrap().to_vec(), oa.matmul(ob).value().unwrap().to_vec())
        });
        prop_assert_eq!(fused.len(), explicit.len());
        for (x, y) in fused.iter().zip(&explicit) {
            prop_assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
        }
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(&inputs, opts, |_, v| v[0].matmul_t(v[1], ta, tb)).map_err(|e| TestCaseError::fail(e.to_string()))?;
        gradgradcheck(&inputs, opts, |_, v| v[0].matmul_t(v[1], ta, tb).tanh())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

/// `backward` through a recorded gradient, whose products are transposed ones: the
/// Hessian-vector product of `L = Σ tanh(x·w)` by `backward` of `⟨∂L/∂(x, w), v⟩` equals
/// the one by a second recorded gradient.
#[test]
fn backward_through_recorded_products() {
    let (x, w) = (tensor(&[3, 4], 1), tensor(&[4, 2], 2));
    let (vx, vw) = (tensor(&[3, 4], 3), tensor(&[4, 2], 4));
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (x, w) = (s.leaf(&x), s.leaf(&w));
        let l = x.matmul(w).tanh().sum();
        let [gx, gw] = s.grad(l, [x, w]).unwrap();
        let dot = (gx * s.input(&vx)).sum() + (gw * s.input(&vw)).sum();
        let [hx, hw] = s.grad(dot, [x, w]).unwrap();
        s.backward(dot).unwrap();
        for (h, p) in [(hx, x), (hw, w)] {
            for (a, b) in h.value().unwrap().iter().zip(p.grad().unwrap()) {
                assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
            }
        }
    });
}
