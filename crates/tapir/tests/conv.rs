//! Convolution and pooling (`ops/conv/`): gradients against finite differences (with
//! dilation and groups, and second derivatives), hand-worked windows and the errors of bad
//! windows and bad groups. PyTorch's values are checked in `conv_fixtures.rs`.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};

use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{Conv2dOptions, Error, Graph, Tensor};

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

/// `(x dims, kernel, stride, padding, dilation)`.
type DilatedWindow = ([usize; 4], [usize; 2], [usize; 2], [usize; 2], [usize; 2]);

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

/// Naive `[N, C, H, W]` window loops for the large-input check below: for every output
/// `(plane, oi, oj)`, the input positions of its window inside the input, row-major.
fn naive_windows([n, c, h, w]: [usize; 4], k: usize, s: usize, p: usize, d: usize) -> (usize, usize, Vec<Vec<usize>>) {
    let (oh, ow) = ((h + 2 * p - d * (k - 1) - 1) / s + 1, (w + 2 * p - d * (k - 1) - 1) / s + 1);
    let mut taps = Vec::new();
    for plane in 0..n * c {
        for oi in 0..oh {
            for oj in 0..ow {
                let mut t = Vec::new();
                for a in 0..k {
                    for b in 0..k {
                        let (i, j) = ((oi * s + a * d) as isize - p as isize, (oj * s + b * d) as isize - p as isize);
                        if i >= 0 && j >= 0 && (i as usize) < h && (j as usize) < w {
                            t.push(plane * h * w + i as usize * w + j as usize);
                        }
                    }
                }
                taps.push(t);
            }
        }
    }
    (oh, ow, taps)
}

/// Inputs of 34,816 elements take the window ops' split by planes and images (over
/// several threads when the graph has them): values and gradients equal naive loops,
/// and 1 and 3 threads give the same bits.
#[test]
fn large_windows_split_by_planes_match_naive_loops() {
    let dims = [4, 8, 34, 32];
    let x = tensor(&dims, 31);
    let xv = x.data().to_vec();
    let (k, s, p, d) = (3, 2, 1, 1);
    let (oh, ow, taps) = naive_windows(dims, k, s, p, d);
    let out_n = dims[0] * dims[1] * oh * ow;
    let wts: Vec<f64> = (0..out_n).map(|i| ((i * 37 % 101) as f64 - 50.0) / 25.0).collect();
    let w = Tensor::from_slice(&wts, &[dims[0], dims[1], oh, ow]).unwrap();
    // max pool: the first maximal tap wins and gets the gradient.
    let mut want_max = vec![0.0; out_n];
    let mut want_dmax = vec![0.0; xv.len()];
    let mut want_avg = vec![0.0; out_n];
    let mut want_davg = vec![0.0; xv.len()];
    for (o, t) in taps.iter().enumerate() {
        let best = t.iter().copied().fold(t[0], |b, i| if xv[i] > xv[b] { i } else { b });
        want_max[o] = xv[best];
        want_dmax[best] += wts[o];
        want_avg[o] = t.iter().map(|&i| xv[i]).sum::<f64>() / (k * k) as f64;
        for &i in t {
            want_davg[i] += wts[o] / (k * k) as f64;
        }
    }
    // im2col with dilation 2 (stride 1, padding 2): column (c, a, b) of image n.
    let (kd, pd, dd) = (3, 2, 2);
    let (oh2, ow2, _) = naive_windows(dims, kd, 1, pd, dd);
    let (h, wd) = (dims[2] as isize, dims[3] as isize);
    // col2im(cols) in the gradient: each input element once per column that copies it.
    let (mut want_cols, mut copies) = (Vec::new(), vec![0.0; xv.len()]);
    for n in 0..dims[0] {
        for c in 0..dims[1] {
            for a in 0..kd {
                for b in 0..kd {
                    for oi in 0..oh2 {
                        for oj in 0..ow2 {
                            let (i, j) = ((oi + a * dd) as isize - pd as isize, (oj + b * dd) as isize - pd as isize);
                            let inside = i >= 0 && j >= 0 && i < h && j < wd;
                            let at = (((n * dims[1] + c) as isize * h + i) * wd + j) as usize;
                            want_cols.push(if inside { xv[at] } else { 0.0 });
                            if inside {
                                copies[at] += 1.0;
                            }
                        }
                    }
                }
            }
        }
    }
    let mut runs = Vec::new();
    for threads in [1, 3] {
        let mut g = Graph::<f64>::new();
        g.set_threads(threads);
        let run = g.scope(|sc| {
            let xs = sc.leaf(&x);
            let wv = sc.input(&w);
            let max = xs.max_pool2d([k, k], [s, s], [p, p]);
            let avg = xs.avg_pool2d([k, k], [s, s], [p, p]);
            let cols = xs.im2col_dilated([kd, kd], [1, 1], [pd, pd], [dd, dd]);
            let (mv, av, cv) =
                (max.value().unwrap().to_vec(), avg.value().unwrap().to_vec(), cols.value().unwrap().to_vec());
            assert_eq!(mv, want_max, "{threads} threads: max_pool2d");
            assert!(av.iter().zip(&want_avg).all(|(a, b)| (a - b).abs() < 1e-12), "{threads} threads: avg_pool2d");
            assert_eq!(cv, want_cols, "{threads} threads: im2col");
            // Σ w ⊙ max + Σ w ⊙ avg + Σ cols²/2: dx = routed w + spread w + col2im(cols).
            let loss = (max * wv).sum() + (avg * wv).sum() + (cols.square() * 0.5).sum();
            sc.backward(loss).unwrap();
            let dx = xs.grad().unwrap().to_vec();
            (mv, av, cv, dx)
        });
        runs.push(run);
    }
    let dx = &runs[0].3;
    for i in 0..xv.len() {
        let want = want_dmax[i] + want_davg[i] + copies[i] * xv[i];
        assert!((dx[i] - want).abs() < 1e-10, "dx[{i}] = {} against {want}", dx[i]);
    }
    let bits = |r: &(Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>)| {
        [&r.0, &r.1, &r.2, &r.3].iter().flat_map(|v| v.iter().map(|x| x.to_bits())).collect::<Vec<_>>()
    };
    assert_eq!(bits(&runs[0]), bits(&runs[1]), "1 and 3 threads differ");
}

