//! Trains a GPT-style character-level language model on about 1 MB of English prose and
//! verse (fortune-cookie quotations from Debian's `fortunes` packages, shipped compressed
//! in `examples/chars/`; see the README there for origin, licence and extraction).
//!
//! ```text
//! cargo run --release --example train_chars                 # ~2 minutes on 2 cores
//! cargo run --release --example train_chars -- --steps 3000 # longer, better samples
//! ```
//!
//! Options: `--steps N` (default 200), `--seed N` (weights, batches, dropout; default 0),
//! `--threads N` (matrix-product threads, default 2), `--eval-every N` (default 25),
//! `--out DIR` (default `target/train_chars`), `--temperature T` (default 0.8), `--memory` (print the first step's
//! memory report).
//!
//! The model: 4 pre-norm blocks of width 128 with 4 heads, context 64, vocabulary 96
//! (newline and printable ASCII), output projection tied to the token embedding: 814k
//! parameters. AdamW (β = 0.9, 0.95, weight decay 0.01) with a linear warm-up over 20
//! steps and a cosine decay, gradients clipped to norm 1, batches of 32 random windows.
//!
//! The first 90% of the text trains, the last 10% validates (split by position). The run
//! prints the validation text's unigram entropy and bigram cross-entropy, both from
//! training-set counts, next to the model's validation loss (all in nats per character),
//! writes the train and validation loss curves to `DIR/chars_loss.png`, saves the
//! weights to `DIR/chars.safetensors`, reloads them into a freshly initialised model
//! (checking that every validation logit is identical) and prints a 300-character sample
//! drawn with temperature sampling from a fixed seed.

use std::error::Error;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Instant;

use indicatif::{ProgressBar, ProgressStyle};
use rand::{RngExt, SeedableRng};
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::optim::{clip_grad_norm, AdamW, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{io, Ctx, Gpt, GptConfig};

#[path = "common/font.rs"]
mod font;
use font::register_font;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const TEXT: &[u8] = include_bytes!("chars/fortunes.txt.gz");
/// Newline, then the 95 printable ASCII characters.
const VOCAB: usize = 96;
const CONFIG: GptConfig = GptConfig { vocab: VOCAB, context: 64, dim: 128, heads: 4, layers: 4 };
const BATCH: usize = 32;
/// Windows of the validation text per evaluation batch.
const EVAL_BATCH: usize = 64;

fn encode(c: u8) -> Option<usize> {
    match c {
        b'\n' => Some(0),
        b' '..=b'~' => Some(usize::from(c - b' ') + 1),
        _ => None,
    }
}

fn decode(t: usize) -> char {
    if t == 0 {
        '\n'
    } else {
        char::from(b' ' + (t - 1) as u8)
    }
}

fn load_text() -> Result<Vec<usize>> {
    let mut bytes = Vec::new();
    flate2::read::GzDecoder::new(TEXT).read_to_end(&mut bytes)?;
    bytes.iter().map(|&c| encode(c).ok_or_else(|| format!("byte {c} is outside the vocabulary").into())).collect()
}

struct Args {
    steps: usize,
    seed: u64,
    threads: usize,
    eval_every: usize,
    out: PathBuf,
    temperature: f64,
    memory: bool,
}

fn parse_args() -> Result<Args> {
    let mut args = Args {
        steps: 200,
        seed: 0,
        threads: 2,
        eval_every: 25,
        out: PathBuf::from("target/train_chars"),
        temperature: 0.8,
        memory: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--steps" => args.steps = value("--steps")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--threads" => args.threads = value("--threads")?.parse()?,
            "--eval-every" => args.eval_every = value("--eval-every")?.parse()?,
            "--out" => args.out = PathBuf::from(value("--out")?),
            "--temperature" => args.temperature = value("--temperature")?.parse()?,
            "--memory" => args.memory = true,
            "-h" | "--help" => {
                println!(
                    "usage: train_chars [--steps N] [--seed N] [--threads N] [--eval-every N] [--out DIR] [--temperature T] [--memory]"
                );
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?}; try --help").into()),
        }
    }
    if args.steps == 0
        || args.threads == 0
        || args.eval_every == 0
        || args.temperature.is_nan()
        || args.temperature <= 0.0
    {
        return Err("--steps, --threads, --eval-every and --temperature must be positive".into());
    }
    Ok(args)
}

