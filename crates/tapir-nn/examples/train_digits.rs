//! Trains a classifier on scikit-learn's 8x8 handwritten digits (1,797 images, 10
//! classes), shipped compressed in `crates/tapir-nn/data/`.
//!
//! ```text
//! cargo run --release --example train_digits               # MLP 64-256-128-10
//! cargo run --release --example train_digits -- --cnn      # a small CNN
//! ```
//!
//! Options: `--epochs N`, `--seed N` (initial weights and batch order; default 0),
//! `--out DIR` (default `target/train_digits`), `--threads N`
//! (matrix-product threads, default 1: these matrices are too small to share),
//! `--dot` (also write one training step's graph in Graphviz DOT and print its memory
//! report).
//!
//! The split is fixed: every fifth image (index ≡ 4 mod 5) is a test image, which gives
//! 1,438 training and 359 test images. The run shows a progress bar with the loss and
//! accuracy, writes the loss and accuracy curves to `DIR/digits_{mlp,cnn}.png`, saves the
//! weights to `DIR/digits_{mlp,cnn}.safetensors`, reloads them into a freshly initialised
//! model and checks that the test accuracy and every logit are identical.

use std::error::Error;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::seq::SliceRandom;
use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::optim::{Adam, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{io, Activation, Conv2d, Ctx, Flatten, Linear, MaxPool2d, Mlp, Module, Sequential};

#[path = "common/font.rs"]
mod font;
use font::register_font;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const DIGITS: &[u8] = include_bytes!("../data/digits.csv.gz");
const BATCH: usize = 32;
const PIXELS: usize = 64;

/// Images scaled to `[0, 1]`, `[n, 64]`, and their labels.
struct Split {
    x: Vec<f32>,
    y: Vec<usize>,
}

impl Split {
    fn len(&self) -> usize {
        self.y.len()
    }
}

fn load_digits() -> Result<(Split, Split)> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(DIGITS).read_to_string(&mut text)?;
    let (mut train, mut test) = (Split { x: vec![], y: vec![] }, Split { x: vec![], y: vec![] });
    for (i, line) in text.lines().enumerate() {
        let fields: Vec<u32> = line.split(',').map(str::parse).collect::<std::result::Result<_, _>>()?;
        if fields.len() != PIXELS + 1 || fields[0] > 9 || fields[1..].iter().any(|&p| p > 16) {
            return Err(format!("digits.csv line {}: expected a label 0-9 and 64 pixels 0-16", i + 1).into());
        }
        let split = if i % 5 == 4 { &mut test } else { &mut train };
        split.y.push(fields[0] as usize);
        split.x.extend(fields[1..].iter().map(|&p| p as f32 / 16.0));
    }
    Ok((train, test))
}

struct Args {
    cnn: bool,
    epochs: usize,
    out: PathBuf,
    threads: usize,
    seed: u64,
    dot: bool,
}

fn parse_args() -> Result<Args> {
    let mut args =
        Args { cnn: false, epochs: 0, out: PathBuf::from("target/train_digits"), threads: 1, seed: 0, dot: false };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--cnn" => args.cnn = true,
            "--dot" => args.dot = true,
            "--epochs" => args.epochs = value("--epochs")?.parse()?,
            "--threads" => args.threads = value("--threads")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--out" => args.out = PathBuf::from(value("--out")?),
            "-h" | "--help" => {
                println!("usage: train_digits [--cnn] [--epochs N] [--seed N] [--out DIR] [--threads N] [--dot]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help").into()),
        }
    }
    if args.epochs == 0 {
        args.epochs = if args.cnn { 25 } else { 40 };
    }
    Ok(args)
}

/// The model, its parameters and the shape one batch of images takes.
fn build(cnn: bool, seed: u64) -> Result<(Box<dyn Module<f32>>, ParamStore<f32>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut store = ParamStore::new();
    let model: Box<dyn Module<f32>> = if cnn {
        // [B, 1, 8, 8] → conv 3×3 → [B, 16, 8, 8] → pool → [B, 16, 4, 4] → conv 3×3 →
        // [B, 32, 4, 4] → pool → [B, 32, 2, 2] → flatten → [B, 128] → [B, 10].
        Box::new(
            Sequential::new()
                .push(Conv2d::new(&mut store, "conv1", 1, 16, [3, 3], &mut rng)?.padding([1, 1]))
                .push(Activation::Relu)
                .push(MaxPool2d::new(2))
                .push(Conv2d::new(&mut store, "conv2", 16, 32, [3, 3], &mut rng)?.padding([1, 1]))
                .push(Activation::Relu)
                .push(MaxPool2d::new(2))
                .push(Flatten)
                .push(Linear::new(&mut store, "fc", 128, 10, &mut rng)?),
        )
    } else {
        Box::new(Mlp::builder(PIXELS).hidden(256).hidden(128).output(10).build(&mut store, "mlp", &mut rng)?)
    };
    Ok((model, store))
}

