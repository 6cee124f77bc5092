//! Under mpirun: after warm-up, a data-parallel training step (sampler, forward,
//! `backward_into`, the all-reduce, metric averaging, Adam) makes no heap allocation
//! through Rust's allocator on any rank. Counted per thread by the engine's counting
//! allocator over steps 2..N. The MPI library's own `malloc` calls (for example in its
//! shared-memory transport) do not go through Rust's allocator and are not counted.

mod common;

use common::*;
use tapir::{Graph, Tensor};
use tapir_dist::{DataParallel, DistributedSampler, Mpi};
use tapir_nn::optim::{Adam, Optimizer};
use tapir_nn::{Ctx, Module};

#[path = "../../tapir/tests/common/mod.rs"]
mod counting;

#[global_allocator]
static ALLOC: counting::Counting = counting::Counting::new();

const STEPS: usize = 30;
const WARMUP: usize = 2;

fn main() {
    let comm = Mpi::init().unwrap();
    let (len, global) = (64 * 4, 32);
    let d = data::<f32>(len, 3);
    let (mut store, mlp) = model::<f32>(32, 3);
    let mut dp = DataParallel::new(&comm, &mut store).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut opt = Adam::new(&store, 1e-3).unwrap();
    let mut sampler = DistributedSampler::new(len, global, dp.rank(), dp.size(), 0).unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let local = global / dp.size();
    let mut x = Tensor::<f32>::zeros(&[local, FEATURES]).unwrap();
    let mut y = vec![0usize; local];
    let mut before = 0;
    let mut metrics = [0.0f64; 1];
    for step in 0..STEPS {
        if step == WARMUP {
            before = ALLOC.allocations();
        }
        if sampler.state().batch >= sampler.batches_per_epoch() {
            sampler.set_epoch(sampler.state().epoch + 1);
        }
        let shard = sampler.next_shard().unwrap();
        for (r, &i) in shard.iter().enumerate() {
            x.data_mut()[r * FEATURES..(r + 1) * FEATURES].copy_from_slice(&d.x[i * FEATURES..(i + 1) * FEATURES]);
            y[r] = d.y[i];
        }
        let n = shard.len();
        let mut loss = 0.0;
        dp.step(&mut grads, |g| {
            graph.scope(|s| {
                let l = mlp.forward(Ctx::train(s, &store), s.input(&x)).cross_entropy(&y);
                s.backward_into(l, g)?;
                loss = f64::from(l.item()?);
                Ok::<_, tapir::Error>(())
            })?;
            Ok::<_, tapir::Error>(n)
        })
        .unwrap();
        opt.step(&mut store, &grads).unwrap();
        metrics[0] = loss;
        dp.mean_metrics(&mut metrics, n as f64).unwrap();
    }
    let made = ALLOC.allocations() - before;
    ensure(&comm, made == 0, format!("rank {}: {made} heap allocations in steps {WARMUP}..{STEPS}", dp.rank()));
    say(
        &comm,
        format!("ok: 0 Rust heap allocations on every rank in steps {WARMUP}..{STEPS} (loss {:.4})", metrics[0]),
    );
}
