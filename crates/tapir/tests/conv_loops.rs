//! The window ops' own loops against naive ones: inputs large enough to split over
//! threads, the same-width `im2col`/`col2im`, the max-pooling loops of plain and 2×2
//! windows, and per-channel broadcasts; values exactly, gradients exactly or to rounding,
//! and the same bits at 1 and 3 threads. (Gradients against finite differences are in
//! `conv.rs`.)

use rand::{RngExt, SeedableRng};
use tapir::{Graph, Tensor};

use crate::conv::{tensor, DilatedWindow};

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

/// A per-channel operand `[C, 1, 1]` against `[N, C, H, W]` takes the channel loops
/// (`kernels/channel.rs`), on either side of the op: values and gradients equal the
/// closed forms, and 1 and 3 threads give the same bits. Many channels of long rows split
/// the bias gradient by channels; few channels of short rows (a conv bias), by images.
#[test]
fn channel_broadcasts_match_closed_forms_at_any_thread_count() {
    for dims in [[4, 16, 32, 32], [64, 4, 8, 16], [256, 16, 8, 8]] {
        channel_broadcasts(dims);
    }
}

fn channel_broadcasts(dims: [usize; 4]) {
    let [_, c, h, w] = dims;
    let (x, b) = (tensor(&dims, 41), tensor(&[c, 1, 1], 42));
    let (xv, bv) = (x.data().to_vec(), b.data().to_vec());
    let ch = |i: usize| (i / (h * w)) % c;
    let mut runs = Vec::new();
    for threads in [1, 3] {
        let mut g = Graph::<f64>::new();
        g.set_threads(threads);
        runs.push(g.scope(|s| {
            let (xs, bs) = (s.leaf(&x), s.leaf(&b));
            let sum = xs + bs;
            let prod = xs * bs.reshape(&[1, c, 1, 1]);
            let diff = bs - xs;
            for (i, ((&p, &q), &r)) in
                sum.value().unwrap().iter().zip(prod.value().unwrap()).zip(diff.value().unwrap()).enumerate()
            {
                let (xi, bi) = (xv[i], bv[ch(i)]);
                assert_eq!((p, q, r), (xi + bi, xi * bi, bi - xi), "{dims:?}: element {i}");
            }
            // L = Σ sum² / 2 + Σ prod + Σ diff: dx = sum + b − 1, db[c] = Σ_c (sum + x + 1).
            s.backward((sum.square() * 0.5).sum() + prod.sum() + diff.sum()).unwrap();
            let (dx, db) = (xs.grad().unwrap().to_vec(), bs.grad().unwrap().to_vec());
            for (i, &d) in dx.iter().enumerate() {
                let want = xv[i] + bv[ch(i)] + bv[ch(i)] - 1.0;
                assert!((d - want).abs() < 1e-12, "{dims:?}: dx[{i}] = {d} against {want}");
            }
            let mut want_db = vec![0.0; c];
            for (i, &xi) in xv.iter().enumerate() {
                want_db[ch(i)] += xi + bv[ch(i)] + xi + 1.0;
            }
            for (k, (&d, &w)) in db.iter().zip(&want_db).enumerate() {
                assert!((d - w).abs() < 1e-9 * w.abs().max(1.0), "{dims:?}: db[{k}] = {d} against {w}");
            }
            dx.iter().chain(&db).map(|v| v.to_bits()).collect::<Vec<_>>()
        }));
    }
    assert_eq!(runs[0], runs[1], "{dims:?}: 1 and 3 threads differ");
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