fn batch_dims(cnn: bool, n: usize) -> Vec<usize> {
    if cnn {
        vec![n, 1, 8, 8]
    } else {
        vec![n, PIXELS]
    }
}

fn argmax(row: &[f32]) -> usize {
    row.iter().enumerate().fold(0, |best, (j, &v)| if v > row[best] { j } else { best })
}

/// Test loss, accuracy and every logit, in evaluation mode.
fn evaluate(
    graph: &mut Graph<f32>,
    model: &dyn Module<f32>,
    store: &ParamStore<f32>,
    images: &Tensor<f32>,
    labels: &[usize],
) -> Result<(f32, f64, Vec<f32>)> {
    Ok(graph.scope(|s| {
        let logits = model.forward(Ctx::eval(s, store), s.input(images));
        let loss = logits.cross_entropy(labels).item()?;
        let values = logits.value()?;
        let correct = values.chunks(10).zip(labels).filter(|(row, &y)| argmax(row) == y).count();
        Ok::<_, tapir::Error>((loss, correct as f64 / labels.len() as f64, values.to_vec()))
    })?)
}

/// Per-epoch curves.
#[derive(Default)]
struct History {
    train_loss: Vec<f32>,
    test_loss: Vec<f32>,
    train_acc: Vec<f64>,
    test_acc: Vec<f64>,
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // The calling thread joins rayon's pool, so each split runs on `--threads` threads.
    let threads = tapir::init_threads(args.threads)?;
    let name = if args.cnn { "cnn" } else { "mlp" };
    let (train, test) = load_digits()?;
    println!(
        "digits: {} training and {} test images; model: {name}; {} epochs of batches of {BATCH}",
        train.len(),
        test.len(),
        args.epochs
    );
    let (model, mut store) = build(args.cnn, args.seed)?;
    println!("{} parameters in {} tensors", store.numel(), store.len());

    let test_x = Tensor::from_slice(&test.x, &batch_dims(args.cnn, test.len()))?;
    let mut batch_x = Tensor::<f32>::zeros(&batch_dims(args.cnn, BATCH))?;
    let mut batch_y = vec![0usize; BATCH];
    let steps_per_epoch = train.len() / BATCH;
    let total = steps_per_epoch * args.epochs;
    let schedule = CosineWarmup { base: 3e-3, min: 1e-5, warmup: steps_per_epoch, total };
    let mut opt = Adam::new(&store, schedule.lr(0))?;
    let mut grads = store.zeros_like()?;
    let mut graph = Graph::<f32>::new();
    graph.set_threads(threads);
    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed.wrapping_add(1));
    let mut order: Vec<usize> = (0..train.len()).collect();
    let mut history = History::default();

    let bar = ProgressBar::new(total as u64)
        .with_style(ProgressStyle::with_template("{elapsed_precise} [{bar:30.cyan/blue}] epoch {msg}")?);
    let start = Instant::now();
    let mut step = 0;
    for epoch in 0..args.epochs {
        order.shuffle(&mut rng);
        let (mut loss_sum, mut correct) = (0.0f32, 0usize);
        for chunk in order.chunks_exact(BATCH) {
            for (k, &i) in chunk.iter().enumerate() {
                batch_x.data_mut()[k * PIXELS..(k + 1) * PIXELS]
                    .copy_from_slice(&train.x[i * PIXELS..(i + 1) * PIXELS]);
                batch_y[k] = train.y[i];
            }
            grads.zero();
            let (x, y, want_dot) = (&batch_x, &batch_y, args.dot && step == 0);
            let (loss, hits) = graph.scope(|s| {
                let logits = model.forward(Ctx::train(s, &store), s.input(x));
                let loss = logits.cross_entropy(y);
                s.backward_into(loss, &mut grads)?;
                if want_dot {
                    write_dot(s.to_dot(), &args.out, name);
                    println!("memory of one training step:\n{}", s.memory_report());
                }
                let hits = logits.value()?.chunks(10).zip(y).filter(|(row, &y)| argmax(row) == y).count();
                Ok::<_, tapir::Error>((loss.item()?, hits))
            })?;
            opt.set_lr(schedule.lr(step));
            opt.step(&mut store, &grads)?;
            loss_sum += loss;
            correct += hits;
            step += 1;
            bar.inc(1);
        }
        let (test_loss, test_acc) = {
            let (l, a, _) = evaluate(&mut graph, model.as_ref(), &store, &test_x, &test.y)?;
            (l, a)
        };
        history.train_loss.push(loss_sum / steps_per_epoch as f32);
        history.train_acc.push(correct as f64 / (steps_per_epoch * BATCH) as f64);
        history.test_loss.push(test_loss);
        history.test_acc.push(test_acc);
        bar.set_message(format!(
            "{}/{}: loss {:.4}, train accuracy {:.1}%, test accuracy {:.2}%",
            epoch + 1,
            args.epochs,
            loss_sum / steps_per_epoch as f32,
            100.0 * correct as f64 / (steps_per_epoch * BATCH) as f64,
            100.0 * test_acc
        ));
    }
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    let (_, accuracy, logits) = evaluate(&mut graph, model.as_ref(), &store, &test_x, &test.y)?;
    println!(
        "trained {step} steps in {seconds:.2} s; test accuracy {:.2}% ({} of {})",
        100.0 * accuracy,
        (accuracy * test.len() as f64).round(),
        test.len()
    );

    std::fs::create_dir_all(&args.out)?;
    let plot = args.out.join(format!("digits_{name}.png"));
    plot_history(&history, &plot, name)?;
    println!("wrote {}", plot.display());

    let ckpt = args.out.join(format!("digits_{name}.safetensors"));
    io::save(&store, &ckpt)?;
    // A model with other initial weights, then the checkpoint: it must agree exactly.
    let (reloaded_model, mut reloaded) = build(args.cnn, args.seed.wrapping_add(12345))?;
    io::load(&mut reloaded, &ckpt)?;
    let (_, reloaded_accuracy, reloaded_logits) =
        evaluate(&mut graph, reloaded_model.as_ref(), &reloaded, &test_x, &test.y)?;
    if reloaded_accuracy != accuracy || reloaded_logits != logits {
        return Err(format!("reloaded accuracy {reloaded_accuracy} differs from {accuracy}").into());
    }
    println!("saved {} and reloaded it: test accuracy {:.2}%, identical", ckpt.display(), 100.0 * reloaded_accuracy);
    Ok(())
}

