//! W2's eight products one by one at THREADS threads (default 1): Tapir's `gemm` (row-major, as the engine
//! calls it) against faer on column-major matrices (as the faer-direct baseline calls it),
//! and Tapir's output split into column blocks or its `k` into blocks.
//! `cargo run --release -p benches --example gemm_w2 -- [THREADS]`.
//!
//! With `layout` after THREADS: the eight products with weights stored `[in, out]` (as
//! `linear` takes them) against `[out, in]` (PyTorch's layout), alternated, medians.
//! With `one I row|col` after THREADS: product `I` (0 to 7) alone, 300 times, in one
//! orientation, for `perf record`.
//!
//! With `replace` after THREADS: each product accumulating into its destination
//! (`Accum::Add`) against the same product writing it (`Accum::Replace`), alternated over
//! 40 repetitions of 4 calls, medians: what writing a first gradient saves.
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};
use std::time::Instant;
use tapir::Float;

/// A product as `f32::gemm` takes it: `(m, k, n, a_t, b_t, accumulate)`.
type Call = (usize, usize, usize, bool, bool, bool);
/// A product's `a`, `b` and destination.
type Buffers = (Vec<f32>, Vec<f32>, Vec<f32>);

/// `a` (`m·k` elements) and `b` (`k·n`), filled with a fixed pattern.
fn operands(m: usize, k: usize, n: usize) -> (Vec<f32>, Vec<f32>) {
    let fill = |len: usize, seed: usize| (0..len).map(|i| ((i * seed) % 1000) as f32 * 1e-3).collect();
    (fill(m * k, 7919), fill(k * n, 104729))
}

fn time(f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t = Instant::now();
        for _ in 0..20 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 20.0);
    }
    best * 1e3
}

/// Medians of `Accum::Add` and `Accum::Replace`, alternated, per product.
fn add_against_replace(shapes: &[(&str, usize, usize, usize, bool, bool, bool)], par: Par) {
    for &(name, m, k, n, a_t, b_t, _) in shapes {
        let (a, b) = operands(m, k, n);
        let mut c = vec![0.0f32; m * n];
        let (mut add, mut replace) = (Vec::new(), Vec::new());
        for rep in 0..40 {
            for acc in [rep % 2 == 0, rep % 2 == 1] {
                let t = Instant::now();
                for _ in 0..4 {
                    f32::gemm(&mut c, &a, a_t, &b, b_t, (m, k, n), acc, par);
                }
                let ms = t.elapsed().as_secs_f64() / 4.0 * 1e3;
                if acc { &mut add } else { &mut replace }.push(ms);
            }
        }
        add.sort_by(f64::total_cmp);
        replace.sort_by(f64::total_cmp);
        let (a, r) = (add[20], replace[20]);
        println!("{name:18} add {a:.3} ms, replace {r:.3} ms, add/replace {:.3}", a / r);
    }
}

/// One of W2's products 300 times, row-major as Tapir calls it or column-major as
/// faer-direct does (`col`), `Accum::Replace`: for `perf record`, to see where the time of
/// each orientation goes (faer packs `op(a)` when the destination is column-major and
/// `op(b)ᵀ` when it is row-major).
fn one_product((name, m, k, n, a_t, b_t, _): (&str, usize, usize, usize, bool, bool, bool), col: bool, par: Par) {
    let (a, b) = operands(m, k, n);
    let mut c = vec![0.0f32; m * n];
    // Column-major operands with faer-direct's layout: `a` stored `k×m` (then transposed)
    // when `a_t`, `b` stored `n×k` when `b_t`.
    let (ar, ac) = if a_t { (k, m) } else { (m, k) };
    let (br, bc) = if b_t { (n, k) } else { (k, n) };
    let fa = Mat::<f32>::from_fn(ar, ac, |i, j| a[(i * ac + j) % a.len()]);
    let fb = Mat::<f32>::from_fn(br, bc, |i, j| b[(i * bc + j) % b.len()]);
    let fav = if a_t { fa.as_ref().transpose() } else { fa.as_ref() };
    let fbv = if b_t { fb.as_ref().transpose() } else { fb.as_ref() };
    let mut fc = Mat::<f32>::zeros(m, n);
    let t = Instant::now();
    for _ in 0..300 {
        if col {
            matmul(fc.as_mut(), Accum::Replace, fav, fbv, 1.0f32, par);
        } else {
            f32::gemm(&mut c, &a, a_t, &b, b_t, (m, k, n), false, par);
        }
    }
    let ms = t.elapsed().as_secs_f64() / 300.0 * 1e3;
    println!("{name} {}: {ms:.3} ms", if col { "column-major" } else { "row-major" });
}

