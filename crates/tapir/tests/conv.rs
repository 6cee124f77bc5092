//! Convolution and pooling (`ops/conv.rs`): gradients against finite differences, hand-worked
//! windows and the errors of bad windows.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

use tapir::testing::{gradcheck, GradcheckOptions};
use tapir::{Error, Graph, Tensor};

fn tensor(dims: &[usize], seed: u64) -> Tensor<f64> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let n: usize = dims.iter().product();
    Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0..2.0)).collect(), dims).unwrap()
}

/// `(x dims, kernel, stride, padding)` with the kernel fitting the padded input and
/// the padding at most half the kernel (valid for pooling too).
fn windows() -> impl Strategy<Value = ([usize; 4], [usize; 2], [usize; 2], [usize; 2])> {
    (1..=2usize, 1..=2usize, 1..=3usize, 1..=3usize, 1..=2usize, 1..=2usize, 0..=1usize, 0..=1usize).prop_flat_map(
        |(n, c, kh, kw, sh, sw, ph, pw)| {
            let (ph, pw) = (ph.min(kh / 2), pw.min(kw / 2));
            let h = (kh.saturating_sub(2 * ph)).max(1)..=5;
            let w = (kw.saturating_sub(2 * pw)).max(1)..=5;
            (h, w).prop_map(move |(h, w)| ([n, c, h, w], [kh, kw], [sh, sw], [ph, pw]))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn im2col_grad_matches_finite_differences((dims, k, st, p) in windows(), seed: u64) {
        let x = tensor(&dims, seed);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(&[x], opts, |_, v| v[0].im2col(k, st, p)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn max_pool2d_grad_matches_finite_differences((dims, k, st, p) in windows(), seed: u64) {
        // Continuous random inputs have no ties, so every window has one maximum.
        let x = tensor(&dims, seed);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(&[x], opts, |_, v| v[0].max_pool2d(k, st, p)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn avg_pool2d_grad_matches_finite_differences((dims, k, st, p) in windows(), seed: u64) {
        let x = tensor(&dims, seed);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(&[x], opts, |_, v| v[0].avg_pool2d(k, st, p)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn conv2d_grad_matches_finite_differences((dims, k, st, p) in windows(), o in 1..=3usize, seed: u64) {
        let x = tensor(&dims, seed);
        let w = tensor(&[o, dims[1], k[0], k[1]], seed ^ 1);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(&[x, w], opts, |_, v| v[0].conv2d(v[1], st, p)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

#[test]
fn im2col_by_hand() {
    // x = [[1, 2], [3, 4]] with a 2×2 kernel, stride 1, padding 1: a 3×3 grid of
    // windows; the centre window (column 4) reads the whole input in order.
    let x = Tensor::<f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[1, 1, 2, 2]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        let cols = x.im2col([2, 2], [1, 1], [1, 1]);
        assert_eq!(cols.shape().to_vec(), [1, 4, 9]);
        let v = cols.value().unwrap();
        let centre: Vec<f64> = (0..4).map(|row| v[row * 9 + 4]).collect();
        assert_eq!(centre, [1.0, 2.0, 3.0, 4.0]);
        // Top-left window: only its bottom-right tap (row 3) is inside the input.
        assert_eq!([v[0], v[9], v[18], v[27]], [0.0, 0.0, 0.0, 1.0]);
        // L = Σ cols: each x element is read by 4 windows, so dL/dx = 4.
        s.backward(cols.sum()).unwrap();
        assert_eq!(x.grad().unwrap(), &[4.0, 4.0, 4.0, 4.0]);
    });
}

#[test]
fn pools_by_hand() {
    // 4×4 input 0..16, 2×2 windows with stride 2: maxima are the bottom-right corners.
    let x = Tensor::<f64>::from_vec((0..16).map(f64::from).collect(), &[1, 1, 4, 4]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let xv = s.leaf(&x);
        let m = xv.max_pool2d([2, 2], [2, 2], [0, 0]);
        assert_eq!(m.value().unwrap(), &[5.0, 7.0, 13.0, 15.0]);
        let a = xv.avg_pool2d([2, 2], [2, 2], [0, 0]);
        assert_eq!(a.value().unwrap(), &[2.5, 4.5, 10.5, 12.5]);
        // L = Σ max + Σ avg: each maximum gets 1 + 1/4, every other element 1/4.
        s.backward(m.sum() + a.sum()).unwrap();
        let g = xv.grad().unwrap();
        assert_eq!(g.iter().filter(|&&v| v == 1.25).count(), 4);
        assert_eq!(g.iter().filter(|&&v| v == 0.25).count(), 12);
        assert_eq!(g[5], 1.25);
    });
}

#[test]
fn bad_windows_are_errors() {
    let x = Tensor::<f32>::zeros(&[1, 1, 3, 3]).unwrap();
    let flat = Tensor::<f32>::zeros(&[3, 3]).unwrap();
    let mut g = Graph::<f32>::new();
    let errs: Vec<Error> = [
        g.scope(|s| s.input(&x).im2col([4, 4], [1, 1], [0, 0]).value().map(|_| ())),
        g.scope(|s| s.input(&x).im2col([0, 1], [1, 1], [0, 0]).value().map(|_| ())),
        g.scope(|s| s.input(&x).max_pool2d([2, 2], [0, 1], [0, 0]).value().map(|_| ())),
        g.scope(|s| s.input(&x).avg_pool2d([2, 2], [1, 1], [2, 0]).value().map(|_| ())),
        g.scope(|s| s.input(&flat).max_pool2d([2, 2], [1, 1], [0, 0]).value().map(|_| ())),
        g.scope(|s| {
            let w = s.zeros(&[2, 3, 1, 1]);
            s.input(&x).conv2d(w, [1, 1], [0, 0]).value().map(|_| ())
        }),
    ]
    .into_iter()
    .map(|r| r.unwrap_err())
    .collect();
    assert!(errs[0].to_string().contains("[1, 1, 3, 3]"), "{}", errs[0]);
    assert!(errs.iter().all(|e| matches!(e, Error::InvalidShape { .. } | Error::InvalidArgument { .. })));
    assert!(errs[5].to_string().contains("[2, 3, 1, 1]"), "{}", errs[5]);
}
