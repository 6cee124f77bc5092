//! The weight-gradient product `dW = xᵀ·dy` at W10's four shapes, one thread: Tapir's
//! `gemm` (which runs this form in `k` blocks of 256 when `k ≥ 1024`), one faer call,
//! `xᵀ` copied first, a column-major `dst`, and explicit `k` blocks of 64 to 1024. `cargo run --release -p benches --example gemm_db`.
use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};
use std::time::Instant;
use tapir::Float;

fn time(f: &mut dyn FnMut()) -> f64 {
    let mut best = f64::MAX;
    for _ in 0..3 {
        let t = Instant::now();
        for _ in 0..40 {
            f();
        }
        best = best.min(t.elapsed().as_secs_f64() / 40.0);
    }
    best * 1e3
}

fn main() {
    for &(m, k, n) in &[(128usize, 2048usize, 384usize), (128, 2048, 128), (128, 2048, 512), (512, 2048, 128)] {
        let x: Vec<f32> = (0..k * m).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect(); // [k, m]
        let dy: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1000) as f32 * 1e-3).collect(); // [k, n]
        let mut c = vec![0.0f32; m * n];
        let base = time(&mut || f32::gemm(&mut c, &x, true, &dy, false, (m, k, n), true, Par::Seq));
        // One faer call, as Tapir's `gemm` made before it blocked `k`.
        let one_call = time(&mut || {
            let dst = MatMut::from_row_major_slice_mut(&mut c, m, n);
            let a = MatRef::from_row_major_slice(&x, k, m).transpose();
            let b = MatRef::from_row_major_slice(&dy, k, n);
            matmul(dst, Accum::Add, a, b, 1.0f32, Par::Seq);
        });
        // Xᵀ copied contiguous first.
        let mut xt = vec![0.0f32; m * k];
        let copy_x = time(&mut || {
            for r in 0..k {
                for j in 0..m {
                    xt[j * k + r] = x[r * m + j];
                }
            }
            f32::gemm(&mut c, &xt, false, &dy, false, (m, k, n), true, Par::Seq)
        });
        // dst column-major: faer sees dst with unit row stride.
        let mut ct = vec![0.0f32; m * n];
        let colmajor = time(&mut || {
            let dst = MatMut::from_column_major_slice_mut(&mut ct, m, n);
            let a = MatRef::from_row_major_slice(&x, k, m).transpose();
            let b = MatRef::from_row_major_slice(&dy, k, n);
            matmul(dst, Accum::Add, a, b, 1.0f32, Par::Seq);
        });
        println!(
            "m {m} k {k} n {n}: tapir gemm {base:.3} ms, faer one call {one_call:.3}, copy-xT {copy_x:.3}, \
             dst col-major {colmajor:.3}"
        );
        for kb in [64usize, 128, 192, 256, 384, 512, 1024] {
            let chunks = time(&mut || {
                for kc in (0..k).step_by(kb) {
                    let kk = kb.min(k - kc);
                    f32::gemm(
                        &mut c,
                        &x[kc * m..(kc + kk) * m],
                        true,
                        &dy[kc * n..(kc + kk) * n],
                        false,
                        (m, kk, n),
                        true,
                        Par::Seq,
                    );
                }
            });
            print!("  kb {kb}: {chunks:.3}");
        }
        println!();
    }
}
