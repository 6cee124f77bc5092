//! Where a step's time goes, per op kind: W1, W2, W7, W8, W8C, W10 and W11 from `benches/src`
//! run with [`Graph::set_profiling`](tapir::Graph::set_profiling) on, one table per
//! workload. Rows are per step: nodes recorded, forward (recording) ms, backward-rule ms,
//! the part of both inside matrix products, and the share of the step's wall time; the
//! last row, `outside ops`, is the rest of the step (the optimizer, zeroing the gradient
//! buffer, the scope's start and end, the caller's own code between ops).
//!
//! ```sh
//! cargo build --release -p benches --example op_profile
//! target/release/examples/op_profile 1                 # THREADS [WORKLOADS] [STEPS]
//! target/release/examples/op_profile 2 W2,W10 20
//! target/release/examples/op_profile 2 W8 3 --top 95   # only the rows that cover 95%
//! ```
//!
//! Each workload runs its warm-up steps (W8: 2, others 3) before the profile is reset,
//! then STEPS steps (default W1 10, W2 20, W7 15, W8 4, W10 10, W11 40). Markdown tables
//! with `--md`. W7's step is one Hessian-vector product (its recorded gradient's ops count
//! under their own kinds). `SPIN_WAIT=0` turns the pool's spin-waiting off
//! ([`tapir::set_spin_wait`]).

use std::time::{Duration, Instant};

use tapir::{Graph, Profile};

struct Options {
    threads: usize,
    workloads: Vec<String>,
    steps: Option<usize>,
    /// Print rows, most time first, until they cover this share of the step (percent).
    top: f64,
    markdown: bool,
}

fn options() -> Options {
    let mut o = Options { threads: 1, workloads: vec![], steps: None, top: 100.0, markdown: false };
    let mut positional = 0;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--top" => o.top = args.next().and_then(|v| v.parse().ok()).expect("--top PERCENT"),
            "--md" => o.markdown = true,
            _ => {
                match positional {
                    0 => o.threads = a.parse().expect("THREADS is a number"),
                    1 => o.workloads = a.split(',').map(|w| w.trim().to_uppercase()).collect(),
                    _ => o.steps = Some(a.parse().expect("STEPS is a number")),
                }
                positional += 1;
            }
        }
    }
    if o.workloads.is_empty() {
        o.workloads = ["W1", "W2", "W7", "W8", "W8C", "W10", "W11"].map(String::from).to_vec();
    }
    o
}

/// One step of a workload on a graph.
type Step = Box<dyn FnMut(&mut Graph<f32>)>;

/// A workload's step, its warm-up and default step counts.
fn workload(name: &str) -> (Step, usize, usize) {
    match name {
        "W1" => {
            let w = benches::SeedLoop::new(benches::W1_N);
            (
                Box::new(move |g| {
                    std::hint::black_box(w.step(g));
                }),
                3,
                10,
            )
        }
        "W2" => {
            let mut w = benches::Mlp::new();
            (
                Box::new(move |g| {
                    std::hint::black_box(w.step(g));
                }),
                3,
                20,
            )
        }
        "W7" => {
            let mut w = benches::MlpHvp::new();
            (
                Box::new(move |g| {
                    std::hint::black_box(w.hvp(g));
                }),
                3,
                15,
            )
        }
        "W8" | "W8C" => {
            let mut w = benches::DeepMlp::new(name == "W8C");
            (
                Box::new(move |g| {
                    std::hint::black_box(w.step(g));
                }),
                2,
                4,
            )
        }
        "W10" => {
            let mut w = benches::CharStep::new();
            (
                Box::new(move |g| {
                    std::hint::black_box(w.step(g));
                }),
                3,
                10,
            )
        }
        "W11" => {
            let mut w = benches::CnnStep::new();
            (
                Box::new(move |g| {
                    std::hint::black_box(w.step(g));
                }),
                3,
                40,
            )
        }
        other => panic!("no workload {other}: W1, W2, W7, W8, W8C, W10 or W11"),
    }
}

fn ms(d: Duration, steps: usize) -> f64 {
    d.as_secs_f64() * 1e3 / steps as f64
}

fn print_table(o: &Options, name: &str, p: &Profile, step: Duration, steps: usize) {
    let step_ms = ms(step, 1);
    let share = |d: Duration| 100.0 * ms(d, steps) / step_ms;
    println!(
        "{name}, {} thread{}, {steps} steps: {step_ms:.2} ms/step, ops {:.2} ms ({:.1}%), GEMM {:.2} ms ({:.1}%)",
        o.threads,
        if o.threads == 1 { "" } else { "s" },
        ms(p.total(), steps),
        share(p.total()),
        ms(p.gemm(), steps),
        share(p.gemm()),
    );
    let outside = (step * steps as u32).saturating_sub(p.total());
    let mut rows: Vec<(&str, f64, f64, f64, f64, Duration)> = p
        .ops
        .iter()
        .map(|r| {
            let per = |d| ms(d, steps);
            (r.op, r.calls as f64 / steps as f64, per(r.forward), per(r.backward), per(r.gemm), r.total())
        })
        .collect();
    rows.push(("outside ops", 0.0, 0.0, 0.0, 0.0, outside));
    rows.sort_by_key(|r| std::cmp::Reverse(r.5));
    let (mut covered, mut left) = (0.0, (0, 0.0));
    if o.markdown {
        println!("| op | nodes/step | forward ms | backward ms | of which GEMM | share |");
        println!("|---|---:|---:|---:|---:|---:|");
    } else {
        println!(
            "{:<18} {:>10} {:>11} {:>12} {:>9} {:>7}",
            "op", "nodes/step", "forward ms", "backward ms", "GEMM ms", "share"
        );
    }
    for (op, calls, fwd, bwd, gemm, total) in rows {
        if covered >= o.top {
            left = (left.0 + 1, left.1 + share(total));
            continue;
        }
        covered += share(total);
        let calls = if op == "outside ops" { "-".to_string() } else { format!("{calls:.0}") };
        if op == "outside ops" {
            let t = ms(total, steps);
            if o.markdown {
                println!("| outside ops | - | {t:.2} | | | {:.1}% |", share(total));
            } else {
                println!("{op:<18} {calls:>10} {t:>11.2} {:>12} {:>9} {:>6.1}%", "", "", share(total));
            }
        } else if o.markdown {
            println!("| {op} | {calls} | {fwd:.2} | {bwd:.2} | {gemm:.2} | {:.1}% |", share(total));
        } else {
            println!("{op:<18} {calls:>10} {fwd:>11.2} {bwd:>12.2} {gemm:>9.2} {:>6.1}%", share(total));
        }
    }
    if left.0 > 0 {
        println!("({} more kinds, {:.1}% together)", left.0, left.1);
    }
    println!();
}

fn main() {
    let o = options();
    tapir::init_threads(o.threads).expect("no parallel work before this");
    if std::env::var("SPIN_WAIT").is_ok_and(|v| v == "0") {
        tapir::set_spin_wait(false);
    }
    for name in &o.workloads {
        let mut g = benches::graph(o.threads);
        let (mut step, warm, default_steps) = workload(name);
        for _ in 0..warm {
            step(&mut g);
        }
        let steps = o.steps.unwrap_or(default_steps).max(1);
        g.set_profiling(true);
        let mut wall = Duration::ZERO;
        for _ in 0..steps {
            let t = Instant::now();
            step(&mut g);
            wall += t.elapsed();
        }
        print_table(&o, name, &g.profile(), wall / steps as u32, steps);
    }
}
