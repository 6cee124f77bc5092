//! A physics-informed network: a small tanh MLP `u(x)` in f64 trained so that
//! `u''(x) = f(x)` on `[0, 1]` with `u(0) = u(1) = 0`, for `f(x) = −π² sin(πx)`, whose
//! solution is `u(x) = sin(πx)`. The loss uses `d²u/dx²` through the network, taken in
//! forward mode, one [`Scope::jvp`](tapir::Scope::jvp) inside another with every point's
//! tangent 1 (the input is one number per point, so forward mode gives every point's
//! derivative in one pass); its gradient with respect to the weights (a third derivative
//! of the network) comes from `backward_into`. `--mode reverse` takes `u''` by
//! differentiating twice with [`Scope::grad`](tapir::Scope::grad) instead, for comparison.
//!
//! ```text
//! cargo run --release -p tapir-nn --example pinn      # under a second on 2 cores
//! ```
//!
//! Options: `--steps N` (default 6000), `--seed N` (weights; default 0), `--mode
//! forward|reverse` (how `u''` is taken; default forward), `--out DIR` (default
//! `target/pinn`). Prints the loss as it trains and the largest error against
//! `sin(πx)` on a 100-point grid (target below 1e-3), and writes `DIR/pinn.png` with the
//! network's `u` and the exact solution.
//!
//! The loss: `mean((u''(xᵢ) − f(xᵢ))²)` over 64 collocation points plus
//! `BOUNDARY · (u(0)² + u(1)²)`; Adam with a cosine-decayed learning rate.

use std::error::Error;
use std::path::{Path, PathBuf};
use std::time::Instant;

use rand::SeedableRng;
use tapir::{GradBuffer, Graph, ParamStore, Tensor, Var};
use tapir_nn::optim::{Adam, CosineWarmup, Optimizer, Schedule};
use tapir_nn::{Activation, Ctx, Init, Mlp, Module};

#[path = "common/font.rs"]
mod font;

type Result<T> = std::result::Result<T, Box<dyn Error>>;

const PI: f64 = std::f64::consts::PI;
/// Collocation points in `[0, 1]`.
const POINTS: usize = 64;
/// Weight of the boundary term.
const BOUNDARY: f64 = 10.0;
/// Hidden widths.
const WIDTH: usize = 24;

/// The right-hand side `f = u''` for the exact solution `u = sin(πx)`.
fn rhs(x: f64) -> f64 {
    -PI * PI * (PI * x).sin()
}

/// How `u''` is taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Forward over forward: `jvp(jvp(u))` with unit tangents.
    Forward,
    /// Reverse over reverse: `grad(Σ grad(Σ u))`, valid because each row of `u` depends
    /// only on the same row of `x`.
    Reverse,
}

/// `u''` at every row of `x` (`[n, 1]`), with `u` the network.
fn second_derivative<'s, 'g>(
    cx: Ctx<'s, 'g, f64>,
    model: &Mlp,
    x: Var<'s, f64>,
    mode: Mode,
) -> tapir::Result<Var<'s, f64>> {
    let s = cx.scope();
    Ok(match mode {
        Mode::Forward => {
            let ones = s.full(&x.shape().to_vec(), 1.0);
            // The outer level differentiates the inner level's tangent, u', once more.
            s.jvp([x], [ones], |[x]| s.jvp([x], [ones], |[x]| model.forward(cx, x)).1).1
        }
        Mode::Reverse => {
            let [du] = s.grad(model.forward(cx, x).sum(), [x])?;
            let [d2u] = s.grad(du.sum(), [x])?;
            d2u
        }
    })
}

/// The network and the training problem's fixed tensors.
struct Pinn {
    model: Mlp,
    store: ParamStore<f64>,
    /// Collocation points, `[POINTS, 1]`.
    x: Tensor<f64>,
    /// `f` at the collocation points.
    f: Tensor<f64>,
    /// `[[0], [1]]`.
    ends: Tensor<f64>,
    mode: Mode,
}