/// Unigram entropy and bigram cross-entropy of `val` in nats per character, with
/// probabilities from `train`'s counts (add-one smoothing for the unigram, add-α with
/// α = 0.1 for the bigram, so that unseen pairs have a finite cost).
fn baselines(train: &[usize], val: &[usize]) -> (f64, f64) {
    let mut uni = [0f64; VOCAB];
    let mut bi = vec![[0f64; VOCAB]; VOCAB];
    for &t in train {
        uni[t] += 1.0;
    }
    for w in train.windows(2) {
        bi[w[0]][w[1]] += 1.0;
    }
    let total = train.len() as f64 + VOCAB as f64;
    let unigram = -val.iter().map(|&t| ((uni[t] + 1.0) / total).ln()).sum::<f64>() / val.len() as f64;
    const ALPHA: f64 = 0.1;
    let bigram = -val
        .windows(2)
        .map(|w| {
            let row = &bi[w[0]];
            ((row[w[1]] + ALPHA) / (row.iter().sum::<f64>() + ALPHA * VOCAB as f64)).ln()
        })
        .sum::<f64>()
        / (val.len() - 1) as f64;
    (unigram, bigram)
}

/// Non-overlapping windows of `val`: inputs and next-character targets, `EVAL_BATCH`
/// windows per batch (the last partial batch is dropped).
fn eval_batches(val: &[usize]) -> Vec<(Vec<usize>, Vec<usize>)> {
    let t = CONFIG.context;
    let windows = (val.len() - 1) / t;
    (0..windows / EVAL_BATCH)
        .map(|b| {
            let start = b * EVAL_BATCH * t;
            let x = val[start..start + EVAL_BATCH * t].to_vec();
            let y = val[start + 1..start + EVAL_BATCH * t + 1].to_vec();
            (x, y)
        })
        .collect()
}

/// Mean loss over `batches` in evaluation mode, without recording gradients, and the
/// logits of the first batch.
fn evaluate(
    graph: &mut Graph<f32>,
    model: &Gpt,
    store: &ParamStore<f32>,
    batches: &[(Vec<usize>, Vec<usize>)],
) -> Result<(f64, Vec<f32>)> {
    let mut sum = 0.0;
    let mut first = Vec::new();
    for (i, (x, y)) in batches.iter().enumerate() {
        let (loss, logits) = graph.scope(|s| {
            s.no_grad(|| {
                let (loss, logits) = model.loss(Ctx::eval(s, store), x, y, CONFIG.context);
                let logits = if i == 0 { logits.value()?.to_vec() } else { Vec::new() };
                Ok::<_, tapir::Error>((loss.item()?, logits))
            })
        })?;
        sum += f64::from(loss);
        if i == 0 {
            first = logits;
        }
    }
    Ok((sum / batches.len() as f64, first))
}

/// `len` characters drawn one at a time from `softmax(logits/temperature)` at the last
/// position, the context being the last (up to 64) characters, starting from a newline.
fn sample(
    graph: &mut Graph<f32>,
    model: &Gpt,
    store: &ParamStore<f32>,
    len: usize,
    temperature: f64,
    seed: u64,
) -> Result<String> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut tokens = vec![0usize];
    let mut text = String::new();
    for _ in 0..len {
        let window = &tokens[tokens.len().saturating_sub(CONFIG.context)..];
        let probs = graph.scope(|s| {
            s.no_grad(|| {
                let logits = model.forward(Ctx::eval(s, store), window, window.len());
                let last = logits.narrow(1, window.len() - 1, 1).reshape(&[VOCAB]);
                last.mul_scalar(1.0 / temperature as f32).softmax(-1).to_tensor()
            })
        })?;
        let u: f32 = rng.random();
        let mut acc = 0.0;
        let mut next = VOCAB - 1;
        for (k, &p) in probs.data().iter().enumerate() {
            acc += p;
            if u < acc {
                next = k;
                break;
            }
        }
        tokens.push(next);
        text.push(decode(next));
    }
    Ok(text)
}