/// Stride-1 windows whose outputs are as wide as the input ("same" width, `2·pw =
/// dw·(kw − 1)`) take one shifted copy per kernel tap in `im2col` and whole rows in its
/// adjoint: the columns equal a naive loop's exactly (zeros in the padding, in a warmed-up
/// arena too), and the gradient of `Σ cols ⊙ r` is `r` summed onto each input element in
/// kernel-tap order, bit for bit, at 1 and 3 threads. The geometries include kernel rows
/// wholly in the padding, a shift as wide as the input and an image split over threads.
#[test]
fn same_width_im2col_and_col2im_match_naive_loops_bitwise() {
    // Stride 1 and ow = w in each.
    let cases: [DilatedWindow; 7] = [
        ([8, 4, 12, 10], [3, 3], [1, 1], [1, 1], [1, 1]),
        ([2, 3, 5, 4], [1, 1], [1, 1], [0, 0], [1, 1]),
        ([2, 2, 6, 7], [3, 5], [1, 1], [0, 2], [1, 1]),
        ([2, 2, 7, 6], [3, 3], [1, 1], [2, 2], [2, 2]),
        ([2, 2, 1, 1], [5, 3], [1, 1], [2, 1], [1, 1]),
        ([1, 2, 4, 5], [2, 3], [1, 1], [0, 1], [1, 1]),
        ([3, 1, 2, 3], [1, 7], [1, 1], [0, 3], [1, 1]),
    ];
    for (case, &(dims, k, st, p, d)) in cases.iter().enumerate() {
        let [n, c, h, w] = dims;
        let x = tensor(&dims, 40 + case as u64);
        let xv = x.data().to_vec();
        let oh = h + 2 * p[0] - d[0] * (k[0] - 1);
        assert_eq!(w + 2 * p[1] - d[1] * (k[1] - 1), w, "case {case} is same-width");
        let l = oh * w;
        let (mut want_cols, mut want_dx) = (Vec::new(), vec![0.0f64; xv.len()]);
        let r: Vec<f64> = (0..n * c * k[0] * k[1] * l).map(|i| ((i * 53 % 97) as f64 - 48.0) / 7.0).collect();
        for ni in 0..n {
            for ci in 0..c {
                for a in 0..k[0] {
                    for b in 0..k[1] {
                        for oi in 0..oh {
                            for oj in 0..w {
                                let i = (oi + a * d[0]) as isize - p[0] as isize;
                                let j = (oj + b * d[1]) as isize - p[1] as isize;
                                let inside = i >= 0 && j >= 0 && (i as usize) < h && (j as usize) < w;
                                let at = ((ni * c + ci) * h + i.max(0) as usize) * w + j.max(0) as usize;
                                let o = want_cols.len();
                                want_cols.push(if inside { xv[at] } else { 0.0 });
                                if inside {
                                    want_dx[at] += r[o];
                                }
                            }
                        }
                    }
                }
            }
        }
        let rt = Tensor::from_vec(r, &[n, c * k[0] * k[1], l]).unwrap();
        let other = tensor(&dims, 99);
        for threads in [1, 3] {
            let mut g = Graph::<f64>::new();
            g.set_threads(threads);
            // The second and third scopes reuse the first one's buffers, which hold other values.
            for input in [&other, &x, &x] {
                let (cols, dx) = g.scope(|s| {
                    let xs = s.leaf(input);
                    let cols = xs.im2col_dilated(k, st, p, d);
                    s.backward((cols * s.input(&rt)).sum()).unwrap();
                    (cols.value().unwrap().to_vec(), xs.grad().unwrap().to_vec())
                });
                if std::ptr::eq(input, &x) {
                    let bits = |v: &[f64]| v.iter().map(|e| e.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&cols), bits(&want_cols), "case {case}, {threads} threads: im2col");
                    assert_eq!(bits(&dx), bits(&want_dx), "case {case}, {threads} threads: col2im");
                }
            }
        }
    }
}

