//! `attention_weights` and `attend` on a packed `qkv`: against the composition they replace
//! (head split by `narrow`/`reshape`/`permute`, `matmul`, a `where` mask and `softmax`),
//! against finite differences (first and second order), bitwise across thread counts, and
//! their errors.

use proptest::prelude::*;
use rand::SeedableRng;
use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{Error, Float, Graph, Scope, Tensor, Var};

/// `[B, H, T, D]` head split of block `part` of `qkv: [B, T, 3C]`, by the composition.
fn split<'s, T: Float>(qkv: Var<'s, T>, b: usize, t: usize, h: usize, part: usize) -> Var<'s, T> {
    let c = qkv.shape().dim(2) / 3;
    qkv.narrow(-1, part * c, c).reshape(&[b, t, h, c / h]).permute(&[0, 2, 1, 3])
}

/// Attention by the composition the fused ops replace; masked scores are pushed to
/// `−10⁹` by `where`, so they get probability exactly 0 as well.
fn composed<'s, T: Float>(s: &'s Scope<'s, '_, T>, qkv: Var<'s, T>, h: usize, causal: bool) -> Var<'s, T> {
    let (b, t, c) = (qkv.shape().dim(0), qkv.shape().dim(1), qkv.shape().dim(2) / 3);
    let scale = T::from_f64(1.0 / ((c / h) as f64).sqrt());
    let q = split(qkv, b, t, h, 0);
    let k = split(qkv, b, t, h, 1);
    let v = split(qkv, b, t, h, 2);
    let mut scores = q.matmul(k.t()).mul_scalar(scale);
    if causal {
        let future: Vec<T> = (0..t * t).map(|i| if i % t > i / t { T::ONE } else { T::ZERO }).collect();
        scores = s.where_(s.tensor(&future, &[t, t]), s.scalar(T::from_f64(-1e9)), scores);
    }
    scores.softmax(-1).matmul(v).permute(&[0, 2, 1, 3]).reshape(&[b, t, c])
}

fn fused<'s, T: Float>(qkv: Var<'s, T>, h: usize, causal: bool) -> Var<'s, T> {
    qkv.attention_weights(h, causal).attend(qkv)
}

fn qkv(b: usize, t: usize, c: usize, seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    Tensor::normal(&[b, t, 3 * c], 0.0, 1.0, &mut rng).unwrap()
}

/// Value and gradient (of `Σ out ⊙ r`) of `f` at `x`.
fn value_and_grad(
    x: &Tensor<f64>,
    threads: usize,
    f: impl for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, Var<'s, f64>) -> Var<'s, f64>,
) -> (Vec<f64>, Vec<f64>) {
    let mut g = Graph::<f64>::new();
    g.set_threads(threads);
    g.scope(|s| {
        let x = s.leaf(x);
        let y = f(s, x);
        let n = y.value().unwrap().len();
        let r: Vec<f64> = (0..n).map(|i| ((i * 7919) % 13) as f64 / 13.0 - 0.4).collect();
        let dims: Vec<usize> = (0..y.shape().rank()).map(|i| y.shape().dim(i)).collect();
        let loss = (y * s.tensor(&r, &dims)).sum();
        let value = y.value().unwrap().to_vec();
        s.backward(loss).unwrap();
        (value, x.grad().unwrap().to_vec())
    })
}