impl Pinn {
    fn new(seed: u64, points: usize, mode: Mode) -> tapir::Result<Pinn> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let mut store = ParamStore::new();
        let model = Mlp::builder(1)
            .hidden(WIDTH)
            .hidden(WIDTH)
            .activation(Activation::Tanh)
            .init(Init::LINEAR)
            .output(1)
            .build(&mut store, "u", &mut rng)?;
        // Midpoints of `points` equal cells: the ends are the boundary term's.
        let xs: Vec<f64> = (0..points).map(|i| (i as f64 + 0.5) / points as f64).collect();
        let f = xs.iter().map(|&x| rhs(x)).collect();
        Ok(Pinn {
            model,
            store,
            x: Tensor::from_vec(xs, &[points, 1])?,
            f: Tensor::from_vec(f, &[points, 1])?,
            ends: Tensor::from_vec(vec![0.0, 1.0], &[2, 1])?,
            mode,
        })
    }

    /// One loss evaluation; with `grads`, its gradient with respect to the weights is
    /// added there.
    fn loss(&self, graph: &mut Graph<f64>, grads: Option<&mut GradBuffer<f64>>) -> tapir::Result<f64> {
        graph.scope(|s| {
            let cx = Ctx::train(s, &self.store);
            let d2u = second_derivative(cx, &self.model, s.leaf(&self.x), self.mode)?;
            let residual = (d2u - s.input(&self.f)).square().mean();
            let ends = self.model.forward(cx, s.input(&self.ends)).square().sum();
            let loss = residual + ends * BOUNDARY;
            if let Some(grads) = grads {
                s.backward_into(loss, grads)?;
            }
            loss.item()
        })
    }

    /// `u` and `u''` at the points `xs`, `u''` taken as the loss takes it.
    fn eval(&self, graph: &mut Graph<f64>, xs: &[f64]) -> tapir::Result<(Vec<f64>, Vec<f64>)> {
        let x = Tensor::from_vec(xs.to_vec(), &[xs.len(), 1])?;
        graph.scope(|s| {
            let (cx, x) = (Ctx::eval(s, &self.store), s.leaf(&x));
            let u = self.model.forward(cx, x);
            let d2u = second_derivative(cx, &self.model, x, self.mode)?;
            Ok((u.value()?.to_vec(), d2u.value()?.to_vec()))
        })
    }

    /// `steps` Adam steps with a cosine-decayed rate from `lr`; returns the loss before
    /// each step, and calls `report` every 500 steps.
    fn train(
        &mut self,
        graph: &mut Graph<f64>,
        steps: usize,
        lr: f64,
        mut report: impl FnMut(usize, f64),
    ) -> tapir::Result<Vec<f64>> {
        let mut grads = self.store.zeros_like()?;
        let mut opt = Adam::new(&self.store, lr)?;
        let schedule = CosineWarmup { base: lr, min: lr * 1e-3, warmup: 0, total: steps };
        let mut history = Vec::with_capacity(steps);
        for step in 0..steps {
            grads.zero();
            let loss = self.loss(graph, Some(&mut grads))?;
            history.push(loss);
            if step % 500 == 0 {
                report(step, loss);
            }
            opt.set_lr(schedule.lr(step));
            opt.step(&mut self.store, &grads)?;
        }
        Ok(history)
    }
}

struct Args {
    steps: usize,
    seed: u64,
    mode: Mode,
    out: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut args = Args { steps: 6000, seed: 0, mode: Mode::Forward, out: PathBuf::from("target/pinn") };
    let mut it = std::env::args().skip(1);
    while let Some(a) = it.next() {
        let mut value = |name: &str| it.next().ok_or_else(|| format!("{name} needs a value"));
        match a.as_str() {
            "--steps" => args.steps = value("--steps")?.parse()?,
            "--seed" => args.seed = value("--seed")?.parse()?,
            "--out" => args.out = PathBuf::from(value("--out")?),
            "--mode" => {
                args.mode = match value("--mode")?.as_str() {
                    "forward" => Mode::Forward,
                    "reverse" => Mode::Reverse,
                    other => return Err(format!("--mode is forward or reverse, not {other:?}").into()),
                }
            }
            "--help" | "-h" => {
                println!("usage: pinn [--steps N] [--seed N] [--mode forward|reverse] [--out DIR]");
                std::process::exit(0);
            }
            other => return Err(format!("unknown argument {other:?} (try --help)").into()),
        }
    }
    Ok(args)
}

fn main() -> Result<()> {
    let args = parse_args()?;
    let mut pinn = Pinn::new(args.seed, POINTS, args.mode)?;
    let mut graph = Graph::<f64>::new();
    println!(
        "u'' = -π² sin(πx) on [0, 1], u(0) = u(1) = 0: MLP 1-{WIDTH}-{WIDTH}-1 (tanh, {} parameters), {POINTS} points, {} Adam steps, u'' in {:?} mode",
        pinn.store.numel(),
        args.steps,
        args.mode
    );
    let start = Instant::now();
    let history = pinn.train(&mut graph, args.steps, 1e-2, |step, loss| println!("step {step:>5}  loss {loss:.3e}"))?;
    let seconds = start.elapsed().as_secs_f64();
    let last = pinn.loss(&mut graph, None)?;
    println!(
        "step {:>5}  loss {last:.3e}  ({seconds:.1} s, {:.2} ms/step)",
        history.len(),
        1e3 * seconds / args.steps.max(1) as f64
    );
    let grid: Vec<f64> = (0..100).map(|i| i as f64 / 99.0).collect();
    let (u, _) = pinn.eval(&mut graph, &grid)?;
    let exact: Vec<f64> = grid.iter().map(|&x| (PI * x).sin()).collect();
    let err = u.iter().zip(&exact).map(|(a, b)| (a - b).abs()).fold(0.0, f64::max);
    println!("max |u − sin(πx)| on a 100-point grid: {err:.2e} (target < 1e-3)");
    std::fs::create_dir_all(&args.out)?;
    let path = args.out.join("pinn.png");
    plot(&grid, &u, &exact, &path)?;
    println!("wrote {}", path.display());
    if err >= 1e-3 {
        return Err(format!("max error {err:.2e} is not below 1e-3").into());
    }
    Ok(())
}

