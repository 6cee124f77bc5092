//! Tapir, through the same code as the criterion benches, and the faer-direct baseline.

use std::time::Duration;

use benches::{DeepMlp, FaerMlp, FaerSeedLoop, Mlp, MlpHvp, SeedLoop, W1_N};
use tapir::{Graph, Tensor};

use crate::alloc_count;
use crate::peer::{ChainOp, Peer};

pub struct Tapir {
    threads: usize,
    graph: Graph<f32>,
    w1: Option<SeedLoop>,
    w2: Option<Mlp>,
    w7: Option<MlpHvp>,
    w10: Option<benches::CharStep>,
    w11: Option<benches::CnnStep>,
    w8: Option<DeepMlp>,
    leaves: Vec<Tensor<f32>>,
}

impl Tapir {
    pub fn new(threads: usize) -> Tapir {
        Tapir {
            threads,
            graph: benches::graph(threads),
            w1: None,
            w2: None,
            w7: None,
            w10: None,
            w11: None,
            w8: None,
            leaves: Vec::new(),
        }
    }

    fn leaf(&mut self, numel: usize) -> Tensor<f32> {
        if let Some(t) = self.leaves.iter().find(|t| t.numel() == numel) {
            return t.clone();
        }
        let t = Tensor::full(&[numel], 0.5).expect("a valid shape");
        self.leaves.push(t.clone());
        t
    }
}

fn op(o: ChainOp) -> benches::ChainOp {
    match o {
        ChainOp::Tanh => benches::ChainOp::Tanh,
        ChainOp::Affine => benches::ChainOp::Affine,
    }
}

impl Peer for Tapir {
    fn version(&self) -> String {
        format!("{} (this tree)", env!("CARGO_PKG_VERSION"))
    }

    fn threads(&self) -> usize {
        self.graph.threads()
    }

    fn w8_init(&mut self, checkpoint: bool) -> bool {
        self.w8 = Some(DeepMlp::new(checkpoint));
        true
    }

    fn w8_step(&mut self) {
        let w8 = self.w8.as_mut().expect("w8_init ran");
        std::hint::black_box(w8.step(&mut self.graph));
    }

    fn w8_arena_mib(&self) -> f64 {
        let st = self.graph.stats();
        (st.arena.high_water + st.scratch.high_water) as f64 / (1 << 20) as f64
    }

    fn w1_init(&mut self) -> bool {
        self.w1 = Some(SeedLoop::new(W1_N));
        true
    }

    fn w1_step(&mut self) {
        let w1 = self.w1.as_ref().expect("w1_init ran");
        std::hint::black_box(w1.step(&mut self.graph));
    }

    fn w7_init(&mut self) -> bool {
        self.w7 = Some(MlpHvp::new());
        true
    }

    fn w7_grad(&mut self) {
        let m = self.w7.as_mut().expect("w7_init ran");
        std::hint::black_box(m.grad(&mut self.graph));
    }

    fn w7_hvp(&mut self) {
        let m = self.w7.as_mut().expect("w7_init ran");
        std::hint::black_box(m.hvp(&mut self.graph));
    }

    fn w2_init(&mut self) -> bool {
        self.w2 = Some(Mlp::new());
        true
    }

    fn w2_step(&mut self) {
        let w2 = self.w2.as_mut().expect("w2_init ran");
        std::hint::black_box(w2.step(&mut self.graph));
    }

    fn w10_init(&mut self) -> bool {
        self.w10 = Some(benches::CharStep::new());
        true
    }

    fn w10_step(&mut self) {
        let w10 = self.w10.as_mut().expect("w10_init ran");
        std::hint::black_box(w10.step(&mut self.graph));
    }

    fn w11_init(&mut self) -> bool {
        self.w11 = Some(benches::CnnStep::new());
        true
    }

    fn w11_step(&mut self) {
        let w11 = self.w11.as_mut().expect("w11_init ran");
        std::hint::black_box(w11.step(&mut self.graph));
    }

    fn has_tape(&self) -> bool {
        true
    }

    fn w3(&mut self, numel: usize, ops: usize, o: ChainOp) -> (Duration, Duration) {
        let x = self.leaf(numel);
        let t = benches::chain_step(&mut self.graph, &x, ops, op(o));
        (t.record, t.backward)
    }

    fn w4(&mut self, nodes: usize) -> (Duration, Duration) {
        let x = self.leaf(1);
        let t = benches::teardown_step(&mut self.graph, &x, nodes);
        (t.build_backward, t.teardown)
    }

    fn w6(&mut self, nodes: usize) -> i64 {
        let x = Tensor::full(&[1], 0.5).expect("a valid shape");
        // A fresh graph: the first scope pays for the tape's and the arena's growth.
        let mut g = benches::graph(self.threads);
        let before = alloc_count::live();
        g.scope(|s| {
            let y = benches::chain(s.leaf(&x), nodes - 2, benches::ChainOp::Tanh);
            std::hint::black_box(y);
            let st = s.stats();
            crate::peer::emit("w6_tapir_tape_bytes_per_node", st.tape_bytes as f64 / st.nodes as f64);
            crate::peer::emit("w6_tapir_arena_bytes_per_node", st.arena.bytes_in_use as f64 / st.nodes as f64);
            alloc_count::live() - before
        })
    }
}

/// The same GEMMs on faer directly, with preallocated outputs.
pub struct FaerDirect {
    threads: usize,
    w1: Option<FaerSeedLoop>,
    w2: Option<FaerMlp>,
}

impl FaerDirect {
    pub fn new(threads: usize) -> FaerDirect {
        FaerDirect { threads, w1: None, w2: None }
    }
}

impl Peer for FaerDirect {
    fn version(&self) -> String {
        "0.24 (Tapir's)".into()
    }

    fn threads(&self) -> usize {
        benches::par(self.threads).degree()
    }

    fn w1_init(&mut self) -> bool {
        self.w1 = Some(FaerSeedLoop::new(W1_N));
        true
    }

    fn w1_step(&mut self) {
        let par = benches::par(self.threads);
        std::hint::black_box(self.w1.as_mut().expect("w1_init ran").step(par));
    }

    fn w2_init(&mut self) -> bool {
        self.w2 = Some(FaerMlp::new());
        true
    }

    fn w2_step(&mut self) {
        let par = benches::par(self.threads);
        std::hint::black_box(self.w2.as_mut().expect("w2_init ran").step(par));
    }
}
