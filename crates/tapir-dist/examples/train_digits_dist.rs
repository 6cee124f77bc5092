//! Data-parallel version of tapir-nn's `train_digits`: the MLP 64-256-128-10 on
//! scikit-learn's 8x8 digits (1,438 training, 359 test images), Adam with warm-up and a
//! cosine schedule, global batch 32 split over the ranks, one matrix-product thread per rank.
//!
//! ```text
//! cargo build --release -p tapir-dist --features mpi --example train_digits_dist
//! mpirun -np 1 target/release/examples/train_digits_dist
//! mpirun -np 2 target/release/examples/train_digits_dist      # same accuracy, in less time
//! ```
//!
//! Options: `--epochs N` (default 40), `--seed N` (default 0), `--batch N` (global, default 32),
//! `--checkpoint PATH` (save at the end; resume from it if it exists).
//!
//! Every epoch rank 0 prints the training loss and the test accuracy, both averaged
//! over the ranks (each rank evaluates its shard of the test set); at the end, samples per
//! second and milliseconds per step for this world size.

use std::error::Error;
use std::io::Read;
use std::time::Instant;

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_dist::checkpoint::{self, TrainState};
use tapir_dist::{Comm, DataParallel, DistributedSampler, Mpi};
use tapir_nn::optim::{Adam, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{Ctx, Mlp, Module};

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const DIGITS: &[u8] = include_bytes!("../../tapir-nn/data/digits.csv.gz");
const PIXELS: usize = 64;

struct Split {
    x: Vec<f32>,
    y: Vec<usize>,
}

/// The same fixed split as `train_digits`: every fifth image is a test image.
fn load_digits() -> Result<(Split, Split)> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS).read_to_string(&mut text)?;
    let (mut train, mut test) = (Split { x: vec![], y: vec![] }, Split { x: vec![], y: vec![] });
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<u32> = line.split(',').map(str::parse).collect::<std::result::Result<_, _>>()?;
        if fields.len() != PIXELS + 1 || fields[0] > 9 {
            return Err(format!("digits.csv line {}: expected a label 0-9 and 64 pixels", i + 1).into());
        }
        let split = if i % 5 == 4 { &mut test } else { &mut train };
        split.y.push(fields[0] as usize);
        split.x.extend(fields[1..].iter().map(|&p| p as f32 / 16.0));
    }
    Ok((train, test))
}

fn rows(split: &Split, idx: &[usize]) -> Result<(Tensor<f32>, Vec<usize>)> {
    let x = idx.iter().flat_map(|&i| split.x[i * PIXELS..(i + 1) * PIXELS].iter().copied()).collect();
    Ok((Tensor::from_vec(x, &[idx.len(), PIXELS])?, idx.iter().map(|&i| split.y[i]).collect()))
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (j, &v)| if v > row[best] { j } else { best })
}

fn main() -> std::process::ExitCode {
    Mpi::run(train)
}

