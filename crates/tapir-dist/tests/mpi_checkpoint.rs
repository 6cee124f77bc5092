//! Under mpirun with 1, 2 and 4 ranks: resuming from a checkpoint written at step K gives,
//! at step N, bitwise the parameters of an uninterrupted run, with Adam (moments and step
//! count), a warm-up + cosine schedule, a sampler stopped mid-epoch and an RNG that
//! perturbs the inputs. The resumed run starts from fresh objects (another
//! initialisation, another learning rate, a sampler at epoch 0, a reseeded RNG), so only
//! what the checkpoint holds can make it match.

mod common;

use common::*;
use tapir::{GradBuffer, Graph, ParamStore, Tensor};
use tapir_dist::checkpoint::{self, TrainState};
use tapir_dist::{params_hash, Comm, DataParallel, DistributedSampler, Mpi, SplitMix64};
use tapir_nn::optim::{Adam, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{Ctx, Mlp, Module};

const LEN: usize = 50;
const BATCH: usize = 8;
const TOTAL: usize = 16;
const RESUME_AT: usize = 9;
const SCHEDULE: CosineWarmup = CosineWarmup { base: 0.05, min: 0.001, warmup: 3, total: TOTAL };

struct Run<'c> {
    dp: DataParallel<f64, &'c Mpi>,
    store: ParamStore<f64>,
    mlp: Mlp,
    opt: Adam<f64>,
    sampler: DistributedSampler,
    rng: SplitMix64,
    grads: GradBuffer<f64>,
    graph: Graph<f64>,
}

fn start(comm: &Mpi, init_seed: u64, lr: f64, rng_seed: u64) -> Run<'_> {
    let (mut store, mlp) = model::<f64>(10, init_seed);
    let dp = DataParallel::new(comm, &mut store).unwrap();
    let opt = Adam::new(&store, lr).unwrap();
    let sampler = DistributedSampler::new(LEN, BATCH, comm.rank(), comm.size(), 5).unwrap();
    let grads = store.zeros_like().unwrap();
    Run { dp, store, mlp, opt, sampler, rng: SplitMix64::new(rng_seed), grads, graph: Graph::new() }
}

/// Steps `from..to`; each step perturbs every sample by noise drawn from the shared RNG's
/// next output and the sample's index, so the noise does not depend on the world size.
fn train(run: &mut Run, d: &Data<f64>, from: usize, to: usize) {
    for step in from..to {
        if run.sampler.state().batch >= run.sampler.batches_per_epoch() {
            run.sampler.set_epoch(run.sampler.state().epoch + 1);
        }
        let idx = run.sampler.next_shard().unwrap().to_vec();
        let step_seed = run.rng.next_u64();
        let (store, mlp, graph) = (&run.store, &run.mlp, &mut run.graph);
        run.dp
            .step(&mut run.grads, |g| {
                if idx.is_empty() {
                    return Ok(0);
                }
                let (x, y) = batch(d, &idx);
                let noisy: Vec<f64> = x
                    .data()
                    .iter()
                    .enumerate()
                    .map(|(j, v)| {
                        let mut r = SplitMix64::new(step_seed ^ (idx[j / FEATURES] * FEATURES + j % FEATURES) as u64);
                        v + 0.01 * ((r.next_u64() >> 11) as f64 / (1u64 << 53) as f64 - 0.5)
                    })
                    .collect();
                let x = Tensor::from_vec(noisy, &[idx.len(), FEATURES])?;
                graph.scope(|s| {
                    let loss = mlp.forward(Ctx::train(s, store), s.input(&x)).cross_entropy(&y);
                    s.backward_into(loss, g)
                })?;
                Ok::<_, tapir::Error>(idx.len())
            })
            .unwrap();
        run.opt.set_lr(SCHEDULE.lr(step));
        run.opt.step(&mut run.store, &run.grads).unwrap();
    }
}

fn main() {
    let comm = Mpi::init().unwrap();
    let d = data::<f64>(LEN, 21);

    let mut straight = start(&comm, 1, SCHEDULE.lr(0), 77);
    train(&mut straight, &d, 0, TOTAL);
    let want = params_hash(&straight.store);

    let mut first = start(&comm, 1, SCHEDULE.lr(0), 77);
    train(&mut first, &d, 0, RESUME_AT);
    let dir = std::env::temp_dir().join(format!("tapir-dist-resume-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("step9.safetensors");
    let state = TrainState {
        step: RESUME_AT as u64,
        sampler: first.sampler.state(),
        rngs: vec![("noise".into(), first.rng.state())],
    };
    checkpoint::save(&mut first.dp, &path, &first.store, &first.opt, &state).unwrap();
    drop(first);

    // A fresh process's view: other initial values, learning rate and RNG seed.
    let mut resumed = start(&comm, 2, 0.9, 1);
    let got = checkpoint::load(&mut resumed.dp, &path, &mut resumed.store, &mut resumed.opt).unwrap();
    ensure(&comm, got == state, format!("train state round trip: {got:?} vs {state:?}"));
    resumed.sampler.set_state(got.sampler).unwrap();
    resumed.rng = SplitMix64::new(got.rngs.iter().find(|(n, _)| n == "noise").unwrap().1);
    train(&mut resumed, &d, got.step as usize, TOTAL);
    ensure(&comm, resumed.opt.steps() == TOTAL as u64, format!("Adam steps {}", resumed.opt.steps()));
    ensure(
        &comm,
        params_hash(&resumed.store) == want && flat(&resumed.store) == flat(&straight.store),
        format!("resumed at {RESUME_AT}: parameters at {TOTAL} differ from the uninterrupted run's"),
    );
    if comm.rank() == 0 {
        std::fs::remove_dir_all(&dir).unwrap();
    }
    say(&comm, format!("ok: resumed at step {RESUME_AT} of {TOTAL} (Adam, warm-up + cosine, mid-epoch sampler, RNG): bitwise identical"));
}
