//! W7 outside criterion: the gradient of W2's loss (`backward_into`) and its Hessian-vector
//! product over all parameters, alternating, with the medians, their ratio and the peak
//! RSS; and a target for a profiler:
//!
//! ```sh
//! cargo build --release -p benches --example w7_profile
//! target/release/examples/w7_profile both 15 2     # MODE STEPS THREADS: timings
//! valgrind --tool=callgrind target/release/examples/w7_profile hvp 1 1
//! valgrind --tool=callgrind target/release/examples/w7_profile hvp 3 1
//! ```
//!
//! The difference between the two callgrind totals, divided by 2, is one warmed-up HVP.
//! Timings skip the first 3 rounds.

use std::time::Instant;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mode = args.first().map_or("both", String::as_str);
    let steps: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(15);
    let threads: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g = benches::graph(threads);
    let mut m = benches::MlpHvp::new();
    let (mut grad, mut hvp) = (Vec::new(), Vec::new());
    let mut check = 0.0;
    for i in 0..steps {
        if mode != "hvp" {
            let t = Instant::now();
            check += m.grad(&mut g);
            grad.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if mode != "grad" {
            let t = Instant::now();
            check += m.hvp(&mut g);
            hvp.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if i < 3 {
            grad.clear();
            hvp.clear();
        }
    }
    let (gm, hm) = (median(&mut grad), median(&mut hvp));
    let peak = benches::rss::peak_kib().map_or(f64::NAN, |k| k as f64 / 1024.0);
    println!(
        "W7 threads {}: gradient {gm:.2} ms, HVP {hm:.2} ms, HVP/gradient {:.2}, peak RSS {peak:.0} MiB (checksum {check})",
        g.threads(),
        hm / gm
    );
}