#[derive(Default)]
struct History {
    /// (step, mean training loss since the last point).
    train: Vec<(f64, f64)>,
    /// (step, validation loss).
    val: Vec<(f64, f64)>,
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // The calling thread joins rayon's pool, so each split runs on `--threads` threads.
    let threads = tapir::init_threads(args.threads)?;
    let text = load_text()?;
    let split = text.len() * 9 / 10;
    let (train, val) = text.split_at(split);
    let (unigram, bigram) = baselines(train, val);
    println!(
        "text: {} characters, {} for training, {} for validation; vocabulary {VOCAB}",
        text.len(),
        train.len(),
        val.len()
    );
    println!(
        "validation baselines from training counts: unigram entropy {unigram:.4}, bigram cross-entropy {bigram:.4} nats/char"
    );

    let mut rng = rand::rngs::StdRng::seed_from_u64(args.seed);
    let mut store = ParamStore::<f32>::new();
    let model = Gpt::new(&mut store, CONFIG, &mut rng)?;
    println!(
        "model: {} layers, {} heads, width {}, context {}, tied output: {} parameters; {} steps of {BATCH}×{} tokens, {} threads",
        CONFIG.layers,
        CONFIG.heads,
        CONFIG.dim,
        CONFIG.context,
        store.numel(),
        args.steps,
        CONFIG.context,
        args.threads
    );
    let schedule = CosineWarmup { base: 3e-3, min: 1e-4, warmup: 20.min(args.steps / 5 + 1), total: args.steps };
    let mut opt = AdamW::new(&store, schedule.lr(0), 0.01)?.betas(0.9, 0.95)?;
    let mut grads = store.zeros_like()?;
    let mut graph = Graph::<f32>::new();
    graph.set_threads(threads);
    let evals = eval_batches(val);
    // Periodic evaluations use the first 8 batches (32k characters); the final one all.
    let quick = &evals[..evals.len().min(8)];

    let t = CONFIG.context;
    let (mut x, mut y) = (vec![0usize; BATCH * t], vec![0usize; BATCH * t]);
    let mut history = History::default();
    let bar = ProgressBar::new(args.steps as u64)
        .with_style(ProgressStyle::with_template("{elapsed_precise} [{bar:30.cyan/blue}] {pos}/{len} {msg}")?);
    let start = Instant::now();
    let (mut loss_sum, mut loss_count) = (0.0f64, 0usize);
    let mut last_val = f64::NAN;
    for step in 0..args.steps {
        for b in 0..BATCH {
            let at = rng.random_range(0..train.len() - t - 1);
            x[b * t..(b + 1) * t].copy_from_slice(&train[at..at + t]);
            y[b * t..(b + 1) * t].copy_from_slice(&train[at + 1..at + t + 1]);
        }
        grads.zero();
        let report = args.memory && step == 0;
        let loss = graph.scope(|s| {
            let (loss, _) = model.loss(Ctx::train(s, &store), &x, &y, t);
            s.backward_into(loss, &mut grads)?;
            if report {
                bar.suspend(|| println!("memory of one training step:\n{}", s.memory_report()));
            }
            loss.item()
        })?;
        clip_grad_norm(&store, &mut grads, 1.0)?;
        opt.set_lr(schedule.lr(step));
        opt.step(&mut store, &grads)?;
        loss_sum += f64::from(loss);
        loss_count += 1;
        if (step + 1) % args.eval_every == 0 || step + 1 == args.steps {
            history.train.push(((step + 1) as f64, loss_sum / loss_count as f64));
            (loss_sum, loss_count) = (0.0, 0);
            last_val = evaluate(&mut graph, &model, &store, quick)?.0;
            history.val.push(((step + 1) as f64, last_val));
        }
        let tokens_per_s = ((step + 1) * BATCH * t) as f64 / start.elapsed().as_secs_f64();
        bar.set_message(format!("loss {loss:.3}, val {last_val:.3}, {tokens_per_s:.0} tokens/s"));
        bar.inc(1);
    }
    bar.finish();
    let seconds = start.elapsed().as_secs_f64();
    println!(
        "trained {} steps in {seconds:.1} s: {:.1} ms/step, {:.0} tokens/s",
        args.steps,
        1e3 * seconds / args.steps as f64,
        (args.steps * BATCH * t) as f64 / seconds
    );
    let (val_loss, logits) = evaluate(&mut graph, &model, &store, &evals)?;
    println!(
        "validation ({} characters): model {val_loss:.4}, bigram {bigram:.4}, unigram {unigram:.4} nats/char",
        evals.len() * EVAL_BATCH * t
    );
    if val_loss >= bigram {
        return Err(format!("the model ({val_loss:.4}) did not beat the bigram baseline ({bigram:.4})").into());
    }

