//! W10's fifteen GEMM shapes (forward, input gradients, weight gradients; batch 32 × 64
//! tokens, width 128, MLP 512, vocabulary 96) through Tapir's `gemm`, one at a time on
//! THREADS threads (default 1), with the total for one training step (four layers, one
//! output head).
//! `benches/compare/gemm_shapes_torch.py` times the same shapes with PyTorch's `addmm_`.
//!
//! ```sh
//! cargo run --release -p benches --example gemm_shapes          # THREADS, default 1
//! target/release/examples/gemm_shapes 2
//! target/release/examples/gemm_shapes 2 cold
//! ```
//!
//! By default each shape runs 40 times back to back on the same buffers, which stay in
//! cache (the best of 3 such runs' means). With `cold`, the calling thread writes a
//! 64 MiB buffer before each product, as a training step's other ops evict its operands,
//! and the figure is the median of 40 timed products alone.

use std::time::Instant;
use tapir::Float;

/// `(name, m, k, n, a transposed, b transposed)`: `op(a)` is `m×k`, `op(b)` is `k×n`.
const SHAPES: [(&str, usize, usize, usize, bool, bool); 15] = [
    ("fwd qkv", 2048, 128, 384, false, false),
    ("fwd proj", 2048, 128, 128, false, false),
    ("fwd fc", 2048, 128, 512, false, false),
    ("fwd down", 2048, 512, 128, false, false),
    ("fwd head", 2048, 128, 96, false, true),
    ("dA qkv", 2048, 384, 128, false, true),
    ("dA proj", 2048, 128, 128, false, true),
    ("dA fc", 2048, 512, 128, false, true),
    ("dA down", 2048, 128, 512, false, true),
    ("dA head", 2048, 96, 128, false, false),
    ("dB qkv", 128, 2048, 384, true, false),
    ("dB proj", 128, 2048, 128, true, false),
    ("dB fc", 128, 2048, 512, true, false),
    ("dB down", 512, 2048, 128, true, false),
    ("dB head", 96, 2048, 128, true, false),
];

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let threads = tapir::init_threads(threads).expect("no parallel work before this");
    let par = if threads > 1 { faer::Par::rayon(threads) } else { faer::Par::Seq };
    let cold = std::env::args().nth(2).is_some_and(|a| a == "cold");
    let mut junk = vec![0u8; if cold { 64 << 20 } else { 0 }];
    let mut total = 0.0;
    for (name, m, k, n, at, bt) in SHAPES {
        let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1000) as f32 * 1e-3).collect();
        let b: Vec<f32> = (0..k * n).map(|i| ((i * 104729) % 1000) as f32 * 1e-3).collect();
        let mut c = vec![0.0f32; m * n];
        let reps = 40;
        let mut best = f64::MAX;
        if cold {
            let mut times: Vec<f64> = (0..reps)
                .map(|r| {
                    junk.iter_mut().step_by(64).for_each(|b| *b = b.wrapping_add(r as u8 | 1));
                    let t = Instant::now();
                    f32::gemm(&mut c, &a, at, &b, bt, (m, k, n), true, par);
                    t.elapsed().as_secs_f64()
                })
                .collect();
            times.sort_by(f64::total_cmp);
            best = times[reps / 2];
        }
        for _ in 0..if cold { 0 } else { 3 } {
            let t = Instant::now();
            for _ in 0..reps {
                f32::gemm(&mut c, &a, at, &b, bt, (m, k, n), true, par);
            }
            best = best.min(t.elapsed().as_secs_f64() / reps as f64);
        }
        let per_step = if name.ends_with("head") { 1.0 } else { 4.0 };
        total += best * per_step;
        let gflops = 2.0 * (m * k * n) as f64 / best / 1e9;
        println!("{name:10} m {m:5} k {k:5} n {n:5}  {:8.3} ms  {gflops:6.1} GFLOP/s", best * 1e3);
    }
    std::hint::black_box(&junk);
    println!("total per step (x4 layers{}): {:.1} ms", if cold { ", cold" } else { "" }, total * 1e3);
}