fn assert_close(a: &[f64], b: &[f64], tol: f64, what: &str) {
    assert_eq!(a.len(), b.len(), "{what}");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= tol * (1.0 + y.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn fused_equals_the_composition(b in 1usize..3, t in 1usize..7, h in 1usize..4, d in 1usize..5,
                                    causal: bool, seed: u64) {
        let x = qkv(b, t, h * d, seed);
        let (vf, gf) = value_and_grad(&x, 1, |_, x| fused(x, h, causal));
        let (vc, gc) = value_and_grad(&x, 1, |s, x| composed(s, x, h, causal));
        assert_close(&vf, &vc, 1e-12, "value");
        assert_close(&gf, &gc, 1e-12, "gradient");
    }

    #[test]
    fn gradients_match_finite_differences(b in 1usize..3, t in 1usize..5, h in 1usize..3, d in 1usize..4,
                                          causal: bool, seed: u64) {
        let x = qkv(b, t, h * d, seed);
        let opts = GradcheckOptions::default();
        gradcheck(std::slice::from_ref(&x), opts, |_, v| fused(v[0], h, causal)).unwrap();
        gradgradcheck(&[x], opts, |_, v| fused(v[0], h, causal)).unwrap();
    }
}

/// Dropout-like reweighting between the nodes: `attend` differentiates in `p` too.
#[test]
fn attend_differentiates_in_the_weights() {
    let x = qkv(2, 4, 6, 3);
    let opts = GradcheckOptions::default();
    fn f<'s>(_: &'s Scope<'s, '_, f64>, v: &[Var<'s, f64>]) -> Var<'s, f64> {
        (v[0].attention_weights(2, true) * v[1]).attend(v[0])
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let m = Tensor::uniform(&[2, 2, 4, 4], 0.5, 1.5, &mut rng).unwrap();
    gradcheck(&[x.clone(), m.clone()], opts, f).unwrap();
    gradgradcheck(&[x, m], opts, f).unwrap();
}

#[test]
fn causal_rows_give_later_keys_exactly_zero() {
    let x = qkv(2, 5, 4, 1);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let p = s.input(&x).attention_weights(2, true);
        let p = p.value().unwrap();
        for (k, &v) in p.iter().enumerate() {
            let (i, j) = ((k / 5) % 5, k % 5);
            if j > i {
                assert_eq!(v.to_bits(), 0, "p[{k}]");
            } else {
                assert!(v > 0.0 && v <= 1.0);
            }
        }
        for row in p.chunks(5) {
            assert!((row.iter().sum::<f64>() - 1.0).abs() < 1e-15);
        }
    });
}

/// A hand-worked case: one head of width 1, two positions, `q = k = v = [0, ln 3]·√1`.
#[test]
fn hand_worked_two_positions() {
    let l3 = 3f64.ln();
    // Rows: [q, k, v] at t = 0 and t = 1.
    let x = Tensor::from_vec(vec![0.0, 0.0, 1.0, 1.0, l3, 5.0], &[1, 2, 3]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.input(&x);
        // Not causal: row 0 scores q0·k = [0, 0] → [½, ½]; row 1 scores [0, ln 3] → [¼, ¾].
        let p = x.attention_weights(1, false);
        assert_close(p.value().unwrap(), &[0.5, 0.5, 0.25, 0.75], 1e-15, "p");
        assert_close(p.attend(x).value().unwrap(), &[3.0, 4.0], 1e-15, "out");
        let p = x.attention_weights(1, true);
        assert_close(p.value().unwrap(), &[1.0, 0.0, 0.25, 0.75], 1e-15, "causal p");
        assert_close(p.attend(x).value().unwrap(), &[1.0, 4.0], 1e-15, "causal out");
    });
}

#[test]
fn the_bits_do_not_depend_on_the_thread_count() {
    // Large enough to be spread over the threads.
    let x = Tensor::<f64>::normal(&[8, 32, 3 * 64], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(9)).unwrap();
    let one = value_and_grad(&x, 1, |_, x| fused(x, 4, true));
    for threads in [2, 4] {
        let many = value_and_grad(&x, threads, |_, x| fused(x, 4, true));
        assert!(one.0.iter().zip(&many.0).all(|(a, b)| a.to_bits() == b.to_bits()), "values at {threads}");
        assert!(one.1.iter().zip(&many.1).all(|(a, b)| a.to_bits() == b.to_bits()), "gradients at {threads}");
    }
}

#[test]
fn bad_shapes_are_typed_errors_naming_the_shapes() {
    let mut g = Graph::<f32>::new();
    let cases: [(&[usize], usize); 5] =
        [(&[2, 3], 1), (&[1, 2, 7], 1), (&[1, 2, 6], 0), (&[1, 2, 6], 4), (&[1, 2, 3, 6], 1)];
    for (dims, heads) in cases {
        let x = Tensor::<f32>::zeros(dims).unwrap();
        let e = g.scope(|s| s.input(&x).attention_weights(heads, true).value().map(|_| ()).unwrap_err());
        let Error::InvalidArgument { op, detail, location } = &e else { panic!("{e:?}") };
        assert_eq!(*op, "attention_weights");
        assert!(detail.contains(&format!("heads {heads}")), "{detail}");
        assert!(location.file().ends_with("attention.rs"), "{location}");
    }
    let x = Tensor::<f32>::zeros(&[1, 3, 6]).unwrap();
    let p = Tensor::<f32>::zeros(&[1, 2, 3, 2]).unwrap();
    let e = g.scope(|s| s.input(&p).attend(s.input(&x)).value().map(|_| ()).unwrap_err());
    let Error::InvalidArgument { op, detail, .. } = &e else { panic!("{e:?}") };
    assert_eq!(*op, "attend");
    assert!(detail.contains("[1, 2, 3, 2]") && detail.contains("[1, 3, 6]"), "{detail}");
}

