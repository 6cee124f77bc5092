//! Convolution and pooling (`ops/conv/`): gradients against finite differences (with
//! dilation and groups, and second derivatives), hand-worked windows and the errors of bad
//! windows and bad groups. PyTorch's values are checked in `conv_fixtures.rs`, the window
//! ops' own loops against naive ones in `conv_loops.rs`.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{Conv2dOptions, Error, Graph, Tensor};

pub(crate) fn tensor(dims: &[usize], seed: u64) -> Tensor<f64> {
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

/// `(x dims, kernel, stride, padding, dilation)`.
pub(crate) type DilatedWindow = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 2]);

/// `(x dims, kernel, stride, padding, dilation)` as [`windows`], with a dilation of 1 to 3
/// per axis and the input large enough for the dilated kernel.
fn dilated_windows() -> impl Strategy<Value = DilatedWindow> {
    (windows(), 1..=3usize, 1..=3usize).prop_flat_map(|((dims, k, st, p), dh, dw)| {
        let reach = |k: usize, d: usize, p: usize| (d * (k - 1) + 1).saturating_sub(2 * p).max(1);
        let (h0, w0) = (reach(k[0], dh, p[0]), reach(k[1], dw, p[1]));
        (h0..=h0 + 4, w0..=w0 + 4).prop_map(move |(h, w)| ([dims[0], dims[1], h, w], k, st, p, [dh, dw]))
    })
}

/// `(groups, channels per group, outputs per group)`: groups 1 to 3, so that a group of
/// one channel (depthwise) and several are both drawn.
fn groups() -> impl Strategy<Value = (usize, usize, usize)> {
    (1..=3usize, 1..=2usize, 1..=2usize)
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

    #[test]
    fn dilated_im2col_and_max_pool_grads_match_finite_differences((dims, k, st, p, d) in dilated_windows(), seed: u64) {
        let x = tensor(&dims, seed);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        gradcheck(std::slice::from_ref(&x), opts, |_, v| v[0].im2col_dilated(k, st, p, d))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        // A dilated window may straddle a small input and hold no tap: −∞, excluded here.
        let mut g = Graph::<f64>::new();
        let finite = g.scope(|s| s.input(&x).max_pool2d_dilated(k, st, p, d).value().unwrap().iter().all(|v| v.is_finite()));
        prop_assume!(finite);
        gradcheck(&[x], opts, |_, v| v[0].max_pool2d_dilated(k, st, p, d))
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }

    #[test]
    fn grouped_dilated_conv2d_grad_matches_finite_differences(
        (dims, k, st, p, d) in dilated_windows(), (g, cg, og) in groups(), seed: u64,
    ) {
        let x = tensor(&[dims[0], g * cg, dims[2], dims[3]], seed);
        let w = tensor(&[g * og, cg, k[0], k[1]], seed ^ 1);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        let conv = Conv2dOptions::new().stride(st).padding(p).dilation(d).groups(g);
        gradcheck(&[x, w], opts, |_, v| v[0].conv2d_with(v[1], conv)).map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
}

proptest! {
    // Second derivatives cost a gradient per input element: fewer, smaller cases.
    #![proptest_config(ProptestConfig::with_cases(8))]

    #[test]
    fn grouped_dilated_conv2d_second_derivatives_match_finite_differences(
        (dims, k, st, p, d) in dilated_windows(), (g, og) in (1..=3usize, 1..=2usize), seed: u64,
    ) {
        let x = tensor(&[1, g, dims[2], dims[3]], seed);
        let w = tensor(&[g * og, 1, k[0], k[1]], seed ^ 1);
        let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
        let conv = Conv2dOptions::new().stride(st).padding(p).dilation(d).groups(g);
        // tanh, so that the second derivative is not zero.
        gradgradcheck(&[x, w], opts, |_, v| v[0].conv2d_with(v[1], conv).tanh())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
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

#[test]
fn dilated_windows_by_hand() {
    // x = 1..9 as 3×3; a 2×2 kernel dilated by 2 has one window, the four corners.
    let x = Tensor::<f64>::from_vec((1..=9).map(f64::from).collect(), &[1, 1, 3, 3]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let xv = s.leaf(&x);
        let cols = xv.im2col_dilated([2, 2], [1, 1], [0, 0], [2, 2]);
        assert_eq!(cols.shape().to_vec(), [1, 4, 1]);
        assert_eq!(cols.value().unwrap(), &[1.0, 3.0, 7.0, 9.0]);
        let m = xv.max_pool2d_dilated([2, 2], [1, 1], [0, 0], [2, 2]);
        assert_eq!(m.value().unwrap(), &[9.0]);
        // L = Σ cols + max: the corners get 1 from the columns, the maximum (9) 1 more.
        s.backward(cols.sum() + m.sum()).unwrap();
        assert_eq!(xv.grad().unwrap(), &[1.0, 0.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0, 2.0]);
    });
}

#[test]
fn a_dilated_window_can_straddle_the_input_as_in_pytorch() {
    // One element, kernel 2 dilated by 2, padding 1: the taps at −1 and 1 both miss it.
    // PyTorch's max_pool2d gives −∞ here (its padding rule is the undilated kernel's).
    let x = Tensor::<f64>::from_vec(vec![3.0], &[1, 1, 1, 1]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let xv = s.leaf(&x);
        let m = xv.max_pool2d_dilated([2, 2], [1, 1], [1, 1], [2, 2]);
        assert_eq!(m.value().unwrap(), &[f64::NEG_INFINITY]);
        s.backward(m.sum()).unwrap();
        assert_eq!(xv.grad().unwrap(), &[0.0]);
    });
}

#[test]
fn depthwise_conv_by_hand() {
    // Two channels, 1×1 kernels, groups 2: each channel is scaled by its own weight.
    // L = Σ out ⊙ r with r = 1: dL/dw[c] = Σ x[c], dL/dx[c] = w[c].
    let x = Tensor::<f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[1, 2, 1, 2]).unwrap();
    let w = Tensor::<f64>::from_vec(vec![10.0, 100.0], &[2, 1, 1, 1]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (xv, wv) = (s.leaf(&x), s.leaf(&w));
        let y = xv.conv2d_with(wv, Conv2dOptions::new().groups(2));
        assert_eq!(y.value().unwrap(), &[10.0, 20.0, 300.0, 400.0]);
        s.backward(y.sum()).unwrap();
        assert_eq!(wv.grad().unwrap(), &[3.0, 7.0]);
        assert_eq!(xv.grad().unwrap(), &[10.0, 10.0, 100.0, 100.0]);
    });
}

