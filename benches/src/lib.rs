//! The Tapir side of the benchmark workloads W1–W11 and their faer-direct baselines, shared
//! by the criterion benches (`cargo bench -p benches`) and the comparison runner
//! (`benches/compare`, `just compare`), so that both measure exactly the same code.
//!
//! | workload | what                                                                      |
//! |----------|---------------------------------------------------------------------------|
//! | W1       | `y = (x @ x).sum()` for `x` 1024×1024, backward ([`SeedLoop`])            |
//! | W2       | MLP 784-1024-1024-10, ReLU, batch 256, cross-entropy, SGD ([`Mlp`])       |
//! | W3       | a chain of cheap elementwise ops on a tiny tensor, sum, backward ([`chain`]) |
//! | W4       | ending the scope after backward on a tape of 10^3..10^6 tiny nodes        |
//! | W5       | the W2 step 2,000 times, resident memory along the way                    |
//! | W6       | tape and arena bytes per recorded node ([`bytes_per_node`])               |
//! | W7       | Hessian-vector product of W2's loss over all parameters, and its gradient ([`MlpHvp`]) |
//! | W8       | deep MLP (32 layers, batch 4096) with and without checkpointing ([`DeepMlp`]) |
//! | W10      | one training step of `train_chars`' character-level GPT ([`CharStep`])   |
//! | W11      | one training step of `train_digits --cnn`'s CNN, batch 256 ([`CnnStep`]) |
//!
//! The baselines ([`FaerSeedLoop`], [`FaerMlp`]) run the same GEMMs straight on faer with
//! preallocated outputs: the best a GEMM-bound autodiff step could do, so that Tapir's
//! overhead is a ratio, not a guess.

use std::time::{Duration, Instant};

use faer::linalg::matmul::matmul;
use faer::{Accum, Mat, Par};
use rand::SeedableRng;
use tapir::{GradBuffer, Graph, ParamId, ParamStore, Tensor, Var};
use tapir_nn::optim::{Optimizer, Sgd};

mod w10;
mod w11;
mod w8;

pub use w10::{CharStep, W10_BATCH, W10_CONFIG, W10_TOKENS};
pub use w11::{CnnStep, W11_BATCH};
pub use w8::{DeepMlp, W8_BATCH, W8_EVERY, W8_HIDDEN, W8_WIDTH};

/// Matrix size of W1.
pub const W1_N: usize = 1024;
/// Layer widths of the W2 MLP: input, two hidden layers, classes.
pub const MLP_DIMS: [usize; 4] = [784, 1024, 1024, 10];
/// Batch size of W2.
pub const MLP_BATCH: usize = 256;
/// Learning rate of the W2 SGD step.
pub const MLP_LR: f32 = 0.01;
/// Ops in a W3 chain.
pub const CHAIN_OPS: usize = 10_000;

/// Threads for the benches: `TAPIR_THREADS` if set (0 or unset: every core).
pub fn threads() -> usize {
    match std::env::var("TAPIR_THREADS").ok().and_then(|v| v.parse::<usize>().ok()) {
        Some(n) if n > 0 => n,
        _ => std::thread::available_parallelism().map_or(1, |n| n.get()),
    }
}

/// faer's parallelism for `threads`, as [`Graph::set_threads`] chooses it.
pub fn par(threads: usize) -> Par {
    if threads == 1 {
        Par::Seq
    } else {
        Par::rayon(threads)
    }
}

/// A graph set to `threads` threads.
pub fn graph(threads: usize) -> Graph<f32> {
    let mut g = Graph::new();
    g.set_threads(threads);
    g
}

fn rng(seed: u64) -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(seed)
}

/// W1: `x` is `n×n` standard normal; one step is `y = (x @ x).sum()` and its backward.
pub struct SeedLoop {
    x: Tensor<f32>,
}

impl SeedLoop {
    /// A seed loop on an `n×n` matrix.
    pub fn new(n: usize) -> SeedLoop {
        let x = Tensor::normal(&[n, n], 0.0, 1.0, &mut rng(1)).expect("a valid shape");
        SeedLoop { x }
    }

    /// One iteration: forward, backward, and a read of the gradient. Returns `y`.
    pub fn step(&self, g: &mut Graph<f32>) -> f32 {
        g.scope(|s| {
            let x = s.leaf(&self.x);
            let y = x.matmul(x).sum();
            s.backward(y).expect("W1 records no error");
            let dx = x.grad().expect("x requires a gradient");
            std::hint::black_box(dx[0]);
            y.item().expect("a scalar")
        })
    }
}