/// Max pooling without padding or dilation takes its own loops (`Window::max_plain`):
/// values and gradients equal naive loops, NaN windows included, at 1 and 3 threads.
#[test]
fn plain_max_pooling_matches_naive_loops() {
    let dims = [4, 8, 34, 32];
    let mut xv = tensor(&dims, 33).data().to_vec();
    // Repeated maxima (the first tap wins) and NaNs (a NaN wins and stays).
    for i in (0..xv.len()).step_by(97) {
        xv[i + 1] = xv[i].abs() + 3.0;
        xv[i] = xv[i + 1];
    }
    for i in (5..xv.len()).step_by(1009) {
        xv[i] = f64::NAN;
    }
    let x = Tensor::from_vec(xv.clone(), &dims).unwrap();
    for (k, s) in [(2, 2), (3, 2), (3, 1)] {
        let (oh, ow, taps) = naive_windows(dims, k, s, 0, 1);
        let (mut want, mut want_dx) = (vec![0.0; taps.len()], vec![0.0; xv.len()]);
        for (o, t) in taps.iter().enumerate() {
            let best =
                t.iter()
                    .copied()
                    .fold(t[0], |b, i| if xv[b].is_nan() || !(xv[i] > xv[b] || xv[i].is_nan()) { b } else { i });
            want[o] = xv[best];
            want_dx[best] += (o % 7) as f64 - 3.0;
        }
        let w: Vec<f64> = (0..taps.len()).map(|o| (o % 7) as f64 - 3.0).collect();
        let w = Tensor::from_slice(&w, &[dims[0], dims[1], oh, ow]).unwrap();
        for threads in [1, 3] {
            let mut g = Graph::<f64>::new();
            g.set_threads(threads);
            g.scope(|sc| {
                let xs = sc.leaf(&x);
                let y = xs.max_pool2d([k, k], [s, s], [0, 0]);
                let got = y.value().unwrap().to_vec();
                let same = got.iter().zip(&want).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
                assert!(same, "kernel {k}, stride {s}, {threads} threads: values");
                sc.backward((y * sc.input(&w)).sum()).unwrap();
                assert_eq!(xs.grad().unwrap(), &want_dx[..], "kernel {k}, stride {s}, {threads} threads: gradient");
            });
        }
    }
}

/// A per-channel operand `[C, 1, 1]` against `[N, C, H, W]` of 65,536 elements takes the
/// channel loops (`kernels/channel.rs`), on either side of the op: values and gradients
/// equal the closed forms, and 1 and 3 threads give the same bits.
#[test]
fn channel_broadcasts_match_closed_forms_at_any_thread_count() {
    let dims = [4, 16, 32, 32];
    let (x, b) = (tensor(&dims, 41), tensor(&[16, 1, 1], 42));
    let (xv, bv) = (x.data().to_vec(), b.data().to_vec());
    let ch = |i: usize| (i / (32 * 32)) % 16;
    let mut runs = Vec::new();
    for threads in [1, 3] {
        let mut g = Graph::<f64>::new();
        g.set_threads(threads);
        runs.push(g.scope(|s| {
            let (xs, bs) = (s.leaf(&x), s.leaf(&b));
            let sum = xs + bs;
            let prod = xs * bs.reshape(&[1, 16, 1, 1]);
            let diff = bs - xs;
            for (i, ((&p, &q), &r)) in
                sum.value().unwrap().iter().zip(prod.value().unwrap()).zip(diff.value().unwrap()).enumerate()
            {
                let (xi, bi) = (xv[i], bv[ch(i)]);
                assert_eq!((p, q, r), (xi + bi, xi * bi, bi - xi), "element {i}");
            }
            // L = Σ sum² / 2 + Σ prod + Σ diff: dx = sum + b − 1, db[c] = Σ_c (sum + x + 1).
            s.backward((sum.square() * 0.5).sum() + prod.sum() + diff.sum()).unwrap();
            let (dx, db) = (xs.grad().unwrap().to_vec(), bs.grad().unwrap().to_vec());
            for (i, &d) in dx.iter().enumerate() {
                let want = xv[i] + bv[ch(i)] + bv[ch(i)] - 1.0;
                assert!((d - want).abs() < 1e-12, "dx[{i}] = {d} against {want}");
            }
            let mut want_db = vec![0.0; 16];
            for (i, &xi) in xv.iter().enumerate() {
                want_db[ch(i)] += xi + bv[ch(i)] + xi + 1.0;
            }
            for (c, (&d, &w)) in db.iter().zip(&want_db).enumerate() {
                assert!((d - w).abs() < 1e-9 * w.abs().max(1.0), "db[{c}] = {d} against {w}");
            }
            dx.iter().chain(&db).map(|v| v.to_bits()).collect::<Vec<_>>()
        }));
    }
    assert_eq!(runs[0], runs[1], "1 and 3 threads differ");
}

