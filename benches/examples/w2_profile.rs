//! W2 under a profiler: `STEPS` MLP training steps at one thread, so that instruction counts
//! per step come out exact:
//!
//! ```sh
//! cargo build --release -p benches --example w2_profile
//! valgrind --tool=callgrind target/release/examples/w2_profile 1
//! valgrind --tool=callgrind target/release/examples/w2_profile 3
//! ```
//!
//! The difference between the two totals, divided by 2, is one warmed-up step.

fn main() {
    let steps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    let mut g = benches::graph(1);
    let mut mlp = benches::Mlp::new();
    let mut loss = 0.0;
    for _ in 0..steps {
        loss = mlp.step(&mut g);
    }
    println!("loss after {steps} steps: {loss}");
}
