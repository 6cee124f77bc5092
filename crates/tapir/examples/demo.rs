//! The loop that leaks in Python engines, with flat memory in Tapir:
//!
//! ```python
//! for i in range(1000):
//!     x = randn(1024, 1024, requires_grad=True)
//!     y = (x @ x).sum()
//!     y.backward()
//! ```
//!
//! `cargo run --release --example demo -- [--iters N] [--every K] [--threads T] [--size S]`
//!
//! Prints, every K iterations: ms per iteration, the process's resident memory (RSS), the
//! arena's high-water mark and capacity, and nodes per iteration.

use std::time::Instant;

use rand::SeedableRng;
use tapir::Graph;

struct Args {
    iters: usize,
    every: usize,
    threads: usize,
    size: usize,
}

fn parse() -> Result<Args, String> {
    let mut args = Args { iters: 500, every: 50, threads: 0, size: 1024 };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = |name: &str| -> Result<usize, String> {
            it.next().and_then(|v| v.parse().ok()).ok_or_else(|| format!("{name} needs a non-negative integer"))
        };
        match flag.as_str() {
            "--iters" => args.iters = value("--iters")?,
            "--every" => args.every = value("--every")?.max(1),
            "--threads" => args.threads = value("--threads")?,
            "--size" => args.size = value("--size")?,
            "--help" | "-h" => {
                return Err("usage: demo [--iters N] [--every K] [--threads T (0: all)] [--size S]".into());
            }
            other => return Err(format!("unknown flag {other}; try --help")),
        }
    }
    Ok(args)
}

/// Resident set size of this process in MiB, from /proc (None elsewhere).
fn rss_mib() -> Option<f64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = match parse() {
        Ok(a) => a,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    // The calling thread joins rayon's pool, so each split runs on `--threads` threads.
    let threads = tapir::init_threads(args.threads)?;
    let mut graph = Graph::<f32>::new();
    graph.set_threads(threads);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let n = args.size;
    println!(
        "x = randn({n}, {n}); y = (x @ x).sum(); y.backward()  ×{} iterations, {} threads",
        args.iters,
        graph.threads()
    );
    println!(
        "{:>6} {:>10} {:>10} {:>14} {:>14} {:>7}",
        "iter", "ms/iter", "RSS MiB", "arena peak MiB", "arena cap MiB", "nodes"
    );
    let mut window = Instant::now();
    let (mut first_rss, mut last_rss) = (None, None);
    for i in 1..=args.iters {
        let grad_norm = graph.scope(|s| {
            let x = s.randn(&[n, n], &mut rng).with_grad();
            let y = x.matmul(x).sum();
            s.backward(y)?;
            let dx = x.grad().unwrap_or(&[]);
            Ok::<f32, tapir::Error>(dx.iter().map(|g| g * g).sum::<f32>().sqrt())
        })?;
        if !grad_norm.is_finite() {
            return Err("the gradient is not finite".into());
        }
        if i % args.every == 0 || i == args.iters {
            let done = if i % args.every == 0 { args.every } else { i % args.every };
            let ms = window.elapsed().as_secs_f64() * 1e3 / done as f64;
            let st = graph.stats();
            let rss = rss_mib();
            if i > 10 && first_rss.is_none() {
                first_rss = rss;
            }
            last_rss = rss;
            let mib = |b: usize| b as f64 / (1024.0 * 1024.0);
            println!(
                "{i:>6} {ms:>10.1} {:>10.1} {:>14.1} {:>14.1} {:>7}",
                rss.unwrap_or(f64::NAN),
                mib(st.arena.high_water),
                mib(st.arena.capacity),
                st.nodes
            );
            window = Instant::now();
        }
    }
    if let (Some(a), Some(b)) = (first_rss, last_rss) {
        println!("RSS change after warm-up: {:+.1} MiB", b - a);
    }
    Ok(())
}
