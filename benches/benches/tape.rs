//! Overhead-bound work: W3 (record and backward of a 10,000-op chain, timed separately)
//! and W4 (ending the scope after backward, for tapes of 10^3 to 10^6 nodes).

use std::time::Duration;

use benches::{chain_step, graph, teardown_step, ChainOp, CHAIN_OPS};
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use tapir::Tensor;

/// W3 on shape-[1] (pure overhead) and 1,024-element (overhead plus a little math) tensors.
fn w3_chain(c: &mut Criterion) {
    let mut g = graph(1);
    for numel in [1usize, 1024] {
        let x = Tensor::<f32>::full(&[numel], 0.5).expect("a valid shape");
        for (phase, record) in [("record", true), ("backward", false)] {
            let mut group = c.benchmark_group(format!("w3_{phase}_numel{numel}"));
            if numel > 1 {
                // 10,000 tanh ops on 1,024 elements take tens of milliseconds.
                group.sample_size(10);
            }
            // Elements are ops, so criterion's throughput is ops per second.
            group.throughput(Throughput::Elements(CHAIN_OPS as u64));
            for op in ChainOp::ALL {
                group.bench_function(BenchmarkId::from_parameter(op.name()), |b| {
                    b.iter_custom(|iters| {
                        (0..iters)
                            .map(|_| {
                                let t = chain_step(&mut g, black_box(&x), CHAIN_OPS, op);
                                if record {
                                    t.record
                                } else {
                                    t.backward
                                }
                            })
                            .sum()
                    })
                });
            }
            group.finish();
        }
    }
}

/// W4: only the end of the scope is timed; recording and backward run untimed before it.
fn w4_teardown(c: &mut Criterion) {
    let mut g = graph(1);
    let x = Tensor::<f32>::full(&[1], 0.5).expect("a valid shape");
    let mut group = c.benchmark_group("w4_teardown");
    group.sample_size(10).warm_up_time(Duration::from_millis(300)).measurement_time(Duration::from_secs(2));
    for nodes in [1_000usize, 10_000, 100_000, 1_000_000] {
        group.throughput(Throughput::Elements(nodes as u64));
        group.bench_function(BenchmarkId::from_parameter(nodes), |b| {
            b.iter_custom(|iters| (0..iters).map(|_| teardown_step(&mut g, black_box(&x), nodes).teardown).sum())
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(20).warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(2));
    targets = w3_chain, w4_teardown
}
criterion_main!(benches);