/// W1's three GEMMs on faer directly: `y = x·x`, `dx = 1·xᵀ`, `dx += xᵀ·1`.
pub struct FaerSeedLoop {
    x: Mat<f32>,
    ones: Mat<f32>,
    y: Mat<f32>,
    dx: Mat<f32>,
}

impl FaerSeedLoop {
    /// Buffers for an `n×n` problem.
    pub fn new(n: usize) -> FaerSeedLoop {
        let t = Tensor::<f32>::normal(&[n, n], 0.0, 1.0, &mut rng(1)).expect("a valid shape");
        let x = Mat::from_fn(n, n, |i, j| t.data()[i * n + j]);
        FaerSeedLoop { x, ones: Mat::from_fn(n, n, |_, _| 1.0), y: Mat::zeros(n, n), dx: Mat::zeros(n, n) }
    }

    /// The three GEMMs.
    pub fn step(&mut self, par: Par) -> f32 {
        matmul(self.y.as_mut(), Accum::Replace, self.x.as_ref(), self.x.as_ref(), 1.0, par);
        matmul(self.dx.as_mut(), Accum::Replace, self.ones.as_ref(), self.x.transpose(), 1.0, par);
        matmul(self.dx.as_mut(), Accum::Add, self.x.transpose(), self.ones.as_ref(), 1.0, par);
        self.y[(0, 0)] + self.dx[(0, 0)]
    }
}

/// W2: a 784-1024-1024-10 ReLU MLP with biases, trained by plain SGD on one fixed batch.
pub struct Mlp {
    store: ParamStore<f32>,
    layers: Vec<(ParamId, ParamId)>,
    grads: GradBuffer<f32>,
    sgd: Sgd<f32>,
    x: Tensor<f32>,
    labels: Vec<usize>,
}

impl Mlp {
    /// Kaiming-scaled weights, zero biases, a normal batch and labels `i mod 10`.
    pub fn new() -> Mlp {
        let mut r = rng(2);
        let mut store = ParamStore::new();
        let mut layers = Vec::new();
        for (i, w) in MLP_DIMS.windows(2).enumerate() {
            let std = (2.0 / w[0] as f32).sqrt();
            let wt = Tensor::normal(&[w[0], w[1]], 0.0, std, &mut r).expect("a valid shape");
            let wid = store.add(format!("w{i}"), wt).expect("a fresh name");
            let bid = store.add(format!("b{i}"), Tensor::zeros(&[w[1]]).expect("a valid shape")).expect("a fresh name");
            layers.push((wid, bid));
        }
        let x = Tensor::normal(&[MLP_BATCH, MLP_DIMS[0]], 0.0, 1.0, &mut r).expect("a valid shape");
        let labels = (0..MLP_BATCH).map(|i| i % MLP_DIMS[3]).collect();
        let grads = store.zeros_like().unwrap();
        let sgd = Sgd::new(&store, MLP_LR.into()).expect("a valid learning rate");
        Mlp { store, layers, grads, sgd, x, labels }
    }

    /// One step: forward, cross-entropy, backward into the gradient buffer, SGD in place.
    /// Returns the loss.
    pub fn step(&mut self, g: &mut Graph<f32>) -> f32 {
        self.grads.zero();
        let (store, layers, grads, x, labels) = (&self.store, &self.layers, &mut self.grads, &self.x, &self.labels);
        let loss = g.scope(|s| {
            let mut h = s.input(x);
            for (i, &(w, b)) in layers.iter().enumerate() {
                h = h.linear(s.param(store, w), s.param(store, b));
                if i + 1 < layers.len() {
                    h = h.relu();
                }
            }
            let loss = h.cross_entropy(labels);
            s.backward_into(loss, grads).expect("W2 records no error");
            loss.item().expect("a scalar")
        });
        self.sgd.step(&mut self.store, &self.grads).expect("the store the optimizer was made for");
        loss
    }
}

impl Mlp {
    /// W2's step as DP-SGD without the noise: per-example gradient norms, each example's
    /// gradient clipped to `max_norm`, the clipped sum averaged over the batch, SGD in
    /// place (`Scope::per_example_store`, `PerExample::clipped_sum`). Returns the loss.
    pub fn dp_step(&mut self, g: &mut Graph<f32>, max_norm: f32) -> f32 {
        let (store, layers, x, labels) = (&self.store, &self.layers, &self.x, &self.labels);
        let (loss, sum) = g.scope(|s| {
            let xv = s.input(x);
            let loss = forward(s, store, layers, xv).cross_entropy(labels);
            let per = s.per_example_store(loss, (labels.len(), &[xv]), store).expect("W2 splits into examples");
            (loss.item().expect("a scalar"), per.clipped_sum(max_norm).expect("fits").1)
        });
        // The loss is a mean, so each per-example gradient carries 1/B already.
        for ((_, mut dst), src) in self.grads.iter_mut().zip(&sum) {
            dst.data_mut().copy_from_slice(src.data());
        }
        self.sgd.step(&mut self.store, &self.grads).expect("the store the optimizer was made for");
        loss
    }