fn write_dot(dot: String, out: &Path, name: &str) {
    let path = out.join(format!("digits_{name}_step.dot"));
    match std::fs::create_dir_all(out).and_then(|()| std::fs::write(&path, dot)) {
        Ok(()) => println!("wrote {} (render with `dot -Tsvg`)", path.display()),
        Err(e) => eprintln!("cannot write {}: {e}", path.display()),
    }
}

fn plot_history(h: &History, path: &Path, name: &str) -> Result<()> {
    use plotters::prelude::*;
    let text = register_font();
    if !text {
        eprintln!("no TrueType font found: the plot has no labels");
    }
    let root = BitMapBackend::new(path, (1100, 420)).into_drawing_area();
    root.fill(&WHITE)?;
    let (left, right) = root.split_horizontally(550);
    let epochs = h.train_loss.len() as f64;
    let xs = |v: &[f64]| v.iter().enumerate().map(|(i, &y)| ((i + 1) as f64, y)).collect::<Vec<_>>();
    let as64 = |v: &[f32]| v.iter().map(|&x| f64::from(x)).collect::<Vec<_>>();
    let max_loss = h.train_loss.iter().chain(&h.test_loss).fold(0.0f32, |m, &v| m.max(v)) as f64 * 1.05;
    let min_acc = h.train_acc.iter().chain(&h.test_acc).fold(1.0f64, |m, &v| m.min(v)).min(0.9);
    let panels = [
        ("cross-entropy loss", 0.0..max_loss.max(1e-3), [(as64(&h.train_loss), "train"), (as64(&h.test_loss), "test")]),
        ("accuracy", min_acc..1.0, [(h.train_acc.clone(), "train"), (h.test_acc.clone(), "test")]),
    ];
    for (area, (title, range, series)) in [left, right].iter().zip(panels) {
        let mut builder = ChartBuilder::on(area);
        builder.margin(15);
        if text {
            builder
                .caption(format!("digits {name}: {title}"), ("sans-serif", 22))
                .x_label_area_size(40)
                .y_label_area_size(60);
        } else {
            builder.x_label_area_size(5).y_label_area_size(5);
        }
        let mut chart = builder.build_cartesian_2d(1.0..epochs.max(2.0), range)?;
        let mut mesh = chart.configure_mesh();
        if text {
            mesh.x_desc("epoch").y_desc(title);
        } else {
            mesh.x_labels(0).y_labels(0);
        }
        mesh.draw()?;
        for ((points, label), color) in series.into_iter().zip([BLUE, RED]) {
            let drawn = chart.draw_series(LineSeries::new(xs(&points), color.stroke_width(2)))?;
            if text {
                drawn.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
            }
        }
        if text {
            chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
        }
    }
    root.present()?;
    Ok(())
}
