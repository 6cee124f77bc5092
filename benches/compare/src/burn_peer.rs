//! burn 0.22 through its user-facing tensor API on the ndarray backend under autodiff
//! (or, as `burn-flex`, on the flex CPU backend that burn now recommends).

use std::time::{Duration, Instant};

use burn_tensor::{activation, Device, Distribution, Int, Tensor};

use crate::alloc_count;
use crate::peer::{ChainOp, Peer};

pub struct Burn {
    dev: Device,
    w1: Option<Tensor<2>>,
    w2: Option<Mlp>,
}

struct Mlp {
    params: Vec<(Tensor<2>, Tensor<2>)>,
    x: Tensor<2>,
    labels: Tensor<2, Int>,
}

impl Burn {
    #[allow(deprecated)] // ndarray is the backend the issue names; flex is its successor
    pub fn ndarray() -> Burn {
        Burn { dev: Device::ndarray().autodiff(), w1: None, w2: None }
    }

    pub fn flex() -> Burn {
        Burn { dev: Device::flex().autodiff(), w1: None, w2: None }
    }
}

fn chain(x: Tensor<1>, ops: usize, op: ChainOp) -> Tensor<1> {
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

impl Mlp {
    fn new(dev: &Device) -> Mlp {
        let d = benches::MLP_DIMS;
        let mut params = Vec::new();
        for w in d.windows(2) {
            let std = (2.0 / w[0] as f64).sqrt();
            let wt = Tensor::<2>::random([w[0], w[1]], Distribution::Normal(0.0, std), dev).require_grad();
            let bt = Tensor::<2>::zeros([1, w[1]], dev).require_grad();
            params.push((wt, bt));
        }
        let x = Tensor::<2>::random([benches::MLP_BATCH, d[0]], Distribution::Normal(0.0, 1.0), dev);
        let labels: Vec<i64> = (0..benches::MLP_BATCH).map(|i| (i % d[3]) as i64).collect();
        let labels = Tensor::<1, Int>::from_ints(labels.as_slice(), dev).reshape([benches::MLP_BATCH, 1]);
        Mlp { params, x, labels }
    }

    fn step(&mut self) -> f32 {
        let mut h = self.x.clone();
        let last = self.params.len() - 1;
        for (i, (w, b)) in self.params.iter().enumerate() {
            h = h.matmul(w.clone()) + b.clone();
            if i < last {
                h = activation::relu(h);
            }
        }
        let logp = activation::log_softmax(h, 1);
        let loss = logp.gather(1, self.labels.clone()).mean().neg();
        let grads = loss.backward();
        // burn-optim's SGD, by hand: `p ← p − lr · grad` off the graph, then track again.
        for (w, b) in &mut self.params {
            for p in [w, b] {
                let g = p.grad(&grads).expect("every parameter gets a gradient");
                let next = p.clone().inner() - g.mul_scalar(benches::MLP_LR);
                *p = Tensor::from_inner(next).require_grad();
            }
        }
        loss.into_scalar::<f32>()
    }
}

impl Peer for Burn {
    fn version(&self) -> String {
        "0.22.1".into()
    }

    fn threads(&self) -> usize {
        rayon::current_num_threads()
    }

    fn w1_init(&mut self) -> bool {
        let n = benches::W1_N;
        self.w1 = Some(Tensor::<2>::random([n, n], Distribution::Normal(0.0, 1.0), &self.dev).require_grad());
        true
    }

    fn w1_step(&mut self) {
        let x = self.w1.as_ref().expect("w1_init ran");
        let y = x.clone().matmul(x.clone()).sum();
        let grads = y.backward();
        let dx = x.grad(&grads).expect("x gets a gradient");
        std::hint::black_box(dx.slice([0..1, 0..1]).into_scalar::<f32>());
    }

    fn w2_init(&mut self) -> bool {
        self.w2 = Some(Mlp::new(&self.dev));
        true
    }

    fn w2_step(&mut self) {
        std::hint::black_box(self.w2.as_mut().expect("w2_init ran").step());
    }

    fn has_tape(&self) -> bool {
        true
    }

    fn w3(&mut self, numel: usize, ops: usize, op: ChainOp) -> (Duration, Duration) {
        let x = Tensor::<1>::ones([numel], &self.dev).require_grad();
        let t0 = Instant::now();
        let y = chain(x.clone(), ops, op);
        let t1 = Instant::now();
        let grads = y.backward();
        std::hint::black_box(x.grad(&grads));
        let t2 = Instant::now();
        drop((grads, y));
        (t1 - t0, t2 - t1)
    }

    fn w4(&mut self, nodes: usize) -> (Duration, Duration) {
        let x = Tensor::<1>::ones([1], &self.dev).require_grad();
        let t0 = Instant::now();
        let y = chain(x.clone(), nodes - 2, ChainOp::Affine);
        let grads = y.backward();
        std::hint::black_box(x.grad(&grads));
        let t1 = Instant::now();
        drop(grads);
        drop(y);
        (t1 - t0, t1.elapsed())
    }

    fn w6(&mut self, nodes: usize) -> i64 {
        let x = Tensor::<1>::ones([1], &self.dev).require_grad();
        let before = alloc_count::live();
        let y = chain(x, nodes - 2, ChainOp::Tanh);
        let bytes = alloc_count::live() - before;
        drop(y);
        bytes
    }
}