/// W2's eight products as Tapir calls them with weights stored `[in, out]` (`linear`'s
/// `w: [k, n]`) against weights stored `[out, in]` (PyTorch's layout), alternated over 30
/// repetitions of 4 steps, medians per product and of the sum.
fn weight_layouts(par: Par) {
    let dims = [784usize, 1024, 1024, 10];
    let batch = 256;
    // (name, the call in each layout) per product.
    let mut prods: Vec<(String, [Call; 2])> = Vec::new();
    for l in 0..3 {
        let (i, o) = (dims[l], dims[l + 1]);
        prods.push((format!("fwd {l}"), [(batch, i, o, false, false, true), (batch, i, o, false, true, true)]));
        prods.push((format!("dW {l}"), [(i, batch, o, true, false, false), (o, batch, i, true, false, false)]));
        if l > 0 {
            prods.push((format!("dx {l}"), [(batch, o, i, false, true, false), (batch, o, i, false, false, false)]));
        }
    }
    let mut times = vec![[Vec::new(), Vec::new()]; prods.len()];
    let mut sums = [Vec::new(), Vec::new()];
    let mut bufs: Vec<[Buffers; 2]> = prods
        .iter()
        .map(|(_, shapes)| {
            shapes.map(|(m, k, n, ..)| {
                let (a, b) = operands(m, k, n);
                (a, b, vec![0.0f32; m * n])
            })
        })
        .collect();
    for rep in 0..30 {
        for layout in [rep % 2, 1 - rep % 2] {
            let mut total = 0.0;
            for (p, (_, shapes)) in prods.iter().enumerate() {
                let (m, k, n, a_t, b_t, acc) = shapes[layout];
                let (a, b, c) = &mut bufs[p][layout];
                let t = Instant::now();
                for _ in 0..4 {
                    f32::gemm(c, a, a_t, b, b_t, (m, k, n), acc, par);
                }
                let ms = t.elapsed().as_secs_f64() / 4.0 * 1e3;
                times[p][layout].push(ms);
                total += ms;
            }
            sums[layout].push(total);
        }
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    for (p, (name, _)) in prods.iter().enumerate() {
        let (a, b) = (median(&mut times[p][0]), median(&mut times[p][1]));
        println!("{name:8} [in,out] {a:.3} ms, [out,in] {b:.3} ms, ratio {:.3}", a / b);
    }
    let (a, b) = (median(&mut sums[0]), median(&mut sums[1]));
    println!("the eight: [in,out] {a:.3} ms, [out,in] {b:.3} ms, ratio {:.3}", a / b);
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    let par = if threads > 1 { Par::rayon(threads) } else { Par::Seq };
    // (name, m, k, n, a_t, b_t, accumulate) as Tapir calls them in W2.
    let shapes = [
        ("h0 = x.W0 (+b)", 256, 784, 1024, false, false, true),
        ("h1 = h0.W1 (+b)", 256, 1024, 1024, false, false, true),
        ("h2 = h1.W2 (+b)", 256, 1024, 10, false, false, true),
        ("dW2 += h1t.g2", 1024, 256, 10, true, false, true),
        ("dh1 += g2.W2t", 256, 10, 1024, false, true, true),
        ("dW1 += h0t.g1", 1024, 256, 1024, true, false, true),
        ("dh0 += g1.W1t", 256, 1024, 1024, false, true, true),
        ("dW0 += xt.g0", 784, 256, 1024, true, false, true),
    ];
    if std::env::args().nth(2).as_deref() == Some("one") {
        let arg = |i: usize| std::env::args().nth(i).unwrap_or_default();
        let idx: usize = arg(3).parse().expect("a product index, 0 to 7");
        one_product(shapes[idx], arg(4) == "col", par);
        return;
    }
    if std::env::args().nth(2).as_deref() == Some("layout") {
        weight_layouts(par);
        return;
    }
    if std::env::args().nth(2).as_deref() == Some("replace") {
        add_against_replace(&shapes, par);
        return;
    }
    let (mut tt, mut tr, mut tf) = (0.0, 0.0, 0.0);
    for &(name, m, k, n, a_t, b_t, acc) in &shapes {
        let (a, b) = operands(m, k, n);
        let mut c = vec![0.0f32; m * n];
        let tapir = time(&mut || f32::gemm(&mut c, &a, a_t, &b, b_t, (m, k, n), acc, par));
        let tapir_rep = time(&mut || f32::gemm(&mut c, &a, a_t, &b, b_t, (m, k, n), false, par));
        // faer-direct: column-major m×k and k×n, dst m×n, as in `benches::FaerMlp`.
        let fa = Mat::<f32>::from_fn(m, k, |i, j| a[(i * k + j) % a.len()]);
        let fb = Mat::<f32>::from_fn(k, n, |i, j| b[(i * n + j) % b.len()]);
        let mut fc = Mat::<f32>::zeros(m, n);
        let faer = time(&mut || matmul(fc.as_mut(), Accum::Replace, fa.as_ref(), fb.as_ref(), 1.0f32, par));
        // Tapir's n split into column blocks (faer's m for a row-major dst), and k blocks.
        let mut variants = String::new();
        let av = if a_t {
            faer::MatRef::from_row_major_slice(&a, k, m).transpose()
        } else {
            faer::MatRef::from_row_major_slice(&a, m, k)
        };
        let bv = if b_t {
            faer::MatRef::from_row_major_slice(&b, n, k).transpose()
        } else {
            faer::MatRef::from_row_major_slice(&b, k, n)
        };
        for nb in [128usize, 256, 512] {
            if nb >= n {
                continue;
            }
            let t = time(&mut || {
                let dst = faer::MatMut::from_row_major_slice_mut(&mut c, m, n);
                let mut dst = dst;
                for j in (0..n).step_by(nb) {
                    let w = nb.min(n - j);
                    matmul(dst.as_mut().subcols_mut(j, w), Accum::Add, av, bv.subcols(j, w), 1.0f32, Par::Seq);
                }
            });
            variants += &format!(" n/{nb} {t:.3}");
        }
        for kb in [128usize, 256, 512] {
            if kb >= k {
                continue;
            }
            let t = time(&mut || {
                let mut dst = faer::MatMut::from_row_major_slice_mut(&mut c, m, n);
                for s in (0..k).step_by(kb) {
                    let w = kb.min(k - s);
                    matmul(dst.as_mut(), Accum::Add, av.subcols(s, w), bv.subrows(s, w), 1.0f32, Par::Seq);
                }
            });
            variants += &format!(" k/{kb} {t:.3}");
        }
        // A column-major temporary, then `c (+)= tmp` row by row (what a row-major engine
        // would have to add to hand faer its preferred destination).
        let mut tmp = Mat::<f32>::zeros(m, n);
        let t_col = time(&mut || matmul(tmp.as_mut(), Accum::Replace, av, bv, 1.0f32, par));
        let t_copy = time(&mut || {
            for (i, row) in c.chunks_exact_mut(n).enumerate() {
                for (j, x) in row.iter_mut().enumerate() {
                    *x += tmp[(i, j)];
                }
            }
        });
        variants += &format!(" col-dst {t_col:.3} + add-back {t_copy:.3}");
        println!("   variants:{variants}");
        tt += tapir;
        tr += tapir_rep;
        tf += faer;
        println!("{name:18} m {m:5} k {k:5} n {n:5}: tapir {tapir:.3} ms (replace {tapir_rep:.3}), faer col-major {faer:.3}, ratio {:.3}", tapir / faer);
    }
    println!("total: tapir {tt:.3} ms (replace {tr:.3}), faer col-major {tf:.3}, ratio {:.3}", tt / tf);
}
