//! One workload's step time at one thread count, for thread-scaling runs
//! (`benches/compare/e2.sh` alternates `step_time W 1` and `step_time W 2` to measure the
//! 2-thread speedup efficiency E2 = T1 / (2·T2); `scaling.sh` runs it at 1 to 16 threads):
//!
//! ```sh
//! cargo build --release -p benches --example step_time
//! target/release/examples/step_time W11 2          # WORKLOAD THREADS [STEPS]
//! target/release/examples/step_time W11 1,2        # WORKLOAD 1,2 [ROUNDS]: interleaved E2
//! target/release/examples/step_time W11 1,2 20 --ops   # and E2 per op kind
//! ```
//!
//! Workloads: W1 (seed loop), W2 (MLP step), W7 (Hessian-vector product), W8, W8C (deep
//! MLP, plain and checkpointed), W10 (character GPT step), W11 (digits CNN step). Prints
//! `WORKLOAD threads T: MEDIAN ms/step (median of N) peak RSS M MiB`; the first steps warm
//! up (W8 and W8C: 2, the others 3) and are not counted. `SPIN_WAIT=0` turns the pool's
//! spin-waiting off ([`tapir::set_spin_wait`]).
//!
//! With `1,2` in place of the thread count, one process measures E2 itself: two graphs,
//! one on 1 thread and one on 2 threads of the same pool, take the workload's steps in
//! turn, a block of steps each (a quarter of the default step count, at least 1), the
//! order alternating between rounds (default 15). Each round's E2 is the ratio of its two
//! blocks' median step times, so a host that drifts between rounds moves both alike.
//! Prints `WORKLOAD interleaved: T1 A ms, T2 B ms, E2 MEDIAN (Q1-Q3), R rounds of K steps`.
//! With `--ops` both graphs also keep a per-op profile ([`tapir::Graph::set_profiling`])
//! and a table follows: per op kind, forward and backward ms per step at 1 and 2 threads,
//! their E2, and the time the op loses at 2 threads against perfect scaling
//! (`2-thread ms − 1-thread ms / 2`), the ops that lose most first.

use std::time::Instant;

/// One step of a workload on a graph; returns its loss (or output).
type Step = Box<dyn FnMut(&mut tapir::Graph<f32>) -> f32>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(name) = args.first().cloned() else {
        eprintln!("usage: step_time W1|W2|W7|W8|W8C|W10|W11 THREADS [STEPS]");
        std::process::exit(2);
    };
    let pair = args.get(1).is_some_and(|s| s == "1,2");
    let threads: usize = if pair { 2 } else { args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1) };
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
    if pair {
        let rounds = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(15).max(1);
        let ops = args.iter().any(|a| a == "--ops");
        interleaved(&name, &mut step, warm, (default_steps / 4).max(1), rounds, ops);
        return;
    }
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

/// Median step time (ms) of `block` steps on `g`.
fn block_ms(step: &mut Step, g: &mut tapir::Graph<f32>, block: usize) -> f64 {
    let mut t: Vec<f64> = (0..block)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(step(g));
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    benches::median(&mut t)
}

/// The `1,2` mode (see the module doc): per round, a block on each graph, the order
/// alternating; prints the medians and the quartiles of the rounds' E2.
fn interleaved(name: &str, step: &mut Step, warm: usize, block: usize, rounds: usize, ops: bool) {
    let (mut g1, mut g2) = (benches::graph(1), benches::graph(2));
    for _ in 0..warm {
        step(&mut g1);
        step(&mut g2);
    }
    for g in [&mut g1, &mut g2] {
        g.set_profiling(ops);
        g.reset_profile();
    }
    let (mut t1s, mut t2s, mut e2) = (Vec::new(), Vec::new(), Vec::new());
    for r in 0..rounds {
        let (t1, t2) = if r % 2 == 0 {
            let t1 = block_ms(step, &mut g1, block);
            (t1, block_ms(step, &mut g2, block))
        } else {
            let t2 = block_ms(step, &mut g2, block);
            (block_ms(step, &mut g1, block), t2)
        };
        t1s.push(t1);
        t2s.push(t2);
        e2.push(t1 / (2.0 * t2));
    }
    e2.sort_by(f64::total_cmp);
    let q = |f: f64| e2[((e2.len() - 1) as f64 * f).round() as usize];
    let (q1, q3) = (q(0.25), q(0.75));
    let (t1, t2, mid) = (benches::median(&mut t1s), benches::median(&mut t2s), benches::median(&mut e2));
    println!("{name} interleaved: T1 {t1:.3} ms, T2 {t2:.3} ms, E2 {mid:.3} ({q1:.3}-{q3:.3}), {rounds} rounds of {block} steps");
    if ops {
        print_ops(&g1, &g2, rounds * block);
    }
}

/// The `--ops` table: per op kind, ms per step at 1 and 2 threads and the 2-thread loss.
fn print_ops(g1: &tapir::Graph<f32>, g2: &tapir::Graph<f32>, steps: usize) {
    let per_step = |d: std::time::Duration| d.as_secs_f64() * 1e3 / steps as f64;
    // op -> [forward at 1, backward at 1, forward at 2, backward at 2]
    let mut rows: Vec<(&'static str, [f64; 4])> = Vec::new();
    for (i, g) in [g1, g2].into_iter().enumerate() {
        for o in g.profile().ops {
            let at = match rows.iter().position(|r| r.0 == o.op) {
                Some(at) => at,
                None => {
                    rows.push((o.op, [0.0; 4]));
                    rows.len() - 1
                }
            };
            rows[at].1[2 * i] += per_step(o.forward);
            rows[at].1[2 * i + 1] += per_step(o.backward);
        }
    }
    let loss = |v: &[f64; 4]| v[2] + v[3] - (v[0] + v[1]) / 2.0;
    rows.sort_by(|a, b| loss(&b.1).total_cmp(&loss(&a.1)));
    let e2 = |one: f64, two: f64| if two > 0.0 { format!("{:.2}", one / (2.0 * two)) } else { "-".into() };
    println!("| op | forward ms, 1 / 2 threads | E2 | backward ms, 1 / 2 threads | E2 | ms lost at 2 threads |");
    println!("|---|---:|---:|---:|---:|---:|");
    for (op, v) in &rows {
        let (f, b) = (e2(v[0], v[2]), e2(v[1], v[3]));
        println!("| {op} | {:.3} / {:.3} | {f} | {:.3} / {:.3} | {b} | {:.3} |", v[0], v[2], v[1], v[3], loss(v));
    }
}
