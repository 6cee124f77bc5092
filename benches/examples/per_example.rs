//! Per-example gradients on the W2 MLP (784-1024-1024-10, ReLU, cross-entropy), alternated
//! repetition by repetition in one process:
//!
//! ```sh
//! cargo run --release -p benches --example per_example -- THREADS REPS
//! ```
//!
//! - `step`: W2's ordinary step at batch 256 (forward, `backward_into`, SGD);
//! - `dp`: the same step as DP-SGD without noise at batch 256 (per-example norms, clipping
//!   to 1.0, the clipped sum, SGD: `Mlp::dp_step`), and its ratio to `step`;
//! - `grads32`: the materialised per-example gradients at batch 32 (`Mlp::per_example_grads`),
//!   fresh tensors each call, and into tensors reused from call to call (`grads_into`).
//!
//! Each repetition times 8 calls of each (after 2 warm-up calls) and keeps the median; the
//! figures printed are the medians over repetitions, in ms. `benches/compare/per_example_torch.py`
//! times the same three with `torch.func.vmap(grad)`.

use std::time::Instant;

fn time(calls: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..2 {
        f();
    }
    let mut t: Vec<f64> = (0..calls)
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    benches::median(&mut t)
}

fn main() {
    let args: Vec<usize> = std::env::args().skip(1).filter_map(|s| s.parse().ok()).collect();
    let (threads, reps) = (args.first().copied().unwrap_or(1), args.get(1).copied().unwrap_or(5));
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g = benches::graph(threads);
    let mut mlp = benches::Mlp::new();
    let mut r: [Vec<f64>; 4] = Default::default();
    let mut reused = vec![];
    for rep in 0..reps {
        let order: [usize; 4] = if rep % 2 == 0 { [0, 1, 2, 3] } else { [3, 2, 1, 0] };
        for i in order {
            let v = match i {
                0 => time(8, || {
                    mlp.step(&mut g);
                }),
                1 => time(8, || {
                    mlp.dp_step(&mut g, 1.0);
                }),
                2 => time(8, || {
                    std::hint::black_box(mlp.per_example_grads(&mut g, 32));
                }),
                _ => time(8, || {
                    mlp.per_example_grads_into(&mut g, 32, &mut reused);
                    std::hint::black_box(&reused);
                }),
            };
            r[i].push(v);
        }
    }
    let ratios: Vec<f64> = r[1].iter().zip(&r[0]).map(|(d, s)| d / s).collect();
    let [step, dp, grads, into] = &mut r;
    let (a, b, c, d) = (benches::median(step), benches::median(dp), benches::median(grads), benches::median(into));
    println!("threads {threads}, {reps} repetitions");
    println!("tapir step {a:.2} ms, dp-sgd step {b:.2} ms, dp/step {:.3} (median of paired {:.3}), per-example grads at batch 32 {c:.2} ms (into reused tensors {d:.2} ms)", b / a, benches::median(&mut ratios.clone()));
}