    /// The materialised per-example gradients of W2's loss over the first `batch`
    /// examples (`PerExample::grads`): one `[batch, ...]` tensor per parameter.
    pub fn per_example_grads(&self, g: &mut Graph<f32>, batch: usize) -> Vec<Tensor<f32>> {
        let mut out = vec![];
        self.per_example_grads_into(g, batch, &mut out);
        out
    }

    /// As [`per_example_grads`](Mlp::per_example_grads), into `out`'s tensors, allocated
    /// on the first call only (`PerExample::grads_into`).
    pub fn per_example_grads_into(&self, g: &mut Graph<f32>, batch: usize, out: &mut Vec<Tensor<f32>>) {
        let (store, layers) = (&self.store, &self.layers);
        let x = Tensor::from_vec(self.x.data()[..batch * MLP_DIMS[0]].to_vec(), &[batch, MLP_DIMS[0]])
            .expect("a valid shape");
        let labels = &self.labels[..batch];
        g.scope(|s| {
            let xv = s.input(&x);
            let loss = forward(s, store, layers, xv).cross_entropy(labels);
            let per = s.per_example_store(loss, (batch, &[xv]), store).expect("W2 splits into examples");
            per.grads_into(out).expect("fits");
        });
    }
}

/// W2's forward: linear layers with ReLU between them.
fn forward<'s, 'g>(
    s: &'s tapir::Scope<'s, 'g, f32>,
    store: &'g ParamStore<f32>,
    layers: &[(ParamId, ParamId)],
    x: Var<'s, f32>,
) -> Var<'s, f32> {
    let mut h = x;
    for (i, &(w, b)) in layers.iter().enumerate() {
        h = h.linear(s.param(store, w), s.param(store, b));
        if i + 1 < layers.len() {
            h = h.relu();
        }
    }
    h
}

impl Default for Mlp {
    fn default() -> Self {
        Mlp::new()
    }
}

/// W2's eight GEMMs on faer directly, at the same shapes: three forward, three weight
/// gradients, two input gradients (the batch needs none).
pub struct FaerMlp {
    x: Mat<f32>,
    w: Vec<Mat<f32>>,
    h: Vec<Mat<f32>>,
    dh: Vec<Mat<f32>>,
    dw: Vec<Mat<f32>>,
}

impl FaerMlp {
    /// Buffers for the W2 shapes.
    pub fn new() -> FaerMlp {
        let d = MLP_DIMS;
        let fill = |r: usize, c: usize| Mat::from_fn(r, c, |i, j| ((i * 7 + j * 13) % 17) as f32 * 0.01);
        FaerMlp {
            x: fill(MLP_BATCH, d[0]),
            w: (0..3).map(|i| fill(d[i], d[i + 1])).collect(),
            h: (0..3).map(|i| Mat::zeros(MLP_BATCH, d[i + 1])).collect(),
            dh: (0..3).map(|i| fill(MLP_BATCH, d[i + 1])).collect(),
            dw: (0..3).map(|i| Mat::zeros(d[i], d[i + 1])).collect(),
        }
    }

    /// The eight GEMMs.
    pub fn step(&mut self, par: Par) -> f32 {
        matmul(self.h[0].as_mut(), Accum::Replace, self.x.as_ref(), self.w[0].as_ref(), 1.0, par);
        for i in 1..3 {
            let (prev, next) = self.h.split_at_mut(i);
            matmul(next[0].as_mut(), Accum::Replace, prev[i - 1].as_ref(), self.w[i].as_ref(), 1.0, par);
        }
        for i in (0..3).rev() {
            let input = if i == 0 { self.x.as_ref() } else { self.h[i - 1].as_ref() };
            matmul(self.dw[i].as_mut(), Accum::Replace, input.transpose(), self.dh[i].as_ref(), 1.0, par);
            if i > 0 {
                let (lo, hi) = self.dh.split_at_mut(i);
                matmul(lo[i - 1].as_mut(), Accum::Replace, hi[0].as_ref(), self.w[i].transpose(), 1.0, par);
            }
        }
        self.dw[0][(0, 0)] + self.h[2][(0, 0)]
    }
}

impl Default for FaerMlp {
    fn default() -> Self {
        FaerMlp::new()
    }
}

/// The cheap op a W3/W4 chain repeats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainOp {
    /// `x ← tanh x`.
    Tanh,
    /// `x ← x·c`, then `x ← x + d` (two recorded ops per pair).
    Affine,
}

