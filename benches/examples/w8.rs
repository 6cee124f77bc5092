//! W8 on its own, one configuration per process so that peak RSS belongs to it:
//!
//! ```sh
//! cargo build --release -p benches --example w8
//! TAPIR_THREADS=2 target/release/examples/w8 plain
//! TAPIR_THREADS=2 target/release/examples/w8 checkpoint
//! TAPIR_THREADS=2 target/release/examples/w8 checkpoint 22   # 22 steps instead of 6
//! ```
//!
//! Prints the median (and the least) ms per step (by default 6 steps, the first 2 warm up, as `just
//! compare`), the peak RSS and the arena high-water mark (main + scratch). With
//! `W8_TRACE` set it also prints the RSS after each step.

use std::time::Instant;

fn main() {
    let checkpoint = match std::env::args().nth(1).as_deref() {
        Some("plain") => false,
        Some("checkpoint") => true,
        _ => {
            eprintln!("usage: w8 plain|checkpoint");
            std::process::exit(2);
        }
    };
    let steps: usize = match std::env::args().nth(2).map(|s| s.parse()) {
        None => 6,
        Some(Ok(n)) if n >= 3 => n,
        _ => {
            eprintln!("usage: w8 plain|checkpoint [steps >= 3]");
            std::process::exit(2);
        }
    };
    let threads = benches::threads();
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g = benches::graph(threads);
    let mut mlp = benches::DeepMlp::new(checkpoint);
    let mut times = Vec::new();
    let mut loss = 0.0;
    for step in 1..=steps {
        let t = Instant::now();
        loss = mlp.step(&mut g);
        if std::env::var_os("W8_TRACE").is_some() {
            let st = g.stats();
            eprintln!(
                "step {step}: RSS {} KiB, peak {} KiB, arena cap main {} scratch {}",
                benches::rss::current_kib().unwrap_or(0),
                benches::rss::peak_kib().unwrap_or(0),
                st.arena.capacity >> 10,
                st.scratch.capacity >> 10
            );
        }
        if step > 2 {
            times.push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    let st = g.stats();
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    println!(
        "w8 {} threads {threads}: {:.0} ms/step (min {:.0}; steps 3-{steps}: {:?}), peak RSS {:.0} MiB, arena high-water {:.0} MiB \
         (main {:.0} + scratch {:.0}), loss {loss}",
        if checkpoint { "checkpoint-every-4" } else { "plain" },
        benches::median(&mut times),
        times[0],
        times.iter().map(|t| t.round()).collect::<Vec<_>>(),
        benches::rss::peak_kib().unwrap_or(0) as f64 / 1024.0,
        mib(st.arena.high_water + st.scratch.high_water),
        mib(st.arena.high_water),
        mib(st.scratch.high_water),
    );
}
