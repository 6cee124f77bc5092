//! Per-op cost of a custom op against the built-in op it reimplements: a chain of 10,000
//! links `y = softplus(y) * 0.5`, the softplus fused through `CustomOp` (saving `σ(x)`) or
//! built in, recorded then differentiated.
//!
//! `cargo run --release -p tapir --example custom_overhead` (1 thread; prints best of 30).

use std::time::{Duration, Instant};

use tapir::{CustomError, CustomInputs, CustomOp, Float, Graph, Shape, Tensor};

struct Softplus;

impl<T: Float> CustomOp<T> for Softplus {
    fn name(&self) -> &'static str {
        "fused_softplus"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn saved_len(&self, inputs: &[Shape]) -> usize {
        inputs[0].numel()
    }
    fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], sig: &mut [T]) -> Result<(), CustomError> {
        for ((y, s), &x) in out.iter_mut().zip(sig.iter_mut()).zip(x.value(0)) {
            let e = (-x.abs()).exp();
            *y = x.max(T::ZERO) + e.ln_1p();
            *s = if x >= T::ZERO { T::ONE / (T::ONE + e) } else { e / (T::ONE + e) };
        }
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, T>,
        _: &[T],
        sig: &[T],
        dout: &[T],
        dx: &mut [Option<&mut [T]>],
    ) -> Result<(), CustomError> {
        if let Some(dx) = dx[0].as_deref_mut() {
            for ((d, &g), &s) in dx.iter_mut().zip(dout).zip(sig) {
                *d += g * s;
            }
        }
        Ok(())
    }
}

const OPS: usize = 10_000;

/// (record, backward) time of one chain.
fn step(g: &mut Graph<f32>, x: &Tensor<f32>, custom: bool) -> (Duration, Duration) {
    g.scope(|s| {
        let start = Instant::now();
        let mut y = s.leaf(x);
        for _ in 0..OPS {
            // Scaled back so that values stay small along the chain.
            y = if custom { s.custom(&Softplus, &[y]) } else { y.softplus() } * 0.5;
        }
        let loss = y.sum();
        let record = start.elapsed();
        let start = Instant::now();
        s.backward(loss).expect("the chain is differentiable");
        (record, start.elapsed())
    })
}

fn main() {
    let mut g = Graph::<f32>::new();
    g.set_threads(1);
    for numel in [1usize, 1024] {
        let x = Tensor::full(&[numel], 0.5).expect("a valid shape");
        for custom in [false, true] {
            let (mut rec, mut bwd) = (Duration::MAX, Duration::MAX);
            for _ in 0..30 {
                let (r, b) = step(&mut g, &x, custom);
                (rec, bwd) = (rec.min(r), bwd.min(b));
            }
            // Per chain link: the softplus and the scaling after it.
            let per = |d: Duration| d.as_nanos() as f64 / OPS as f64;
            let name = if custom { "custom" } else { "builtin" };
            println!("numel {numel:5} {name:8}: record {:.1} ns/link, backward {:.1} ns/link", per(rec), per(bwd));
        }
    }
}
