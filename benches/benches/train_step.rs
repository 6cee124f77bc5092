//! W2: one MLP training step (forward, cross-entropy, backward into a reused gradient
//! buffer, SGD in place) with the arena reused across steps, against its eight GEMMs on faer;
//! W7: the Hessian-vector product of the same loss over all parameters, beside its gradient.
//! W8: the deep MLP step with and without checkpointing every 4 layers.

use std::time::Duration;

use benches::{graph, par, threads, DeepMlp, FaerMlp, Mlp, MlpHvp, MLP_BATCH, W8_BATCH};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use std::hint::black_box;

fn w2_mlp_step(c: &mut Criterion) {
    let t = threads();
    let mut g = graph(t);
    let mut group = c.benchmark_group(format!("w2_mlp_step_t{t}"));
    group.sample_size(10).measurement_time(Duration::from_secs(4));
    // Elements are training examples.
    group.throughput(Throughput::Elements(MLP_BATCH as u64));
    let mut mlp = Mlp::new();
    group.bench_function("tapir", |b| b.iter(|| black_box(mlp.step(&mut g))));
    let mut direct = FaerMlp::new();
    group.bench_function("faer_8_gemms", |b| b.iter(|| black_box(direct.step(par(t)))));
    group.finish();
}

/// W7: the Hessian-vector product of W2's loss over all parameters, beside the gradient
/// from `backward_into` (report time(hvp)/time(gradient)).
fn w7_mlp_hvp(c: &mut Criterion) {
    let t = threads();
    let mut g = graph(t);
    let mut group = c.benchmark_group(format!("w7_mlp_hvp_t{t}"));
    group.sample_size(10).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements(MLP_BATCH as u64));
    let mut m = MlpHvp::new();
    group.bench_function("gradient", |b| b.iter(|| black_box(m.grad(&mut g))));
    group.bench_function("hvp", |b| b.iter(|| black_box(m.hvp(&mut g))));
    group.finish();
}

fn w8_deep_mlp_step(c: &mut Criterion) {
    let t = threads();
    let mut group = c.benchmark_group(format!("w8_deep_mlp_step_t{t}"));
    // About 50 GFLOP a step: the fewest samples criterion takes, and a short window.
    group.sample_size(10).warm_up_time(Duration::from_secs(1)).measurement_time(Duration::from_secs(5));
    group.throughput(Throughput::Elements(W8_BATCH as u64));
    for (name, checkpoint) in [("plain", false), ("checkpoint_every_4", true)] {
        let mut g = graph(t);
        let mut mlp = DeepMlp::new(checkpoint);
        group.bench_function(name, |b| b.iter(|| black_box(mlp.step(&mut g))));
    }
    group.finish();
}

criterion_group!(benches, w2_mlp_step, w7_mlp_hvp, w8_deep_mlp_step);
criterion_main!(benches);
