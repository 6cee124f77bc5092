//! W1's three products (`y = x·x`, `dx = dy·xᵀ`, `dx += xᵀ·dy`, 1024², row-major as Tapir
//! stores them) at 2 threads, three ways: faer's own parallel product, two sequential faer
//! calls on column halves of the output (Tapir's tiling for a square product), and two on
//! row halves. Best of 5×10 per way, the ways alternated.
//! `cargo run --release -p benches --example gemm_w1`.
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use std::time::Instant;

fn view(x: &[f32], t: bool, n: usize) -> MatRef<'_, f32> {
    let v = MatRef::from_row_major_slice(x, n, n);
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

fn main() {
    rayon::ThreadPoolBuilder::new().num_threads(2).build_global().expect("the first pool");
    let n = 1024;
    let x: Vec<f32> = (0..n * n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3 - 0.5).collect();
    let ones = vec![1.0f32; n * n];
    let (mut y, mut dx) = (vec![0.0f32; n * n], vec![0.0f32; n * n]);
    let names = ["faer Par::rayon(2)", "2 column tiles (Tapir)", "2 row tiles"];
    let mut best = [f64::MAX; 3];
    for _ in 0..5 {
        for (way, b) in best.iter_mut().enumerate() {
            let t = Instant::now();
            for _ in 0..10 {
                product(
                    way,
                    MatMut::from_row_major_slice_mut(&mut y, n, n),
                    Accum::Replace,
                    view(&x, false, n),
                    view(&x, false, n),
                );
                product(
                    way,
                    MatMut::from_row_major_slice_mut(&mut dx, n, n),
                    Accum::Replace,
                    view(&ones, false, n),
                    view(&x, true, n),
                );
                product(
                    way,
                    MatMut::from_row_major_slice_mut(&mut dx, n, n),
                    Accum::Add,
                    view(&x, true, n),
                    view(&ones, false, n),
                );
            }
            *b = b.min(t.elapsed().as_secs_f64() * 1e3 / 10.0);
        }
    }
    for (name, b) in names.iter().zip(best) {
        println!("{name:24} {b:.2} ms per step (3 products), {:.3}x faer", b / best[0]);
    }
    // Each product alone, and W2's square weight gradient `dW1 += h0ᵀ·g1` (m = n = 1024,
    // k = 256, `h0` stored 256×1024).
    let h0: Vec<f32> = (0..256 * n).map(|i| ((i * 104729) % 1000) as f32 * 1e-3).collect();
    let g1: Vec<f32> = (0..256 * n).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
    for (p, name) in ["y = x.x", "dx = dy.xT", "dx += xT.dy", "dW1 += h0T.g1 (W2)"].iter().enumerate() {
        let mut best = [f64::MAX; 3];
        for _ in 0..5 {
            for (way, b) in best.iter_mut().enumerate() {
                let t = Instant::now();
                for _ in 0..10 {
                    let dst = MatMut::from_row_major_slice_mut(&mut dx, n, n);
                    match p {
                        0 => product(way, dst, Accum::Replace, view(&x, false, n), view(&x, false, n)),
                        1 => product(way, dst, Accum::Replace, view(&ones, false, n), view(&x, true, n)),
                        2 => product(way, dst, Accum::Add, view(&x, true, n), view(&ones, false, n)),
                        _ => {
                            let a = MatRef::from_row_major_slice(&h0, 256, n).transpose();
                            let b = MatRef::from_row_major_slice(&g1, 256, n);
                            product(way, dst, Accum::Add, a, b)
                        }
                    }
                }
                *b = b.min(t.elapsed().as_secs_f64() * 1e3 / 10.0);
            }
        }
        println!(
            "{name:20} faer {:.2} ms, column tiles {:.3}x, row tiles {:.3}x",
            best[0],
            best[1] / best[0],
            best[2] / best[0]
        );
    }
    std::hint::black_box((y[0], dx[0]));
}
