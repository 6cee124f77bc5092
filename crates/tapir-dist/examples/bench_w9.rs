//! W9: the W2 training step (MLP 784-1024-1024-10, ReLU, cross-entropy, SGD, global batch
//! 256) data-parallel over the ranks of `mpirun`, one matrix-product thread per rank.
//!
//! ```text
//! cargo build --release -p tapir-dist --features mpi --example bench_w9
//! mpirun -np 2 target/release/examples/bench_w9 [--steps N] [--batch N]
//! ```
//!
//! Rank 0 prints one line: world size, ms per step (median over the timed steps), ms in
//! the gradient all-reduce (median; it includes waiting for the slowest rank) and its
//! share of the step, the all-reduce alone (back to back, no waiting), and samples per
//! second. Each figure is the maximum over ranks.
//! `just bench-mpi` runs it for 1, 2 and 4 ranks and adds the scaling efficiency
//! `t₁ / (k·t_k)` (strong scaling: the global batch stays 256).

use std::time::Instant;

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_dist::{Comm, DataParallel, Mpi};
use tapir_nn::optim::{Optimizer, Sgd};
use tapir_nn::{Activation, Ctx, Mlp, Module};

const DIMS: [usize; 4] = [784, 1024, 1024, 10];

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() -> std::process::ExitCode {
    Mpi::run(bench)
}

fn bench(comm: &Mpi) -> Result<(), Box<dyn std::error::Error>> {
    let (mut steps, mut global) = (20usize, 256usize);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        match a.as_str() {
            "--steps" => steps = it.next().ok_or("--steps needs a value")?.parse()?,
            "--batch" => global = it.next().ok_or("--batch needs a value")?.parse()?,
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let (rank, size) = (comm.rank(), comm.size());
    let local = global / size + usize::from(rank < global % size);
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let mut store = ParamStore::<f32>::new();
    let mlp = Mlp::builder(DIMS[0])
        .hidden(DIMS[1])
        .hidden(DIMS[2])
        .activation(Activation::Relu)
        .output(DIMS[3])
        .build(&mut store, "w2", &mut rng)?;
    let mut dp = DataParallel::new(comm, &mut store)?;
    let mut data_rng = rand::rngs::StdRng::seed_from_u64(1 + rank as u64);
    let x = Tensor::<f32>::uniform(&[local, DIMS[0]], 0.0, 1.0, &mut data_rng)?;
    let y: Vec<usize> = (0..local).map(|i| (i * 7 + rank) % DIMS[3]).collect();
    let mut grads = store.zeros_like()?;
    let mut opt = Sgd::new(&store, 0.01)?;
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let warmup = 3;
    let (mut step_ms, mut reduce_ms) = (Vec::new(), Vec::new());
    for step in 0..warmup + steps {
        let t0 = Instant::now();
        grads.zero();
        graph.scope(|s| {
            let loss = mlp.forward(Ctx::train(s, &store), s.input(&x)).cross_entropy(&y);
            s.backward_into(loss, &mut grads)
        })?;
        dp.accumulate(&mut grads, local)?;
        let t1 = Instant::now();
        dp.all_reduce(&mut grads)?;
        let t2 = Instant::now();
        opt.step(&mut store, &grads)?;
        let t3 = Instant::now();
        if step >= warmup {
            step_ms.push((t3 - t0).as_secs_f64() * 1e3);
            reduce_ms.push((t2 - t1).as_secs_f64() * 1e3);
        }
    }
    dp.check_in_sync(&store)?;
    // The all-reduce alone, back to back (the ranks are in step after the first), so that
    // waiting for a slower rank is not counted: the transport's own cost.
    let mut alone = Vec::new();
    for _ in 0..10 {
        dp.accumulate(&mut grads, 1)?;
        let t = Instant::now();
        dp.all_reduce(&mut grads)?;
        alone.push(t.elapsed().as_secs_f64() * 1e3);
    }
    // The slowest rank sets the pace: report rank-maxima of the medians.
    let mut m = [median(&mut step_ms), median(&mut reduce_ms), median(&mut alone)];
    let mut all = vec![0u64; size];
    comm.all_gather_u64(m[0].to_bits(), &mut all);
    m[0] = all.iter().map(|&b| f64::from_bits(b)).fold(0.0, f64::max);
    comm.all_gather_u64(m[1].to_bits(), &mut all);
    m[1] = all.iter().map(|&b| f64::from_bits(b)).fold(0.0, f64::max);
    comm.all_gather_u64(m[2].to_bits(), &mut all);
    m[2] = all.iter().map(|&b| f64::from_bits(b)).fold(0.0, f64::max);
    if rank == 0 {
        println!(
            "W9 ranks {size} | params {} | global batch {global} ({local} per rank) | {:.2} ms/step | all-reduce {:.2} ms ({:.1}%), alone {:.2} ms | {:.0} samples/s",
            store.numel(),
            m[0],
            m[1],
            100.0 * m[1] / m[0],
            m[2],
            global as f64 / (m[0] / 1e3)
        );
    }
    Ok(())
}
