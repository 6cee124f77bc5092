//! W1's three products (`y = x·x`, `dx = dy·xᵀ`, `dx += xᵀ·dy`, 1024², row-major as Tapir
//! stores them) at 2 threads, three ways: faer's own parallel product, two sequential faer
//! calls on column halves of the output (Tapir's tiling for a square product), and two on
//! row halves; the three together, each alone, and W2's square weight gradient
//! `dW1 += h0ᵀ·g1` (m = n = 1024, k = 256). Best of 5×10 per way, the ways alternated.
//! `cargo run --release -p benches --example gemm_w1`.
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use std::time::Instant;

const N: usize = 1024;

fn view(x: &[f32], rows: usize, t: bool) -> MatRef<'_, f32> {
    let v = MatRef::from_row_major_slice(x, rows, N);
    if t {
        v.transpose()
    } else {
        v
    }
}

fn product(way: usize, dst: MatMut<'_, f32>, acc: Accum, a: MatRef<'_, f32>, b: MatRef<'_, f32>) {
    let n = dst.ncols();
    match way {
        0 => matmul(dst, acc, a, b, 1.0, Par::rayon(2)),
        1 => {
            let (l, r) = dst.split_at_col_mut(n / 2);
            let (bl, br) = b.split_at_col(n / 2);
            rayon::join(|| matmul(l, acc, a, bl, 1.0, Par::Seq), || matmul(r, acc, a, br, 1.0, Par::Seq));
        }
        _ => {
            let (t, bo) = dst.split_at_row_mut(n / 2);
            let (at, ab) = a.split_at_row(n / 2);
            rayon::join(|| matmul(t, acc, at, b, 1.0, Par::Seq), || matmul(bo, acc, ab, b, 1.0, Par::Seq));
        }
    }
}

/// The operands: `x`, a matrix of ones (the seed's broadcast), `h0` and `g1` (256×1024).
struct Data {
    x: Vec<f32>,
    ones: Vec<f32>,
    h0: Vec<f32>,
    g1: Vec<f32>,
}

/// Product `p` (0–2: W1's, 3: W2's `dW1`) into `dst`, the `way` of [`product`].
fn one(p: usize, way: usize, d: &Data, dst: &mut [f32]) {
    let dst = MatMut::from_row_major_slice_mut(dst, N, N);
    match p {
        0 => product(way, dst, Accum::Replace, view(&d.x, N, false), view(&d.x, N, false)),
        1 => product(way, dst, Accum::Replace, view(&d.ones, N, false), view(&d.x, N, true)),
        2 => product(way, dst, Accum::Add, view(&d.x, N, true), view(&d.ones, N, false)),
        _ => product(way, dst, Accum::Add, view(&d.h0, 256, true), view(&d.g1, 256, false)),
    }
}

fn main() {
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().expect("the first pool");
    let fill = |len: usize, m: usize| (0..len).map(|i| ((i * m) % 1000) as f32 * 1e-3 - 0.5).collect::<Vec<f32>>();
    let d = Data { x: fill(N * N, 7919), ones: vec![1.0; N * N], h0: fill(256 * N, 104729), g1: fill(256 * N, 7919) };
    let mut dst = vec![0.0f32; N * N];
    // W1's three together, then each alone, then W2's dW1.
    let runs: [(&str, &[usize]); 5] = [
        ("W1 step (3 products)", &[0, 1, 2]),
        ("y = x.x", &[0]),
        ("dx = dy.xT", &[1]),
        ("dx += xT.dy", &[2]),
        ("dW1 += h0T.g1 (W2)", &[3]),
    ];
    for (name, products) in runs {
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            for (way, b) in best.iter_mut().enumerate() {
                let t = Instant::now();
                for _ in 0..10 {
                    for &p in products {
                        one(p, way, &d, &mut dst);
                    }
                }
                *b = b.min(t.elapsed().as_secs_f64() * 1e3 / 10.0);
            }
        }
        println!(
            "{name:22} faer Par::rayon(2) {:.2} ms, column tiles (Tapir) {:.3}x, row tiles {:.3}x",
            best[0],
            best[1] / best[0],
            best[2] / best[0]
        );
    }
    std::hint::black_box(dst[0]);
}
