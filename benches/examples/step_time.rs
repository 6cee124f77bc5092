//! One workload's step time at one thread count, for thread-scaling runs
//! (`benches/compare/e2.sh` alternates `step_time W 1` and `step_time W 2` to measure the
//! 2-thread speedup efficiency E2 = T1 / (2·T2); `scaling.sh` runs it at 1 to 16 threads):
//!
//! ```sh
//! cargo build --release -p benches --example step_time
//! target/release/examples/step_time W11 2          # WORKLOAD THREADS [STEPS]
//! ```
//!
//! Workloads: W1 (seed loop), W2 (MLP step), W7 (Hessian-vector product), W8, W8C (deep
//! MLP, plain and checkpointed), W10 (character GPT step), W11 (digits CNN step). Prints
//! `WORKLOAD threads T: MEDIAN ms/step (median of N) peak RSS M MiB`; the first steps warm
//! up (W8 and W8C: 2, the others 3) and are not counted. `SPIN_WAIT=0` turns the pool's
//! spin-waiting off ([`tapir::set_spin_wait`]).

use std::time::Instant;

/// One step of a workload on a graph; returns its loss (or output).
type Step = Box<dyn FnMut(&mut tapir::Graph<f32>) -> f32>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first().cloned() else {
        eprintln!("usage: step_time W1|W2|W7|W8|W8C|W10|W11 THREADS [STEPS]");
        std::process::exit(2);
    };
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    if std::env::var("SPIN_WAIT").is_ok_and(|v| v == "0") {
        tapir::set_spin_wait(false);
    }
    let mut g = benches::graph(threads);
    let (mut step, warm, default_steps): (Step, usize, usize) = match name.as_str() {
        "W1" => {
            let w = benches::SeedLoop::new(benches::W1_N);
            (Box::new(move |g| w.step(g)), 3, 20)
        }
        "W2" => {
            let mut w = benches::Mlp::new();
            (Box::new(move |g| w.step(g)), 3, 20)
        }
        "W7" => {
            let mut w = benches::MlpHvp::new();
            (Box::new(move |g| w.hvp(g)), 3, 15)
        }
        "W8" | "W8C" => {
            let mut w = benches::DeepMlp::new(name == "W8C");
            (Box::new(move |g| w.step(g)), 2, 6)
        }
        "W10" => {
            let mut w = benches::CharStep::new();
            (Box::new(move |g| w.step(g)), 3, 20)
        }
        "W11" => {
            let mut w = benches::CnnStep::new();
            (Box::new(move |g| w.step(g)), 3, 60)
        }
        other => {
            eprintln!("step_time: no workload {other}: W1, W2, W7, W8, W8C, W10 or W11");
            std::process::exit(2);
        }
    };
    let steps = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(default_steps).max(warm + 1);
    let mut times = Vec::with_capacity(steps);
    for i in 0..steps {
        let t = Instant::now();
        std::hint::black_box(step(&mut g));
        if i >= warm {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    let n = times.len();
    let median = benches::median(&mut times);
    let peak = benches::rss::peak_kib().unwrap_or(0) as f64 / 1024.0;
    println!("{name} threads {threads}: {median:.3} ms/step (median of {n}) peak RSS {peak:.0} MiB");
}