/// 2×2 max pooling with stride 2 (the pooling loops' two-rows-at-a-time path) on odd
/// sizes, with ties, signed zeros, infinities and NaNs, at 1 and 3 threads (a batch large
/// enough to split): the maximum is the first tap in row-major order that no later tap
/// beats (a NaN wins and stays) and takes the whole gradient, as a reference loop here
/// computes it.
#[test]
fn two_by_two_pooling_matches_a_reference_loop() {
    // Odd sizes leave a last row and column that no window reads; even ones do not, and
    // there a first gradient is written without a zero fill.
    for (h, w) in [(7, 9), (6, 8)] {
        pool_against_reference(64, 3, h, w);
    }
}

fn pool_against_reference(n: usize, c: usize, h: usize, w: usize) {
    let pick = [f64::NEG_INFINITY, -1.0, -0.0, 0.0, 1.0, 1.0, 2.0, f64::NAN, f64::INFINITY];
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let data: Vec<f64> = (0..n * c * h * w).map(|_| pick[rng.random_range(0..pick.len())]).collect();
    let x = Tensor::from_vec(data.clone(), &[n, c, h, w]).unwrap();
    let (oh, ow) = (h / 2, w / 2);
    let dout: Vec<f64> = (0..n * c * oh * ow).map(|i| 1.0 + (i % 5) as f64).collect();
    // A second term `Σ e ⊙ x`, recorded after the pooling so that its gradient reaches `x`
    // first: the pooling then adds to it instead of writing, at each window's maximum only.
    let e: Vec<f64> = (0..data.len()).map(|i| [0.25, 0.5, -2.0, 3.0][i % 4]).collect();
    let (mut want, mut want_grad, mut want_sum) = (vec![0.0; n * c * oh * ow], vec![0.0; data.len()], e.clone());
    for p in 0..n * c {
        for (oi, oj) in (0..oh).flat_map(|i| (0..ow).map(move |j| (i, j))) {
            let taps = [(0, 0), (0, 1), (1, 0), (1, 1)].map(|(a, b)| p * h * w + (2 * oi + a) * w + 2 * oj + b);
            let mut best = taps[0];
            for &t in &taps[1..] {
                if !data[best].is_nan() && (data[t] > data[best] || data[t].is_nan()) {
                    best = t;
                }
            }
            let o = (p * oh + oi) * ow + oj;
            want[o] = data[best];
            want_grad[best] += dout[o];
            want_sum[best] += dout[o];
        }
    }
    let e = Tensor::from_vec(e, &[n, c, h, w]).unwrap();
    let dout = Tensor::from_vec(dout, &[n, c, oh, ow]).unwrap();
    for (threads, accumulate) in [(1, false), (3, false), (1, true), (3, true)] {
        let mut g = Graph::<f64>::new();
        g.set_threads(threads);
        g.scope(|s| {
            let xv = s.leaf(&x);
            let y = xv.max_pool2d([2, 2], [2, 2], [0, 0]);
            let got = y.value().unwrap();
            let same = |a: f64, b: f64| a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan());
            assert!(got.iter().zip(&want).all(|(&a, &b)| same(a, b)), "{h}×{w}, {threads} threads: values differ");
            // Σ dout ⊙ y, with the NaN outputs' factors taken as they are.
            let loss = (y * s.input(&dout)).sum();
            let (loss, want) =
                if accumulate { (loss + (xv * s.input(&e)).sum(), &want_sum) } else { (loss, &want_grad) };
            s.backward(loss).unwrap();
            let same_grad = xv.grad().unwrap().iter().zip(want).all(|(a, b)| a.to_bits() == b.to_bits());
            assert!(same_grad, "{h}×{w}, {threads} threads, accumulating {accumulate}: gradients differ");
        });
    }
}
