//! The per-op profile (`Graph::set_profiling`, `Graph::profile`): exact counts for small
//! known programs, rows that add up to the total, nothing counted while it is off, and the
//! same results bit for bit with it on and off.

use std::time::Duration;

use rand::SeedableRng;
use tapir::{Checkpoint, GradBuffer, Graph, OpTime, ParamId, ParamStore, Profile, Scope, Tensor, Var};

/// `(calls, backward calls)` per op name.
fn counts(p: &Profile) -> Vec<(&'static str, u64, u64)> {
    let mut v: Vec<_> = p.ops.iter().map(|o| (o.op, o.calls, o.backward_calls)).collect();
    v.sort();
    v
}

fn row<'p>(p: &'p Profile, op: &str) -> &'p OpTime {
    p.ops.iter().find(|o| o.op == op).unwrap_or_else(|| panic!("no {op} row in\n{p}"))
}

/// `sum(tanh(tanh(tanh(x))) · w)` with `x` a variable and `w` an input.
fn small_program(g: &mut Graph<f64>, x: &Tensor<f64>, w: &Tensor<f64>) -> Vec<f64> {
    g.scope(|s| {
        let x = s.leaf(x);
        let y = x.tanh().tanh().tanh().matmul(s.input(w)).sum();
        s.backward(y).unwrap();
        x.grad().unwrap().to_vec()
    })
}

fn operands() -> (Tensor<f64>, Tensor<f64>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    (Tensor::normal(&[4, 5], 0.0, 1.0, &mut rng).unwrap(), Tensor::normal(&[5, 3], 0.0, 1.0, &mut rng).unwrap())
}

#[test]
fn counts_are_exact_and_add_up_across_scopes() {
    let (x, w) = operands();
    let mut g = Graph::<f64>::new();
    g.set_profiling(true);
    small_program(&mut g, &x, &w);
    let p = g.profile();
    // Forward: the variable, the input (a leaf), 3 tanh, the product, the sum. Backward
    // visits every node that needs a gradient: not the input.
    let once = [("leaf", 1, 0), ("matmul", 1, 1), ("sum", 1, 1), ("tanh", 3, 3), ("variable", 1, 1)];
    assert_eq!(counts(&p), once, "\n{p}");
    small_program(&mut g, &x, &w);
    let p = g.profile();
    let twice: Vec<_> = once.iter().map(|&(op, c, b)| (op, 2 * c, 2 * b)).collect();
    assert_eq!(counts(&p), twice, "profiles add up until reset\n{p}");

    assert_eq!(p.total(), p.ops.iter().map(OpTime::total).sum::<Duration>());
    assert_eq!(p.total(), p.forward() + p.backward());
    assert!(p.total() > Duration::ZERO);
    for o in &p.ops {
        assert!(o.gemm <= o.total(), "{o:?}");
        if o.op != "matmul" {
            assert_eq!(o.gemm, Duration::ZERO, "only products count as GEMM: {o:?}");
        }
    }
    assert!(row(&p, "matmul").gemm > Duration::ZERO);
    assert!(p.ops.windows(2).all(|w| w[0].total() >= w[1].total()), "most time first\n{p}");

    let table = p.to_string();
    assert_eq!(table.lines().count(), p.ops.len() + 2, "a header, one line per kind, the total:\n{table}");
    assert!(table.lines().last().unwrap().starts_with("total") && table.contains("100.0%"), "{table}");

    g.reset_profile();
    assert!(g.profile().is_empty());
    small_program(&mut g, &x, &w);
    assert_eq!(counts(&g.profile()), once, "profiling stays on after a reset");
}

#[test]
fn nothing_is_counted_while_profiling_is_off() {
    let (x, w) = operands();
    let mut g = Graph::<f64>::new();
    small_program(&mut g, &x, &w);
    assert!(g.profile().is_empty(), "off by default");
    assert_eq!(g.profile().to_string().lines().count(), 2, "an empty table: a header and the total");
    g.set_profiling(true);
    small_program(&mut g, &x, &w);
    let before = g.profile();
    g.set_profiling(false);
    small_program(&mut g, &x, &w);
    assert_eq!(g.profile(), before, "turning it off keeps what was counted and counts nothing more");
}

