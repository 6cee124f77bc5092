//! W10 outside the comparison runner: the character-level GPT's training step, timed, and a
//! target for a profiler:
//!
//! ```sh
//! cargo build --release -p benches --example w10_profile
//! target/release/examples/w10_profile 20 2          # STEPS THREADS: median ms per step
//! valgrind --tool=callgrind target/release/examples/w10_profile 1 1
//! valgrind --tool=callgrind target/release/examples/w10_profile 3 1
//! perf record -g target/release/examples/w10_profile 20 1
//! ```
//!
//! The difference between the two callgrind totals, divided by 2, is one warmed-up step.
//! Timings skip the first 3 steps. With more than 10 steps it also prints the RSS growth
//! from step 10 to the last, as `torch_peer.py` does for PyTorch.

use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let steps: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(20);
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g = benches::graph(threads);
    let mut step = benches::CharStep::new();
    let mut times = Vec::with_capacity(steps);
    let mut loss = 0.0;
    let mut rss10 = None;
    for i in 0..steps {
        let t = Instant::now();
        loss = step.step(&mut g);
        if i >= 3 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
        if i == 10 {
            rss10 = benches::rss::current_kib();
        }
    }
    let growth = rss10.zip(benches::rss::current_kib()).map(|(a, b)| (b as f64 - a as f64) / 1024.0);
    times.sort_by(f64::total_cmp);
    let median = times.get(times.len() / 2).copied().unwrap_or(f64::NAN);
    println!(
        "w10 threads {threads}: {median:.1} ms/step (median of {}), {:.0} tokens/s, peak RSS {:.0} MiB, \
         growth step 10 to {steps} {}, loss {loss}",
        times.len(),
        benches::W10_TOKENS as f64 / median * 1e3,
        benches::rss::peak_kib().unwrap_or(0) as f64 / 1024.0,
        growth.map_or("-".to_string(), |g| format!("{g:.2} MiB")),
    );
}