    std::fs::create_dir_all(&args.out)?;
    let plot = args.out.join("chars_loss.png");
    plot_history(&history, bigram, &plot)?;
    println!("wrote {}", plot.display());
    let ckpt = args.out.join("chars.safetensors");
    io::save(&store, &ckpt)?;
    let mut fresh = ParamStore::<f32>::new();
    let reloaded = Gpt::new(&mut fresh, CONFIG, &mut rand::rngs::StdRng::seed_from_u64(args.seed.wrapping_add(999)))?;
    io::load(&mut fresh, &ckpt)?;
    let (_, reloaded_logits) = evaluate(&mut graph, &reloaded, &fresh, &evals[..1])?;
    if reloaded_logits != logits {
        return Err("the reloaded model's logits differ".into());
    }
    println!("saved {} and reloaded it into a fresh model: identical validation logits", ckpt.display());
    write_interop_check(&mut graph, &reloaded, &fresh, &evals[0].0[..2 * t], &args.out)?;

    let text = sample(&mut graph, &reloaded, &fresh, 300, args.temperature, 1234)?;
    println!("sample (temperature {}, seed 1234):\n----\n{text}\n----", args.temperature);
    Ok(())
}

/// Writes `DIR/chars_check.safetensors`: two windows of tokens (as `f32`, `[2, 64]`) and
/// the model's logits for them (`[2, 64, 96]`), for `examples/chars/gpt_torch.py`.
fn write_interop_check(
    graph: &mut Graph<f32>,
    model: &Gpt,
    store: &ParamStore<f32>,
    tokens: &[usize],
    out: &Path,
) -> Result<()> {
    let t = CONFIG.context;
    let logits = graph.scope(|s| s.no_grad(|| model.forward(Ctx::eval(s, store), tokens, t).to_tensor()))?;
    let ids = Tensor::from_vec(tokens.iter().map(|&k| k as f32).collect(), &[tokens.len() / t, t])?;
    let path = out.join("chars_check.safetensors");
    std::fs::write(&path, io::write_checkpoint(&[("tokens", &ids), ("logits", &logits)])?)?;
    println!(
        "wrote {} (check with `python3 crates/tapir-nn/examples/chars/gpt_torch.py {}`)",
        path.display(),
        out.display()
    );
    Ok(())
}

fn plot_history(h: &History, bigram: f64, path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let text = register_font();
    if !text {
        eprintln!("no TrueType font found: the plot has no labels");
    }
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let last = h.train.last().map_or(1.0, |p| p.0);
    let top = h.train.iter().chain(&h.val).fold(bigram, |m, p| m.max(p.1)) * 1.05;
    let bottom = h.train.iter().chain(&h.val).fold(bigram, |m, p| m.min(p.1)) * 0.95;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if text {
        builder
            .caption("train_chars: loss (nats/char)", ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(60);
    } else {
        builder.x_label_area_size(5).y_label_area_size(5);
    }
    let mut chart = builder.build_cartesian_2d(0.0..last, bottom..top)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step").y_desc("cross-entropy");
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    let baseline = vec![(0.0, bigram), (last, bigram)];
    for (points, label, color) in
        [(h.train.clone(), "train", BLUE), (h.val.clone(), "validation", RED), (baseline, "bigram", BLACK)]
    {
        let drawn = chart.draw_series(LineSeries::new(points, color.stroke_width(2)))?;
        if text {
            drawn.label(label).legend(move |(x, y)| PathElement::new([(x, y), (x + 20, y)], color.stroke_width(2)));
        }
    }
    if text {
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}
