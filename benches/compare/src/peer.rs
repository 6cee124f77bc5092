//! What every system implements, and the drivers that time it the same way for all.

use std::time::{Duration, Instant};

use crate::alloc_count;

/// The cheap op a W3/W4 chain repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainOp {
    /// `x ← tanh x`.
    Tanh,
    /// `x ← x·0.999` then `x ← x + 0.001`, alternating: two recorded ops per pair.
    Affine,
}

/// One engine under test. Every workload is optional: the faer-direct baseline has no W3.
pub trait Peer {
    /// Library version as pinned in Cargo.toml (or reported by the runtime).
    fn version(&self) -> String;
    /// Threads the engine will use for a large GEMM, as it reports them.
    fn threads(&self) -> usize;
    /// Prepares W1 (x is 1024×1024 normal).
    fn w1_init(&mut self) -> bool {
        false
    }
    /// One W1 iteration: `y = (x @ x).sum()`, backward, read one gradient element.
    fn w1_step(&mut self) {}
    /// Prepares W2 (the MLP, its batch and labels).
    fn w2_init(&mut self) -> bool {
        false
    }
    /// One W2 step: forward, cross-entropy, backward, SGD in place.
    fn w2_step(&mut self) {}
    /// Prepares W7 (the W2 network, batch and labels, and a fixed direction `v`).
    fn w7_init(&mut self) -> bool {
        false
    }
    /// W7's baseline: the gradient of W2's loss over all parameters (first-order path, no update).
    fn w7_grad(&mut self) {}
    /// One W7 Hessian-vector product `H v` of W2's loss over all parameters.
    fn w7_hvp(&mut self) {}
    /// Prepares W10 (the character-level transformer, its optimizer and a batch).
    fn w10_init(&mut self) -> bool {
        false
    }
    /// One W10 training step: forward, cross-entropy, backward, clipping, AdamW.
    fn w10_step(&mut self) {}
    /// Prepares W11 (the digits CNN, its optimizer and a batch).
    fn w11_init(&mut self) -> bool {
        false
    }
    /// One W11 training step: forward, cross-entropy, backward, SGD in place.
    fn w11_step(&mut self) {}
    /// Prepares W8 (the deep MLP), checkpointed every 4 hidden layers or not.
    fn w8_init(&mut self, _checkpoint: bool) -> bool {
        false
    }
    /// One W8 step: forward, cross-entropy, backward, SGD in place.
    fn w8_step(&mut self) {}
    /// The arena's high-water mark after W8's steps, main and scratch arenas together, in
    /// MiB (NaN where the engine has no arena).
    fn w8_arena_mib(&self) -> f64 {
        f64::NAN
    }
    /// Whether W3, W4 and W6 (graphs of tiny ops) apply.
    fn has_tape(&self) -> bool {
        false
    }
    /// W3: records `ops` ops of kind `op` on a leaf of `numel` elements, sums, runs
    /// backward; returns (record, backward) times.
    fn w3(&mut self, _numel: usize, _ops: usize, _op: ChainOp) -> (Duration, Duration) {
        unreachable!("has_tape() is false")
    }
    /// W4: records `nodes` tiny nodes (affine chain on shape [1]), backward, then frees
    /// everything; returns (record + backward, teardown) times.
    fn w4(&mut self, _nodes: usize) -> (Duration, Duration) {
        unreachable!("has_tape() is false")
    }
    /// W6: records a tanh chain of `nodes` nodes on shape [1] and returns the heap bytes
    /// live while the graph exists, minus those live before it was built.
    fn w6(&mut self, _nodes: usize) -> i64 {
        unreachable!("has_tape() is false")
    }
}