/// Value of `fused(x)` and the gradient of `Σ out[:, ..rows, :] ⊙ r`, a loss that reads
/// only the first `rows` positions, on one thread.
fn value_and_grad_of_rows(x: &Tensor<f64>, h: usize, causal: bool, rows: usize) -> (Vec<f64>, Vec<f64>) {
    let mut g = Graph::<f64>::new();
    g.set_threads(1);
    g.scope(|s| {
        let x = s.leaf(x);
        let y = fused(x, h, causal);
        let read = y.narrow(1, 0, rows);
        let dims = read.shape().to_vec();
        let r: Vec<f64> = (0..read.shape().numel()).map(|i| ((i * 7919) % 13) as f64 / 13.0 - 0.4).collect();
        let loss = (read * s.tensor(&r, &dims)).sum();
        let value = y.value().unwrap().to_vec();
        s.backward(loss).unwrap();
        (value, x.grad().unwrap().to_vec())
    })
}

fn same_bits(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// Causal attention's NaN policy (docs/design.md, "NaN policy"): a NaN at position `t` of
/// sequence 0 reaches only the rows that see it. A causal row's weight `0` for a later key
/// is skipped, not multiplied, and so is a row whose output gradient is `0`. So every row
/// before `t`, and every row of sequence 1, has the bits of the run without the NaN: in
/// the value, and in the gradient of a loss that reads only the rows before `t` (which is
/// then finite everywhere); with a loss that reads every row, the queries before `t` still
/// get the clean gradient. NaN in a whole position or in one column of its query, key or
/// value block; shapes on both sides of faer's small-product kernel (16³ multiply-adds).
#[test]
fn a_nan_reaches_only_the_rows_that_see_it() {
    for (t, h, d) in [(5, 2, 3), (40, 2, 8), (70, 3, 17)] {
        let (c, w) = (h * d, 3 * h * d);
        let clean = qkv(2, t, c, 11);
        for pos in [1, t / 2, t - 1] {
            for cols in [(0..w).collect::<Vec<_>>(), vec![0], vec![c + 1], vec![2 * c + d]] {
                let at = if cols.len() > 1 { "every column".to_string() } else { format!("column {}", cols[0]) };
                let what = format!("t {t}, h {h}, d {d}, NaN at position {pos}, {at}");
                let mut data = clean.data().to_vec();
                for &col in &cols {
                    data[pos * w + col] = f64::NAN;
                }
                let nan = Tensor::from_vec(data, &[2, t, w]).unwrap();
                // Output rows (`c` wide) and input positions (`w` wide) that cannot see the NaN.
                let unseen = |x: &[f64], width: usize| -> Vec<f64> {
                    let (first, second) = x.split_at(t * width);
                    first[..pos * width].iter().chain(second).copied().collect()
                };
                let (v0, g0) = value_and_grad_of_rows(&clean, h, true, pos);
                let (v1, g1) = value_and_grad_of_rows(&nan, h, true, pos);
                assert!(same_bits(&unseen(&v0, c), &unseen(&v1, c)), "value, {what}");
                assert!(v1[pos * c..(pos + 1) * c].iter().any(|v| v.is_nan()), "row {pos} sees the NaN, {what}");
                assert!(same_bits(&unseen(&g0, w), &unseen(&g1, w)), "gradient, {what}");
                assert!(g1.iter().all(|v| v.is_finite()), "gradient of the rows before {pos}, {what}");
                let (_, g0) = value_and_grad_of_rows(&clean, h, true, t);
                let (_, g1) = value_and_grad_of_rows(&nan, h, true, t);
                let queries = |g: &[f64]| -> Vec<f64> { (0..pos).flat_map(|i| g[i * w..i * w + c].to_vec()).collect() };
                assert!(same_bits(&queries(&g0), &queries(&g1)), "query gradient, whole loss, {what}");
                assert!(same_bits(&g0[t * w..], &g1[t * w..]), "sequence 1's gradient, whole loss, {what}");
            }
        }
        // Without the mask every row sees every key: a NaN value reaches every row.
        let mut data = clean.data().to_vec();
        data[(t / 2) * w + 2 * c] = f64::NAN;
        let nan = Tensor::from_vec(data, &[2, t, w]).unwrap();
        let (v, _) = value_and_grad_of_rows(&nan, h, false, t);
        assert!((0..t).all(|i| v[i * c].is_nan()), "not causal, t {t}");
        assert!(v[t * c..].iter().all(|v| v.is_finite()), "not causal, sequence 1, t {t}");
    }
}
