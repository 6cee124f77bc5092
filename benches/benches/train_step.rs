//! W2: one MLP training step (forward, cross-entropy, backward into a reused gradient
//! buffer, SGD in place) with the arena reused across steps, against its eight GEMMs on faer.

use std::time::Duration;

use benches::{graph, par, threads, FaerMlp, Mlp, MLP_BATCH};
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

criterion_group!(benches, w2_mlp_step);
criterion_main!(benches);
