//! One op at a time, at the sizes W8, W10 and W11 run it, outside a training step: the op's
//! own forward and backward-rule time from [`Graph::set_profiling`](tapir::Graph::set_profiling),
//! median over the runs, in three modes: `hot`, runs back to back; `idle`, the calling
//! thread sleeps 2 ms before each run, so that idle pool threads go to sleep too and the
//! op's first parallel region wakes them; `cold`, the calling thread writes 64 MiB before
//! each run, which evicts the operands, as the rest of a step does (and takes long enough
//! for the pool to fall asleep). Set beside the per-op rows of `op_profile`, it tells what
//! an op's split gains alone from what it loses inside a step.
//!
//! ```sh
//! cargo build --release -p benches --example op_alone
//! target/release/examples/op_alone 1          # THREADS [RUNS [CASE-PREFIX]]
//! target/release/examples/op_alone 2
//! ```
//!
//! Prints `case op mode forward-µs backward-µs` per line, tab-separated.

use tapir::{Graph, Tensor, Var};

/// A case: its name, the op kind whose profile row it reads, the leaves' shapes, and the
/// program from the leaves to the value whose sum is the loss.
type Program = for<'s> fn(&[Var<'s, f32>]) -> Var<'s, f32>;

const CASES: [(&str, &str, &[&[usize]], Program); 13] = [
    ("W10 gelu [2048, 512]", "gelu", &[&[2048, 512]], |l| l[0].gelu()),
    ("W8 relu [4096, 256]", "relu", &[&[4096, 256]], |l| l[0].relu()),
    ("W10 add [2048, 128]", "add", &[&[2048, 128], &[2048, 128]], |l| l[0] + l[1]),
    ("W7 mul [2048, 256]", "mul", &[&[2048, 256], &[2048, 256]], |l| l[0] * l[1]),
    ("W10 layer_norm [2048, 128]", "layer_norm", &[&[2048, 128], &[128], &[128]], |l| {
        l[0].layer_norm(l[1], l[2], 1e-5)
    }),
    ("W10 attention_weights [32, 64, 384] 4 heads", "attention_weights", &[&[32, 64, 384]], |l| {
        l[0].attention_weights(4, true)
    }),
    ("W10 attend [32, 64, 384] 4 heads", "attend", &[&[32, 64, 384]], |l| l[0].attention_weights(4, true).attend(l[0])),
    ("W11 conv1 matmul [16, 9]·[256, 9, 64]", "matmul", &[&[16, 9], &[256, 9, 64]], |l| l[0].matmul(l[1])),
    ("W11 conv2 matmul [32, 144]·[256, 144, 16]", "matmul", &[&[32, 144], &[256, 144, 16]], |l| l[0].matmul(l[1])),
    ("W11 conv2 im2col [256, 16, 4, 4]", "im2col", &[&[256, 16, 4, 4]], |l| l[0].im2col([3, 3], [1, 1], [1, 1])),
    ("W11 pool1 [256, 16, 8, 8]", "max_pool2d", &[&[256, 16, 8, 8]], |l| l[0].max_pool2d([2, 2], [2, 2], [0, 0])),
    ("W11 bias add [256, 16, 8, 8] + [16, 1, 1]", "add", &[&[256, 16, 8, 8], &[16, 1, 1]], |l| l[0] + l[1]),
    ("W11 relu [256, 16, 8, 8]", "relu", &[&[256, 16, 8, 8]], |l| l[0].relu()),
];

fn leaf(shape: &[usize], seed: usize) -> Tensor<f32> {
    let n: usize = shape.iter().product();
    let data = (0..n).map(|i| (((i * 7919 + seed * 104_729) % 2001) as f32 - 1000.0) * 1e-3).collect();
    Tensor::from_vec(data, shape).expect("a valid shape")
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let threads: usize = std::env::args().nth(1).and_then(|t| t.parse().ok()).unwrap_or(1);
    let runs: usize = std::env::args().nth(2).and_then(|t| t.parse().ok()).unwrap_or(31).max(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    let mut g: Graph<f32> = benches::graph(threads);
    let mut junk = vec![0u8; 64 << 20];
    let only = std::env::args().nth(3).unwrap_or_default();
    for (name, op, shapes, program) in CASES.into_iter().filter(|c| c.0.starts_with(&only)) {
        let leaves: Vec<Tensor<f32>> = shapes.iter().enumerate().map(|(i, s)| leaf(s, i)).collect();
        for mode in ["hot", "idle", "cold"] {
            let (mut fwd, mut bwd) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
            for run in 0..runs + 3 {
                if mode == "idle" {
                    std::thread::sleep(std::time::Duration::from_millis(2));
                }
                if mode == "cold" {
                    junk.iter_mut().step_by(64).for_each(|b| *b = b.wrapping_add(run as u8 | 1));
                }
                g.set_profiling(run >= 3);
                g.reset_profile();
                g.scope(|s| {
                    let l: Vec<_> = leaves.iter().map(|t| s.leaf(t)).collect();
                    let loss = program(&l).sum();
                    s.backward(loss).expect("backward of a scalar loss");
                });
                if run >= 3 {
                    let p = g.profile();
                    let row = p.ops.iter().find(|r| r.op == op).expect("the case records its op");
                    fwd.push(row.forward.as_secs_f64() * 1e6);
                    bwd.push(row.backward.as_secs_f64() * 1e6);
                }
            }
            println!("{name}\t{op}\t{mode}\t{:.1}\t{:.1}", median(fwd), median(bwd));
        }
    }
    std::hint::black_box(&junk);
}