#[test]
fn default_options_record_what_conv2d_records() {
    // One group and no dilation keep the one-GEMM recording, op for op.
    let x = tensor(&[2, 3, 6, 5], 1);
    let w = tensor(&[4, 3, 3, 2], 2);
    let mut g = Graph::<f64>::new();
    let record = |g: &mut Graph<f64>, with: bool| {
        g.scope(|s| {
            let (xv, wv) = (s.leaf(&x), s.leaf(&w));
            let y = if with {
                xv.conv2d_with(wv, Conv2dOptions::new().stride([2, 1]).padding([1, 0]))
            } else {
                xv.conv2d(wv, [2, 1], [1, 0])
            };
            (s.dump(), y.value().unwrap().to_vec())
        })
    };
    let (plain, with) = (record(&mut g, false), record(&mut g, true));
    assert_eq!(plain, with);
    assert_eq!(plain.0.lines().count(), 6, "{}", plain.0); // x, w, im2col, reshape, matmul, reshape
}

#[test]
fn bad_groups_and_dilations_are_errors_naming_shapes_and_line() {
    let x = Tensor::<f32>::zeros(&[1, 4, 5, 5]).unwrap();
    let mut g = Graph::<f32>::new();
    let conv = |g: &mut Graph<f32>, w: &[usize], opts: Conv2dOptions| {
        g.scope(|s| {
            let w = s.zeros(w);
            (line!(), s.input(&x).conv2d_with(w, opts).value().map(|_| ()).unwrap_err())
        })
    };
    let cases = [
        // groups 0; C = 4 not a multiple of 3; O = 3 not a multiple of 2; C/g = 2 but w has 4.
        (conv(&mut g, &[4, 4, 3, 3], Conv2dOptions::new().groups(0)), "groups must be positive"),
        (conv(&mut g, &[3, 1, 3, 3], Conv2dOptions::new().groups(3)), "groups = 3"),
        (conv(&mut g, &[3, 2, 3, 3], Conv2dOptions::new().groups(2)), "groups = 2"),
        (conv(&mut g, &[4, 4, 3, 3], Conv2dOptions::new().groups(2)), "groups = 2"),
        (conv(&mut g, &[4, 4, 3, 3], Conv2dOptions::new().dilation([0, 1])), "must be positive"),
        // A 3×3 kernel dilated by 3 spans 7 rows; the input has 5.
        (conv(&mut g, &[4, 4, 3, 3], Conv2dOptions::new().dilation([3, 1])), "dilated by [3, 1]"),
    ];
    for ((line, e), needle) in &cases {
        let text = e.to_string();
        assert_eq!(e.op(), "conv2d_with", "{text}");
        assert!(text.contains(needle) && text.contains("[1, 4, 5, 5]"), "{text}");
        assert!(text.contains(&format!(":{line}:")), "{text} (line {line})");
        assert!(matches!(e, Error::InvalidShape { .. } | Error::InvalidArgument { .. }), "{text}");
    }
    assert!(cases[..4].iter().all(|((_, e), _)| e.to_string().contains("weights [")));
    let (line, e) =
        g.scope(|s| (line!(), s.input(&x).max_pool2d_dilated([2, 2], [1, 1], [0, 0], [1, 0]).value().unwrap_err()));
    assert!(
        matches!(&e, Error::InvalidArgument { op: "max_pool2d_dilated", location, .. } if location.line() == line),
        "{e}"
    );
}
