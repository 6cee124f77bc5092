//! Kernel-bound work through Tapir's public API, next to faer called directly:
//! elementwise ops and a reduction (forward only), matrix products, and W1.

use std::time::Duration;

use benches::{graph, par, threads, FaerSeedLoop, SeedLoop, W1_N};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use faer::linalg::matmul::matmul;
use faer::{Accum, Mat};
use rand::SeedableRng;
use std::hint::black_box;
use tapir::Tensor;

/// Sizes from overhead-bound (1 element) to memory-bound (2^20).
const SIZES: [usize; 4] = [1, 1024, 65_536, 1 << 20];

fn normal(dims: &[usize], seed: u64) -> Tensor<f32> {
    Tensor::normal(dims, 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(seed)).expect("a valid shape")
}

fn elementwise(c: &mut Criterion) {
    let mut g = graph(1);
    let mut group = c.benchmark_group("elementwise_tanh");
    for n in SIZES {
        let x = normal(&[n], 1);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &x, |b, x| {
            b.iter(|| g.scope(|s| black_box(s.input(black_box(x)).tanh().value().map(|v| v[0]))))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("elementwise_mul");
    for n in SIZES {
        let (x, y) = (normal(&[n], 1), normal(&[n], 2));
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &(x, y), |b, (x, y)| {
            b.iter(|| g.scope(|s| black_box((s.input(black_box(x)) * s.input(black_box(y))).value().map(|v| v[0]))))
        });
    }
    group.finish();

    let mut group = c.benchmark_group("sum");
    for n in SIZES {
        let x = normal(&[n], 1);
        group.throughput(Throughput::Elements(n as u64));
        group.bench_with_input(BenchmarkId::from_parameter(n), &x, |b, x| {
            b.iter(|| g.scope(|s| black_box(s.input(black_box(x)).sum().item())))
        });
    }
    group.finish();
}

fn matmul_vs_faer(c: &mut Criterion) {
    let t = threads();
    let mut g = graph(t);
    let mut group = c.benchmark_group(format!("matmul_t{t}"));
    group.sample_size(10);
    for n in [64usize, 256, 1024] {
        let (a, b) = (normal(&[n, n], 1), normal(&[n, n], 2));
        group.throughput(Throughput::Elements((2 * n * n * n) as u64));
        group.bench_with_input(BenchmarkId::new("tapir", n), &(&a, &b), |bench, (a, b)| {
            bench.iter(|| g.scope(|s| black_box(s.input(a).matmul(s.input(b)).value().map(|v| v[0]))))
        });
        let fa = Mat::from_fn(n, n, |i, j| a.data()[i * n + j]);
        let fb = Mat::from_fn(n, n, |i, j| b.data()[i * n + j]);
        let mut out = Mat::<f32>::zeros(n, n);
        group.bench_function(BenchmarkId::new("faer", n), |bench| {
            bench.iter(|| {
                matmul(out.as_mut(), Accum::Replace, black_box(fa.as_ref()), black_box(fb.as_ref()), 1.0, par(t));
                black_box(out[(0, 0)])
            })
        });
    }
    group.finish();
}

/// W1: `y = (x @ x).sum()` and backward, against its three GEMMs on faer.
fn w1_seed_loop(c: &mut Criterion) {
    let t = threads();
    let mut g = graph(t);
    let mut group = c.benchmark_group(format!("w1_seed_loop_t{t}"));
    group.sample_size(10).measurement_time(Duration::from_secs(4));
    group.throughput(Throughput::Elements((3 * 2 * W1_N * W1_N * W1_N) as u64));
    let w1 = SeedLoop::new(W1_N);
    group.bench_function("tapir", |b| b.iter(|| black_box(w1.step(&mut g))));
    let mut direct = FaerSeedLoop::new(W1_N);
    group.bench_function("faer_3_gemms", |b| b.iter(|| black_box(direct.step(par(t)))));
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = elementwise, matmul_vs_faer, w1_seed_loop
}
criterion_main!(benches);
