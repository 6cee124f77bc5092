//! candle-core with its built-in backprop (`Var`, `Tensor::backward`), used as its docs show.

use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor, Var};

use crate::alloc_count;
use crate::peer::{ChainOp, Peer};

type R<T> = candle_core::Result<T>;

pub struct Candle {
    dev: Device,
    w1: Option<Var>,
    w2: Option<Mlp>,
}

struct Mlp {
    params: Vec<(Var, Var)>,
    x: Tensor,
    labels: Tensor,
}

impl Candle {
    pub fn new() -> Candle {
        Candle { dev: Device::Cpu, w1: None, w2: None }
    }
}

fn ok<T>(r: R<T>) -> T {
    r.expect("candle workload")
}

/// `mean_i (lse(logits_i) − logits_i[label_i])`, composed as candle-nn's `log_softmax` and
/// `nll` do (candle-core has no fused cross-entropy).
fn cross_entropy(logits: &Tensor, labels: &Tensor) -> R<Tensor> {
    let n = logits.dim(0)?;
    let max = logits.max_keepdim(1)?;
    let diff = logits.broadcast_sub(&max)?;
    let lse = diff.exp()?.sum_keepdim(1)?.log()?;
    let logp = diff.broadcast_sub(&lse)?;
    logp.gather(labels, 1)?.sum_all()?.affine(-1.0 / n as f64, 0.0)
}

fn chain(x: &Tensor, ops: usize, op: ChainOp) -> R<Tensor> {
    let mut y = x.clone();
    for i in 0..ops {
        y = match op {
            ChainOp::Tanh => y.tanh()?,
            ChainOp::Affine if i % 2 == 0 => (&y * 0.999)?,
            ChainOp::Affine => (&y + 0.001)?,
        };
    }
    y.sum_all()
}

impl Mlp {
    fn new(dev: &Device) -> R<Mlp> {
        let d = benches::MLP_DIMS;
        let mut params = Vec::new();
        for w in d.windows(2) {
            let std = (2.0 / w[0] as f64).sqrt();
            let wt = Tensor::randn(0f32, std as f32, (w[0], w[1]), dev)?;
            params.push((Var::from_tensor(&wt)?, Var::zeros(w[1], DType::F32, dev)?));
        }
        let x = Tensor::randn(0f32, 1f32, (benches::MLP_BATCH, d[0]), dev)?;
        let labels: Vec<u32> = (0..benches::MLP_BATCH).map(|i| (i % d[3]) as u32).collect();
        let labels = Tensor::from_vec(labels, (benches::MLP_BATCH, 1), dev)?;
        Ok(Mlp { params, x, labels })
    }

    fn step(&self) -> R<f32> {
        let mut h = self.x.clone();
        for (i, (w, b)) in self.params.iter().enumerate() {
            h = h.matmul(w.as_tensor())?.broadcast_add(b.as_tensor())?;
            if i + 1 < self.params.len() {
                h = h.relu()?;
            }
        }
        let loss = cross_entropy(&h, &self.labels)?;
        let grads = loss.backward()?;
        // candle-nn's SGD: `var.set(var - lr · grad)`.
        for (w, b) in &self.params {
            for v in [w, b] {
                let g = grads.get(v.as_tensor()).expect("every parameter gets a gradient");
                v.set(&v.as_tensor().sub(&(g * benches::MLP_LR as f64)?)?)?;
            }
        }
        loss.to_scalar::<f32>()
    }
}

impl Peer for Candle {
    fn version(&self) -> String {
        "0.11.1".into()
    }

    fn threads(&self) -> usize {
        candle_core::utils::get_num_threads()
    }

    fn w1_init(&mut self) -> bool {
        let n = benches::W1_N;
        self.w1 = Some(ok(Var::randn(0f32, 1f32, (n, n), &self.dev)));
        true
    }

    fn w1_step(&mut self) {
        let x = self.w1.as_ref().expect("w1_init ran").as_tensor();
        let y = ok(x.matmul(x).and_then(|p| p.sum_all()));
        let grads = ok(y.backward());
        let dx = grads.get(x).expect("x gets a gradient");
        std::hint::black_box(ok(dx.get(0).and_then(|r| r.get(0)).and_then(|v| v.to_scalar::<f32>())));
    }

    fn w2_init(&mut self) -> bool {
        self.w2 = Some(ok(Mlp::new(&self.dev)));
        true
    }

    fn w2_step(&mut self) {
        std::hint::black_box(ok(self.w2.as_ref().expect("w2_init ran").step()));
    }

    fn has_tape(&self) -> bool {
        true
    }

    fn w3(&mut self, numel: usize, ops: usize, op: ChainOp) -> (Duration, Duration) {
        let x = ok(Var::ones(numel, DType::F32, &self.dev));
        let t0 = Instant::now();
        let y = ok(chain(x.as_tensor(), ops, op));
        let t1 = Instant::now();
        let grads = ok(y.backward());
        let t2 = Instant::now();
        std::hint::black_box(grads.get(x.as_tensor()));
        // Dropping the graph is not timed here (W4 times it).
        drop((grads, y));
        (t1 - t0, t2 - t1)
    }

    fn w4(&mut self, nodes: usize) -> (Duration, Duration) {
        let x = ok(Var::ones(1, DType::F32, &self.dev));
        let t0 = Instant::now();
        let y = ok(chain(x.as_tensor(), nodes - 2, ChainOp::Affine));
        let grads = ok(y.backward());
        std::hint::black_box(grads.get(x.as_tensor()));
        let t1 = Instant::now();
        drop(grads);
        drop(y);
        (t1 - t0, t1.elapsed())
    }

    fn w6(&mut self, nodes: usize) -> i64 {
        let x = ok(Var::ones(1, DType::F32, &self.dev));
        let before = alloc_count::live();
        let y = ok(chain(x.as_tensor(), nodes - 2, ChainOp::Tanh));
        let bytes = alloc_count::live() - before;
        drop(y);
        bytes
    }
}