impl ChainOp {
    /// Both kinds.
    pub const ALL: [ChainOp; 2] = [ChainOp::Tanh, ChainOp::Affine];

    /// Short name for benchmark ids and tables.
    pub fn name(self) -> &'static str {
        match self {
            ChainOp::Tanh => "tanh",
            ChainOp::Affine => "affine",
        }
    }
}

/// Records `ops` ops of kind `op` starting from `x`, then their sum: `ops + 1` nodes.
pub fn chain<'s>(x: Var<'s, f32>, ops: usize, op: ChainOp) -> Var<'s, f32> {
    let mut y = x;
    for i in 0..ops {
        y = match op {
            ChainOp::Tanh => y.tanh(),
            ChainOp::Affine if i % 2 == 0 => y.mul_scalar(0.999),
            ChainOp::Affine => y.add_scalar(0.001),
        };
    }
    y.sum()
}

/// Times of one W3 run: recording the chain (and its sum), and backward.
#[derive(Debug, Clone, Copy, Default)]
pub struct ChainTimes {
    /// Recording `ops` ops and the sum.
    pub record: Duration,
    /// The backward pass.
    pub backward: Duration,
}

/// W3: a chain of `ops` ops on `x` (a gradient-requesting leaf), its sum and backward.
pub fn chain_step(g: &mut Graph<f32>, x: &Tensor<f32>, ops: usize, op: ChainOp) -> ChainTimes {
    g.scope(|s| {
        let t0 = Instant::now();
        let leaf = s.leaf(x);
        let y = chain(leaf, ops, op);
        let t1 = Instant::now();
        s.backward(y).expect("a chain records no error");
        let t2 = Instant::now();
        std::hint::black_box(leaf.grad());
        ChainTimes { record: t1 - t0, backward: t2 - t1 }
    })
}

/// Times of one W4 run.
#[derive(Debug, Clone, Copy, Default)]
pub struct TeardownTimes {
    /// Recording the tape and running backward.
    pub build_backward: Duration,
    /// Ending the scope: resetting the arena and the tape.
    pub teardown: Duration,
}

/// W4: records `nodes` tiny nodes (an affine chain on a `[1]`-shaped leaf), runs backward,
/// and times the end of the scope separately.
pub fn teardown_step(g: &mut Graph<f32>, x: &Tensor<f32>, nodes: usize) -> TeardownTimes {
    let t0 = Instant::now();
    let t1 = g.scope(|s| {
        let leaf = s.leaf(x);
        let y = chain(leaf, nodes.saturating_sub(2), ChainOp::Affine);
        s.backward(y).expect("a chain records no error");
        std::hint::black_box(leaf.grad());
        Instant::now()
    });
    let t2 = Instant::now();
    TeardownTimes { build_backward: t1 - t0, teardown: t2 - t1 }
}

/// W6: bytes per recorded node for a chain of tiny ops, after backward.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeBytes {
    /// Nodes on the tape.
    pub nodes: usize,
    /// Tape bytes (node records and index payloads) per node.
    pub tape: f64,
    /// Arena bytes (values and gradients) per node.
    pub arena: f64,
    /// The values and gradients themselves, per node (what any engine must store).
    pub payload: f64,
}

/// Measures [`NodeBytes`] for a chain of `ops` ops of kind `op` on a tensor of `numel`
/// elements.
pub fn bytes_per_node(numel: usize, ops: usize, op: ChainOp) -> NodeBytes {
    let x = Tensor::<f32>::full(&[numel], 0.5).expect("a valid shape");
    let mut g = graph(1);
    g.scope(|s| {
        let y = chain(s.leaf(&x), ops, op);
        s.backward(y).expect("a chain records no error");
        let st = s.stats();
        let n = st.nodes as f64;
        // Every node holds its value and, after backward, its gradient.
        let payload = (2 * numel * std::mem::size_of::<f32>()) as f64;
        NodeBytes { nodes: st.nodes, tape: st.tape_bytes as f64 / n, arena: st.arena.bytes_in_use as f64 / n, payload }
    })
}

mod w7;
pub use w7::MlpHvp;

/// The median of `v` (sorted in place): the middle value, or the mean of the two middle
/// ones for an even count; NaN for none.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Resident memory of this process, from `/proc/self/status` (Linux only).
pub mod rss {
    fn field(name: &str) -> Option<u64> {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find(|l| l.starts_with(name))?;
        line.split_whitespace().nth(1)?.parse().ok()
    }

    /// Resident set size now, in KiB.
    pub fn current_kib() -> Option<u64> {
        field("VmRSS:")
    }

    /// Peak resident set size since the process started, in KiB.
    pub fn peak_kib() -> Option<u64> {
        field("VmHWM:")
    }
}