fn plot(grid: &[f64], u: &[f64], exact: &[f64], path: &Path) -> Result<()> {
    use plotters::prelude::*;
    let text = font::register_font();
    if !text {
        eprintln!("no TrueType font found: the plot has no labels");
    }
    let root = BitMapBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut builder = ChartBuilder::on(&root);
    builder.margin(15);
    if text {
        builder
            .caption("pinn: u'' = -π² sin(πx), u(0) = u(1) = 0", ("sans-serif", 22))
            .x_label_area_size(40)
            .y_label_area_size(50);
    } else {
        builder.x_label_area_size(5).y_label_area_size(5);
    }
    let mut chart = builder.build_cartesian_2d(0.0..1.0, -0.05..1.1)?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("x").y_desc("u");
    } else {
        mesh.x_labels(0).y_labels(0);
    }
    mesh.draw()?;
    let series = |ys: &[f64]| grid.iter().copied().zip(ys.iter().copied()).collect::<Vec<_>>();
    let exact_line = chart.draw_series(LineSeries::new(series(exact), BLACK.stroke_width(4)))?;
    if text {
        exact_line.label("sin(πx)").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], BLACK.stroke_width(4)));
    }
    let net = chart.draw_series(LineSeries::new(series(u), RED.stroke_width(2)))?;
    if text {
        net.label("network u(x)").legend(|(x, y)| PathElement::new([(x, y), (x + 20, y)], RED.stroke_width(2)));
        chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    }
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `u''` in both modes equals the central second difference of the network's own
    /// output, `(u(x+h) − 2u(x) + u(x−h))/h²`.
    #[test]
    fn second_derivative_matches_finite_differences() {
        for mode in [Mode::Forward, Mode::Reverse] {
            let pinn = Pinn::new(3, 8, mode).unwrap();
            let mut graph = Graph::<f64>::new();
            let xs = [0.0, 0.13, 0.5, 0.77, 1.0];
            let (_, d2u) = pinn.eval(&mut graph, &xs).unwrap();
            let h = 1e-4;
            for (i, &x) in xs.iter().enumerate() {
                let (u, _) = pinn.eval(&mut graph, &[x - h, x, x + h]).unwrap();
                let numeric = (u[2] - 2.0 * u[1] + u[0]) / (h * h);
                let err = (d2u[i] - numeric).abs();
                assert!(err <= 1e-5 * numeric.abs().max(1.0), "{mode:?}, x = {x}: {} vs {numeric}", d2u[i]);
            }
        }
    }

    /// The two modes' losses and weight gradients agree.
    #[test]
    fn forward_and_reverse_losses_and_gradients_agree() {
        let mut graph = Graph::<f64>::new();
        let run = |mode, graph: &mut Graph<f64>| {
            let pinn = Pinn::new(5, 8, mode).unwrap();
            let mut grads = pinn.store.zeros_like().unwrap();
            let loss = pinn.loss(graph, Some(&mut grads)).unwrap();
            let flat: Vec<f64> = grads.iter().flat_map(|(_, g)| g.data().to_vec()).collect();
            (loss, flat)
        };
        let (lf, gf) = run(Mode::Forward, &mut graph);
        let (lr, gr) = run(Mode::Reverse, &mut graph);
        assert!((lf - lr).abs() <= 1e-10 * lr.abs(), "{lf} vs {lr}");
        for (a, b) in gf.iter().zip(&gr) {
            assert!((a - b).abs() <= 1e-9 * (1.0 + b.abs()), "{a} vs {b}");
        }
    }

    /// A few hundred steps on a small problem lower the loss by a large factor.
    #[test]
    fn training_lowers_the_loss() {
        let mut pinn = Pinn::new(0, 16, Mode::Forward).unwrap();
        let mut graph = Graph::<f64>::new();
        let history = pinn.train(&mut graph, 300, 1e-2, |_, _| {}).unwrap();
        let (first, last) = (history[0], pinn.loss(&mut graph, None).unwrap());
        assert!(last < first / 20.0, "loss {first} -> {last}");
    }
}