/// Prints one measurement for the orchestrator.
pub fn emit(metric: &str, value: f64) {
    println!("RESULT {metric} {value}");
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        f64::NAN
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn rss_mib() -> f64 {
    benches::rss::current_kib().map_or(f64::NAN, |k| k as f64 / 1024.0)
}

fn peak_mib() -> f64 {
    benches::rss::peak_kib().map_or(f64::NAN, |k| k as f64 / 1024.0)
}

/// Runs one workload on `p` and prints its metrics.
pub fn run(p: &mut dyn Peer, workload: &str, w5_steps: usize) {
    match workload {
        "W10" if p.w10_init() => {
            // `w5_steps` steps (500 by default for W10); the first 3 warm up. RSS growth
            // is from step 10 to the last.
            let (mut times, mut rss10) = (Vec::new(), f64::NAN);
            for step in 1..=w5_steps {
                let t = Instant::now();
                p.w10_step();
                if step > 3 {
                    times.push(ms(t.elapsed()));
                }
                if step == 10 {
                    rss10 = rss_mib();
                }
            }
            let step_ms = median(&mut times);
            emit("w10_ms", step_ms);
            emit("w10_tokens_per_s", benches::W10_TOKENS as f64 / step_ms * 1e3);
            emit("w10_peak_mib", peak_mib());
            emit("w10_growth_mib", rss_mib() - rss10);
        }
        "W11" if p.w11_init() => {
            // 60 steps (a few ms each): the first 3 warm up.
            let mut times = Vec::new();
            for step in 1..=60 {
                let t = Instant::now();
                p.w11_step();
                if step > 3 {
                    times.push(ms(t.elapsed()));
                }
            }
            emit("w11_ms", median(&mut times));
            emit("w11_peak_mib", peak_mib());
        }
        w @ ("W8" | "W8C") if p.w8_init(w == "W8C") => {
            // 6 steps (each runs about 50 GFLOP): the first 2 warm up.
            let tag = w.to_lowercase();
            let mut times = Vec::new();
            for step in 1..=6 {
                let t = Instant::now();
                p.w8_step();
                if step > 2 {
                    times.push(ms(t.elapsed()));
                }
            }
            emit(&format!("{tag}_ms"), median(&mut times));
            emit(&format!("{tag}_peak_mib"), peak_mib());
            emit(&format!("{tag}_arena_mib"), p.w8_arena_mib());
        }
        "W1" if p.w1_init() => {
            // 20 iterations: the first 3 warm up; RSS growth is from iteration 10 to the last.
            let (mut times, mut rss10) = (Vec::new(), f64::NAN);
            for i in 1..=20 {
                let t = Instant::now();
                p.w1_step();
                if i > 3 {
                    times.push(ms(t.elapsed()));
                }
                if i == 10 {
                    rss10 = rss_mib();
                }
            }
            emit("w1_ms", median(&mut times));
            emit("w1_peak_mib", peak_mib());
            emit("w1_growth_mib", rss_mib() - rss10);
        }
        "W2" if p.w2_init() => {
            let mut times = Vec::new();
            for i in 1..=15 {
                let t = Instant::now();
                p.w2_step();
                if i > 3 {
                    times.push(ms(t.elapsed()));
                }
            }
            emit("w2_ms", median(&mut times));
            emit("w2_peak_mib", peak_mib());
        }
        "W7" if p.w7_init() => {
            // Gradient and HVP alternate, so that both see the same machine load; 3 warm-up
            // rounds, then 12 timed.
            let (mut grad, mut hvp) = (Vec::new(), Vec::new());
            for i in 1..=15 {
                let t = Instant::now();
                p.w7_grad();
                let g = ms(t.elapsed());
                let t = Instant::now();
                p.w7_hvp();
                let h = ms(t.elapsed());
                if i > 3 {
                    grad.push(g);
                    hvp.push(h);
                }
            }
            let (g, h) = (median(&mut grad), median(&mut hvp));
            emit("w7_grad_ms", g);
            emit("w7_hvp_ms", h);
            emit("w7_hvp_over_grad", h / g);
            emit("w7_peak_mib", peak_mib());
        }
        "W5" if p.w2_init() => {
            let mut at = Vec::new();
            for step in 1..=w5_steps {
                p.w2_step();
                if step == 100 || step == 1000 || step == w5_steps {
                    at.push((step, rss_mib()));
                }
            }
            for &(step, rss) in &at {
                emit(&format!("w5_rss_{step}_mib"), rss);
            }
            if let (Some(first), Some(last)) = (at.first(), at.last()) {
                emit("w5_growth_mib", last.1 - first.1);
            }
        }
        "W3" if p.has_tape() => {
            for numel in [1usize, 1024] {
                for (op, name) in [(ChainOp::Tanh, "tanh"), (ChainOp::Affine, "affine")] {
                    let ops = benches::CHAIN_OPS;
                    let (mut rec, mut bwd) = (Vec::new(), Vec::new());
                    for i in 0..7 {
                        let (r, b) = p.w3(numel, ops, op);
                        if i > 1 {
                            rec.push(r.as_secs_f64() * 1e9 / ops as f64);
                            bwd.push(b.as_secs_f64() * 1e9 / ops as f64);
                        }
                    }
                    emit(&format!("w3_{name}_{numel}_record_ns"), median(&mut rec));
                    emit(&format!("w3_{name}_{numel}_backward_ns"), median(&mut bwd));
                }
            }
        }
        "W4" if p.has_tape() => {
            for nodes in [1_000usize, 10_000, 100_000, 1_000_000] {
                let (mut down, mut total) = (Vec::new(), Vec::new());
                let reps = if nodes >= 1_000_000 { 3 } else { 5 };
                for _ in 0..reps {
                    let (bb, td) = p.w4(nodes);
                    down.push(td.as_secs_f64() * 1e6);
                    total.push(ms(bb + td));
                }
                emit(&format!("w4_{nodes}_teardown_us"), median(&mut down));
                emit(&format!("w4_{nodes}_total_ms"), median(&mut total));
            }
        }
        "W6" if p.has_tape() => {
            let nodes = 100_000;
            alloc_count::enable();
            let bytes = p.w6(nodes);
            emit("w6_heap_bytes_per_node", bytes as f64 / nodes as f64);
        }
        _ => {}
    }
}