const WIDTH: usize = 8;

/// Two `relu(h·W + b)` layers per checkpointed block.
struct Block<'a> {
    store: &'a ParamStore<f32>,
    layers: &'a [(ParamId, ParamId)],
}

impl Checkpoint<f32> for Block<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], part: u32) -> Var<'c, f32> {
        let mut h = x[0];
        for &(w, b) in &self.layers[2 * part as usize..2 * part as usize + 2] {
            h = h.linear(s.param(self.store, w), s.param(self.store, b)).relu();
        }
        h
    }
}

/// Four layers (two checkpointed blocks, or plain), cross-entropy, `backward_into`:
/// returns the loss and the gradients.
fn mlp_step(g: &mut Graph<f32>, checkpoint: bool) -> (f32, GradBuffer<f32>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let mut store = ParamStore::new();
    let layers: Vec<_> = (0..4)
        .map(|i| {
            let w = store.add(format!("w{i}"), Tensor::normal(&[WIDTH, WIDTH], 0.0, 0.5, &mut rng).unwrap()).unwrap();
            let b = store.add(format!("b{i}"), Tensor::normal(&[WIDTH], 0.0, 0.1, &mut rng).unwrap()).unwrap();
            (w, b)
        })
        .collect();
    let x = Tensor::normal(&[16, WIDTH], 0.0, 1.0, &mut rng).unwrap();
    let labels: Vec<usize> = (0..16).map(|i| i % WIDTH).collect();
    let mut grads = store.zeros_like().unwrap();
    let block = Block { store: &store, layers: &layers };
    let loss = g.scope(|s| {
        let mut h = s.input(&x);
        if checkpoint {
            h = s.checkpoint_part(&block, 0, &[h]);
            h = s.checkpoint_part(&block, 1, &[h]);
        } else {
            for part in 0..2 {
                h = block.forward(s, &[h], part);
            }
        }
        let loss = h.cross_entropy(&labels);
        s.backward_into(loss, &mut grads).unwrap();
        loss.item().unwrap()
    });
    (loss, grads)
}

#[test]
fn results_are_bitwise_the_same_with_profiling_on_and_off() {
    for checkpoint in [false, true] {
        let (mut off, mut on) = (Graph::<f32>::new(), Graph::<f32>::new());
        on.set_profiling(true);
        let (a, b) = (mlp_step(&mut off, checkpoint), mlp_step(&mut on, checkpoint));
        assert_eq!(a.0.to_bits(), b.0.to_bits());
        for ((_, ga), (_, gb)) in a.1.iter().zip(b.1.iter()) {
            let bits = |t: tapir::Grad<'_, f32>| t.data().iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(ga), bits(gb), "checkpoint {checkpoint}");
        }
        assert!(off.profile().is_empty() && !on.profile().is_empty());
    }
}

#[test]
fn a_checkpoint_s_recomputation_counts_as_forward_of_its_ops() {
    let mut g = Graph::<f32>::new();
    g.set_profiling(true);
    mlp_step(&mut g, true);
    let p = g.profile();
    // Each block's two layers are recorded once in forward and once more when backward
    // recomputes the block: 4 layers, 8 recordings, 4 backward rules.
    let (linear, relu, block) = (row(&p, "linear"), row(&p, "relu"), row(&p, "checkpoint"));
    assert_eq!((linear.calls, linear.backward_calls), (8, 4), "\n{p}");
    assert_eq!((relu.calls, relu.backward_calls), (8, 4), "\n{p}");
    assert_eq!((block.calls, block.backward_calls), (2, 2), "\n{p}");
    assert!(linear.gemm > Duration::ZERO && linear.gemm <= linear.total());
    // Nested ops' time is taken out of the block's, so the rows add up to the total.
    assert_eq!(p.total(), p.ops.iter().map(OpTime::total).sum::<Duration>());
}
