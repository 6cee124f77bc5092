//! W1 and W2 on Tapir and on faer directly, alternated repetition by repetition in one
//! process, for a quick side-by-side when the full `just compare` build is not at hand:
//!
//! ```sh
//! cargo run --release -p benches --example w2_time -- THREADS REPS
//! ```
//!
//! Each repetition times 12 steps of each (after 3 warm-up steps) and keeps the median;
//! the figures printed are the medians over repetitions, in ms.

use std::time::Instant;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time(steps: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..3 {
        f();
    }
    let mut t: Vec<f64> = (0..steps)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    median(&mut t)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let (threads, reps) = (args.first().copied().unwrap_or(1), args.get(1).copied().unwrap_or(7));
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g = benches::graph(threads);
    let par = benches::par(threads);
    let (mut mlp, mut faer_mlp) = (benches::Mlp::new(), benches::FaerMlp::new());
    let (seed, mut faer_seed) = (benches::SeedLoop::new(benches::W1_N), benches::FaerSeedLoop::new(benches::W1_N));
    let mut r: [Vec<f64>; 4] = Default::default();
    for rep in 0..reps {
        // Alternate which system goes first.
        let order: [usize; 4] = if rep % 2 == 0 { [0, 1, 2, 3] } else { [1, 0, 3, 2] };
        for i in order {
            let v = match i {
                0 => time(12, || {
                    mlp.step(&mut g);
                }),
                1 => time(12, || {
                    faer_mlp.step(par);
                }),
                2 => time(12, || {
                    seed.step(&mut g);
                }),
                _ => time(12, || {
                    faer_seed.step(par);
                }),
            };
            r[i].push(v);
        }
    }
    let [w2t, w2f, w1t, w1f] = &mut r;
    let (a, b, c, d) = (median(w2t), median(w2f), median(w1t), median(w1f));
    println!("threads {threads}, {reps} repetitions");
    println!("W2 tapir {a:.2} ms, faer-direct {b:.2} ms, ratio {:.3}", a / b);
    println!("W1 tapir {c:.2} ms, faer-direct {d:.2} ms, ratio {:.3}", c / d);
    println!("W2 tapir per repetition: {w2t:.2?}");
    println!("W2 faer per repetition: {w2f:.2?}");
}