fn train(comm: &Mpi) -> Result<()> {
    let (mut epochs, mut seed, mut global_batch, mut ckpt) = (40usize, 0u64, 32usize, None);
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--epochs" => epochs = value()?.parse()?,
            "--seed" => seed = value()?.parse()?,
            "--batch" => global_batch = value()?.parse()?,
            "--checkpoint" => ckpt = Some(std::path::PathBuf::from(value()?)),
            other => return Err(format!("unknown argument {other:?}").into()),
        }
    }
    let (rank, size) = (comm.rank(), comm.size());
    let (train, test) = load_digits()?;
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut store = ParamStore::<f32>::new();
    let model = Mlp::builder(PIXELS).hidden(256).hidden(128).output(10).build(&mut store, "mlp", &mut rng)?;
    let mut dp = DataParallel::new(comm, &mut store)?;
    let mut sampler = DistributedSampler::new(train.y.len(), global_batch, rank, size, seed + 1)?;
    let steps_per_epoch = sampler.batches_per_epoch();
    let total = steps_per_epoch * epochs;
    let schedule = CosineWarmup { base: 3e-3, min: 1e-5, warmup: steps_per_epoch, total };
    let mut opt = Adam::new(&store, schedule.lr(0))?;
    let mut state = TrainState::default();
    if let Some(path) = ckpt.as_ref().filter(|p| p.exists()) {
        state = checkpoint::load(&mut dp, path, &mut store, &mut opt)?;
        sampler.set_state(state.sampler)?;
    }
    let test_shard = DistributedSampler::new(test.y.len(), test.y.len(), rank, size, 0)?.sequential();
    let (test_x, test_y) = rows(&test, test_shard.shard(0))?;
    let mut grads = store.zeros_like()?;
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    if rank == 0 {
        println!(
            "digits on {size} rank(s): {} parameters, global batch {global_batch} ({} per rank), {epochs} epochs",
            store.numel(),
            global_batch.div_ceil(size)
        );
    }
    let (mut train_seconds, mut samples, mut steps) = (0.0f64, 0usize, 0usize);
    let mut accuracy = 0.0;
    while (state.step as usize) < total {
        let start = Instant::now();
        let (mut loss_sum, mut seen) = (0.0f64, 0usize);
        if sampler.state().batch >= steps_per_epoch {
            sampler.set_epoch(sampler.state().epoch + 1);
        }
        while let Some(shard) = sampler.next_shard() {
            let (x, y) = rows(&train, shard)?;
            let store_ref = &store;
            let reduced = dp.step(&mut grads, |g| {
                if y.is_empty() {
                    return Ok(0);
                }
                let loss = graph.scope(|s| {
                    let loss = model.forward(Ctx::train(s, store_ref), s.input(&x)).cross_entropy(&y);
                    s.backward_into(loss, g)?;
                    loss.item()
                })?;
                loss_sum += f64::from(loss) * y.len() as f64;
                seen += y.len();
                Ok::<_, tapir::Error>(y.len())
            })?;
            opt.set_lr(schedule.lr(state.step as usize));
            opt.step(&mut store, &grads)?;
            state.step += 1;
            samples += reduced.samples;
            steps += 1;
        }
        train_seconds += start.elapsed().as_secs_f64();
        // Test accuracy over every rank's shard of the test set, and the epoch's mean loss.
        let hits = graph.scope(|s| {
            let logits = model.forward(Ctx::eval(s, &store), s.input(&test_x));
            Ok::<_, tapir::Error>(logits.value()?.chunks(10).zip(&test_y).filter(|(r, &y)| argmax(r) == y).count())
        })?;
        let mut m = [hits as f64 / test_y.len().max(1) as f64];
        dp.mean_metrics(&mut m, test_y.len() as f64)?;
        accuracy = m[0];
        let mut l = [loss_sum / seen.max(1) as f64];
        dp.mean_metrics(&mut l, seen as f64)?;
        let epoch = sampler.state().epoch + 1;
        if rank == 0 && (epoch % 10 == 0 || epoch == 1) {
            println!("epoch {epoch:>3}: loss {:.4}, test accuracy {:.2}%", l[0], 100.0 * accuracy);
        }
    }
    if let Some(path) = &ckpt {
        state.sampler = sampler.state();
        checkpoint::save(&mut dp, path, &store, &opt, &state)?;
    }
    dp.check_in_sync(&store)?;
    if rank == 0 {
        println!(
            "world size {size}: test accuracy {:.2}% ({} of {}); {steps} steps in {train_seconds:.2} s: \
             {:.0} samples/s, {:.3} ms/step",
            100.0 * accuracy,
            (accuracy * test.y.len() as f64).round(),
            test.y.len(),
            samples as f64 / train_seconds,
            1e3 * train_seconds / steps.max(1) as f64
        );
    }
    Ok(())
}
