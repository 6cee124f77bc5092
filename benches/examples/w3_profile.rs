//! W3 under a profiler: `REPS` chains of 10,000 ops on a leaf of `NUMEL` elements (default 1),
//! with or without backward, so that instruction counts per op come out exact:
//!
//! ```sh
//! cargo build --release -p benches --example w3_profile
//! valgrind --tool=callgrind target/release/examples/w3_profile affine record 100
//! valgrind --tool=callgrind target/release/examples/w3_profile affine backward 100
//! ```
//!
//! The difference between the two totals, divided by `REPS × 10,000`, is backward's cost
//! per op; the first total alone is recording's (plus a small fixed setup).

use std::time::Duration;

use benches::{chain, chain_step, graph, ChainOp, CHAIN_OPS};
use tapir::Tensor;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let op = match args.first().map(String::as_str) {
        Some("tanh") => ChainOp::Tanh,
        _ => ChainOp::Affine,
    };
    let backward = args.get(1).map(String::as_str) != Some("record");
    let reps: usize = args.get(2).and_then(|r| r.parse().ok()).unwrap_or(100);
    let numel: usize = args.get(3).and_then(|r| r.parse().ok()).unwrap_or(1);
    let x = Tensor::<f32>::full(&[numel], 0.5).expect("a valid shape");
    let mut g = graph(1);
    let (mut rec, mut bwd) = (Duration::ZERO, Duration::ZERO);
    // Two untimed repetitions first: the arena grows to the chain's size in the first and
    // merges its chunks into one in the second (the instruction counts of measure.sh take
    // differences between repetition counts, in which they cancel).
    for _ in 0..2 {
        chain_step(&mut g, &x, CHAIN_OPS, op);
    }
    for _ in 0..reps {
        if backward {
            let t = chain_step(&mut g, &x, CHAIN_OPS, op);
            rec += t.record;
            bwd += t.backward;
        } else {
            let t0 = std::time::Instant::now();
            g.scope(|s| {
                std::hint::black_box(chain(s.leaf(&x), CHAIN_OPS, op));
            });
            rec += t0.elapsed();
        }
    }
    let per = |d: Duration| d.as_secs_f64() * 1e9 / (reps * CHAIN_OPS) as f64;
    println!("{} on {numel}: record {:.1} ns/op, backward {:.1} ns/op", op.name(), per(rec), per(bwd));
}
