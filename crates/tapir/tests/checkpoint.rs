//! Gradient checkpointing: the gradients are those of the same blocks recorded directly
//! and those of finite differences, the blocks' intermediates leave the main arena, and
//! mistakes in a block come out as typed errors.

use std::cell::Cell;

use rand::SeedableRng;
use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{Checkpoint, Error, Graph, ParamId, ParamStore, Scope, Tensor, Var};

/// `part` selects the layer: `tanh(x·W + b)`, with `x` also added back when `residual`.
struct Layers<'a> {
    store: &'a ParamStore<f64>,
    w: Vec<ParamId>,
    b: Vec<ParamId>,
}

impl Checkpoint<f64> for Layers<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], part: u32) -> Var<'c, f64> {
        let i = part as usize;
        let h = (x[0].matmul(s.param(self.store, self.w[i])) + s.param(self.store, self.b[i])).tanh();
        // A second input, used twice, when given.
        if x.len() > 1 {
            h * x[1] + x[1]
        } else {
            h
        }
    }
}

fn model(layers: usize, width: usize, seed: u64) -> (ParamStore<f64>, Vec<ParamId>, Vec<ParamId>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut store = ParamStore::new();
    let (mut w, mut b) = (vec![], vec![]);
    for i in 0..layers {
        w.push(store.add(format!("w{i}"), Tensor::normal(&[width, width], 0.0, 0.5, &mut rng).unwrap()).unwrap());
        b.push(store.add(format!("b{i}"), Tensor::normal(&[width], 0.0, 0.1, &mut rng).unwrap()).unwrap());
    }
    (store, w, b)
}

/// Runs the stack of layers with or without checkpointing each, and returns the loss,
/// the parameters' gradients and the gradients of the input and of the gate.
fn run(checkpoint: bool) -> (f64, Vec<f64>, Vec<f64>, Vec<f64>) {
    let (store, w, b) = model(5, 7, 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let x = Tensor::<f64>::normal(&[3, 7], 0.0, 1.0, &mut rng).unwrap();
    let gate = Tensor::<f64>::normal(&[3, 7], 0.0, 1.0, &mut rng).unwrap();
    let layers = Layers { store: &store, w, b };
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    let (loss, dx, dgate) = graph.scope(|s| {
        let (x, gate) = (s.leaf(&x), s.leaf(&gate));
        let mut h = x;
        for part in 0..5 {
            let inputs = if part % 2 == 1 { vec![h, gate] } else { vec![h] };
            h = if checkpoint { s.checkpoint_part(&layers, part, &inputs) } else { layers.forward(s, &inputs, part) };
        }
        // The gate is also used outside the blocks.
        let loss = (h * h).sum() + (gate * x).sum();
        s.backward_into(loss, &mut grads).unwrap();
        (loss.item().unwrap(), x.grad().unwrap().to_vec(), gate.grad().unwrap().to_vec())
    });
    let flat = store.iter().flat_map(|(id, _, _)| grads.get(id).unwrap().data().to_vec()).collect();
    (loss, flat, dx, dgate)
}

fn assert_close(a: &[f64], b: &[f64], what: &str) {
    assert_eq!(a.len(), b.len());
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert!((x - y).abs() <= 1e-12 * (1.0 + x.abs()), "{what}[{i}]: {x} vs {y}");
    }
}

#[test]
fn gradients_match_the_blocks_recorded_directly() {
    let (l0, p0, x0, g0) = run(false);
    let (l1, p1, x1, g1) = run(true);
    assert_eq!(l0, l1, "the forward pass computes the same ops");
    assert!(p0.iter().any(|&g| g != 0.0));
    assert_close(&p0, &p1, "parameter gradient");
    assert_close(&x0, &x1, "input gradient");
    assert_close(&g0, &g1, "gate gradient");
}

fn block<'c>(s: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    let h = (x[0].matmul(x[1]) + s.scalar(0.5)).tanh();
    (h * x[0]).exp().mean_axes(&[1], true) * h
}

#[test]
fn gradients_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let a = Tensor::<f64>::normal(&[4, 4], 0.0, 0.5, &mut rng).unwrap();
    let w = Tensor::<f64>::normal(&[4, 4], 0.0, 0.5, &mut rng).unwrap();
    let report = gradcheck(&[a, w], GradcheckOptions::default(), |s, x| {
        let y = s.checkpoint(&block, x);
        s.checkpoint(&block, &[y, x[1]]) // the same block twice, sharing `w`
    })
    .unwrap();
    assert_eq!(report.checked, 32);
}

/// A block that checkpoints inside itself: the inner checkpoint runs inline.
fn outer<'c>(s: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    let y = s.checkpoint(&block, x);
    s.checkpoint(&block, &[y, x[1]])
}

#[test]
fn nested_checkpoints_run_inline_with_the_same_gradients() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(4);
    let a = Tensor::<f64>::normal(&[3, 3], 0.0, 0.5, &mut rng).unwrap();
    let w = Tensor::<f64>::normal(&[3, 3], 0.0, 0.5, &mut rng).unwrap();
    gradcheck(&[a.clone(), w.clone()], GradcheckOptions::default(), |s, x| s.checkpoint(&outer, x)).unwrap();
    let mut g = Graph::<f64>::new();
    let grads = |nest: bool, g: &mut Graph<f64>| {
        g.scope(|s| {
            let (a, w) = (s.leaf(&a), s.leaf(&w));
            let y = if nest { s.checkpoint(&outer, &[a, w]) } else { outer(s, &[a, w]) };
            s.backward(y.sum()).unwrap();
            (a.grad().unwrap().to_vec(), w.grad().unwrap().to_vec())
        })
    };
    let (da0, dw0) = grads(false, &mut g);
    let (da1, dw1) = grads(true, &mut g);
    assert_close(&da0, &da1, "da");
    assert_close(&dw0, &dw1, "dw");
}

/// 16 layers of width 64 on a batch of 256, checkpointed every 4 layers or not.
fn high_water(checkpoint: bool) -> (usize, usize, Vec<f64>) {
    struct Four<'a>(&'a ParamStore<f64>, &'a [ParamId]);
    impl Checkpoint<f64> for Four<'_> {
        fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], part: u32) -> Var<'c, f64> {
            let mut h = x[0];
            for &w in &self.1[4 * part as usize..4 * part as usize + 4] {
                h = h.matmul(s.param(self.0, w)).relu();
            }
            h
        }
    }
    let (store, w, _) = model(16, 64, 5);
    let x = Tensor::<f64>::normal(&[256, 64], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(6)).unwrap();
    let four = Four(&store, &w);
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    graph.scope(|s| {
        let mut h = s.input(&x);
        for part in 0..4 {
            h = if checkpoint { s.checkpoint_part(&four, part, &[h]) } else { four.forward(s, &[h], part) };
        }
        s.backward_into(h.square().mean(), &mut grads).unwrap();
    });
    let stats = graph.stats();
    let flat = store.iter().flat_map(|(id, _, _)| grads.get(id).unwrap().data().to_vec()).collect();
    (stats.arena.high_water, stats.scratch.high_water, flat)
}

#[test]
fn intermediates_leave_the_main_arena() {
    let (plain, plain_scratch, g0) = high_water(false);
    let (main, scratch, g1) = high_water(true);
    assert_close(&g0, &g1, "parameter gradient");
    assert_eq!(plain_scratch, 0);
    let act = 256 * 64 * 8; // one activation, in bytes
                            // Without: 16 layers keep a matmul and a relu output each (32 activations);
                            // `backward_into` releases each intermediate gradient once consumed, so the walk
                            // holds two activation gradients at a time, beside the loss's square: 35 (measured
                            // 35.0). The weights' gradients are written into `grads`, in neither arena. With: the
                            // main arena keeps 4 block outputs and the square, and the two reused gradient buffers
                            // (7, measured 7.0); the scratch arena one block's forward (8) and backward (8, the
                            // seed, the block input's and weights' gradients: 18, measured 18.0).
    assert!((32 * act..=36 * act).contains(&plain), "{plain}");
    assert!(main <= 8 * act, "{main}");
    assert!(scratch <= 19 * act, "{scratch}");
    // The main arena: under half.
    assert!(2 * main <= plain, "{main} vs {plain}");
}

fn bad_block<'c>(s: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    x[0] + s.zeros(&[5]) // x is [2]: a shape mistake inside the block
}

#[test]
fn an_error_in_the_block_is_the_scopes_typed_error() {
    let x = Tensor::<f64>::ones(&[2]).unwrap();
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let y = s.checkpoint(&bad_block, &[s.leaf(&x)]);
        s.backward(y.sum()).unwrap_err()
    });
    assert!(matches!(e, Error::Broadcast { op: "add", .. }), "{e}");
    assert!(e.to_string().contains("[2]") && e.to_string().contains("[5]"), "{e}");
    // The graph remains usable.
    let ok = g.scope(|s| s.checkpoint(&block_sum, &[s.leaf(&x)]).item()).unwrap();
    assert_eq!(ok, 2.0);
}

fn block_sum<'c>(_: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    x[0].sum()
}

/// Records one more op each time it runs: its recomputation differs from its forward.
struct Drifting(Cell<usize>);

impl Checkpoint<f64> for Drifting {
    fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        self.0.set(self.0.get() + 1);
        let mut y = x[0];
        for _ in 0..self.0.get() {
            y = y.sum_axes(&[0], false);
        }
        y
    }
}

#[test]
fn a_block_that_changes_on_recomputation_is_an_error() {
    let x = Tensor::<f64>::ones(&[2, 2, 2]).unwrap();
    let drifting = Drifting(Cell::new(0));
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let y = s.checkpoint(&drifting, &[s.leaf(&x)]);
        s.backward(y.sum()).unwrap_err()
    });
    assert!(matches!(e, Error::InvalidArgument { op: "checkpoint", .. }), "{e}");
    assert!(e.to_string().contains("[2]") && e.to_string().contains("[2, 2]"), "{e}");
}

#[test]
fn parameters_of_another_store_in_a_block_are_caught_before_backward() {
    let (store, w, b) = model(1, 3, 7);
    let (other, _, _) = model(1, 3, 8);
    let layers = Layers { store: &store, w, b };
    let x = Tensor::<f64>::ones(&[2, 3]).unwrap();
    let mut grads = other.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let y = s.checkpoint(&layers, &[s.input(&x)]);
        s.backward_into(y.sum(), &mut grads).unwrap_err()
    });
    assert!(matches!(e, Error::WrongStore { op: "backward_into", .. }), "{e}");
}

/// Second order through checkpoints that read parameters inside the block: with
/// `[gx, ggate] = grad(L, [x, gate])` recorded, `M = ⟨gx, u⟩ + Σ gx² + ⟨ggate, u⟩`
/// differentiated by `backward_into` (the Hessian-vector products with respect to the
/// parameters, the input and the gate) and a third `grad` of `M`: all equal those of the
/// same blocks recorded directly.
fn second_order(checkpoint: bool) -> Vec<Vec<f64>> {
    let (store, w, b) = model(5, 7, 1);
    let mut rng = rand::rngs::StdRng::seed_from_u64(2);
    let x = Tensor::<f64>::normal(&[3, 7], 0.0, 1.0, &mut rng).unwrap();
    let gate = Tensor::<f64>::normal(&[3, 7], 0.0, 1.0, &mut rng).unwrap();
    let u = Tensor::<f64>::normal(&[3, 7], 0.0, 1.0, &mut rng).unwrap();
    let layers = Layers { store: &store, w, b };
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    let mut out = graph.scope(|s| {
        let (x, gate, u) = (s.leaf(&x), s.leaf(&gate), s.input(&u));
        let mut h = x;
        for part in 0..5 {
            let inputs = if part % 2 == 1 { vec![h, gate] } else { vec![h] };
            h = if checkpoint { s.checkpoint_part(&layers, part, &inputs) } else { layers.forward(s, &inputs, part) };
        }
        let loss = (h * h).sum() + (gate * x).sum();
        let [gx, ggate] = s.grad(loss, [x, gate]).unwrap();
        let m = (gx * u).sum() + (gx * gx).sum() + (ggate * u).sum();
        let [hx] = s.grad(m, [x]).unwrap();
        let [tx] = s.grad((hx * u).sum(), [x]).unwrap();
        s.backward_into(m, &mut grads).unwrap();
        let v = |v: Var<'_, f64>| v.value().unwrap().to_vec();
        vec![v(gx), v(ggate), v(hx), v(tx), x.grad().unwrap().to_vec(), gate.grad().unwrap().to_vec()]
    });
    out.push(store.iter().flat_map(|(id, _, _)| grads.get(id).unwrap().data().to_vec()).collect());
    out
}

#[test]
fn second_order_gradients_through_checkpoints_match_the_blocks_recorded_directly() {
    let direct = second_order(false);
    let checkpointed = second_order(true);
    let names = ["∂L/∂x", "∂L/∂gate", "∂M/∂x", "third order", "x.grad", "gate.grad", "∂M/∂θ"];
    for ((a, b), name) in direct.iter().zip(&checkpointed).zip(names) {
        assert!(a.iter().any(|&v| v != 0.0), "{name} is not all zero");
        assert_close(a, b, name);
    }
}

#[test]
fn second_derivatives_through_checkpoints_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(5);
    let a = Tensor::<f64>::normal(&[3, 3], 0.0, 0.5, &mut rng).unwrap();
    let w = Tensor::<f64>::normal(&[3, 3], 0.0, 0.5, &mut rng).unwrap();
    // The same block twice, sharing `w`, and a block that checkpoints inside itself.
    gradgradcheck(&[a.clone(), w.clone()], GradcheckOptions::default(), |s, x| {
        let y = s.checkpoint(&block, x);
        s.checkpoint(&block, &[y, x[1]])
    })
    .unwrap();
    gradgradcheck(&[a, w], GradcheckOptions::default(), |s, x| s.checkpoint(&outer, x)).unwrap();
}

/// A block that reads one parameter on its forward and another when recomputed.
struct Swapping<'a> {
    store: &'a ParamStore<f64>,
    ids: [ParamId; 2],
    calls: Cell<usize>,
}

impl Checkpoint<f64> for Swapping<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        let n = self.calls.get();
        self.calls.set(n + 1);
        (x[0] * s.param(self.store, self.ids[n.min(1)])).tanh()
    }
}

#[test]
fn a_block_that_reads_other_parameters_when_recomputed_for_grad_is_an_error() {
    let mut store = ParamStore::<f64>::new();
    let a = store.add("a", Tensor::from_vec(vec![1.0, 2.0], &[2]).unwrap()).unwrap();
    let b = store.add("b", Tensor::from_vec(vec![3.0, 4.0], &[2]).unwrap()).unwrap();
    let block = Swapping { store: &store, ids: [a, b], calls: Cell::new(0) };
    let x = Tensor::<f64>::from_vec(vec![0.5, -1.0], &[2]).unwrap();
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let x = s.leaf(&x);
        let y = s.checkpoint(&block, &[x]).sum();
        s.grad(y, [x]).map(|_| ()).unwrap_err()
    });
    assert!(matches!(e, Error::InvalidArgument { op: "checkpoint", .. }), "{e}");
    assert!(e.to_string().contains("other parameters"), "{e}");
}

/// Blocks of `linear` layers, whose outputs the checkpoint may overwrite in place with
/// the activation after them; `part` picks a case:
/// 0. `linear → relu → linear → tanh`: both overwritten;
/// 1. `relu(l) + l`: `l` has a second reader, so the forward runs again without in-place ops;
/// 2. `l` is the output and its `relu` is dropped: the same;
/// 3. the block reads `l` after its `sigmoid`: the read computes it again;
/// 4. `exp(l) · detach(l)`: the same through `detach`.
struct Linear<'a> {
    store: &'a ParamStore<f64>,
    w: Vec<ParamId>,
    b: Vec<ParamId>,
    /// What case 3 read, each time it ran.
    read: Cell<Option<Result<f64, Error>>>,
}

impl Checkpoint<f64> for Linear<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], part: u32) -> Var<'c, f64> {
        let layer =
            |h: Var<'c, f64>, i: usize| h.linear(s.param(self.store, self.w[i]), s.param(self.store, self.b[i]));
        let l = layer(x[0], 0);
        match part {
            0 => layer(l.relu(), 1).tanh(),
            1 => l.relu() + l,
            2 => {
                let _ = l.relu();
                l
            }
            3 => {
                let y = l.sigmoid();
                let v = l.value().map(|v| v[1]);
                self.read.set(Some(v));
                y
            }
            _ => l.exp() * l.detach(),
        }
    }
}

fn linear_blocks(seed: u64) -> (ParamStore<f64>, Vec<ParamId>, Vec<ParamId>, Tensor<f64>) {
    let (store, w, b) = model(2, 6, seed);
    let x = Tensor::<f64>::normal(&[5, 6], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(seed + 1)).unwrap();
    (store, w, b, x)
}

#[test]
fn in_place_blocks_have_the_gradients_of_the_blocks_recorded_directly() {
    let (store, w, b, x) = linear_blocks(7);
    let blocks = Linear { store: &store, w, b, read: Cell::new(None) };
    let mut graph = Graph::<f64>::new();
    for part in 0..5 {
        let mut run = |checkpoint: bool| {
            let mut grads = store.zeros_like().unwrap();
            let (y, dx) = graph.scope(|s| {
                let x = s.leaf(&x);
                let y = if checkpoint { s.checkpoint_part(&blocks, part, &[x]) } else { blocks.forward(s, &[x], part) };
                // A loss whose gradient differs from element to element.
                let loss = (y * y.mul_scalar(0.5).exp()).sum();
                s.backward_into(loss, &mut grads).unwrap();
                (y.to_tensor().unwrap(), x.grad().unwrap().to_vec())
            });
            let flat: Vec<f64> = store.iter().flat_map(|(id, _, _)| grads.get(id).unwrap().data().to_vec()).collect();
            (y, dx, flat)
        };
        let (y0, dx0, p0) = run(false);
        let read0 = blocks.read.take();
        let (y1, dx1, p1) = run(true);
        assert_eq!(y0.data(), y1.data(), "part {part}: the block's output");
        assert_close(&dx0, &dx1, &format!("part {part}: dx"));
        assert_close(&p0, &p1, &format!("part {part}: parameters"));
        assert!(dx0.iter().any(|&g| g != 0.0));
        if part == 3 {
            // Read in the forward (after the sigmoid overwrote it: computed again) and in
            // the recomputation (nothing was overwritten, since the forward read a value).
            let (read0, read1) = (read0.unwrap().unwrap(), blocks.read.take().unwrap().unwrap());
            assert_eq!(read0, read1);
        }
    }
}

/// `tanh(linear(relu(linear(x))))`, checkpointed: both `linear` outputs are overwritten.
fn two_linear<'c>(_: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    x[0].linear(x[1], x[2]).relu().linear(x[1], x[2]).tanh()
}

#[test]
fn in_place_blocks_match_finite_differences() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let x = Tensor::<f64>::normal(&[3, 4], 0.0, 1.0, &mut rng).unwrap();
    let w = Tensor::<f64>::normal(&[4, 4], 0.0, 0.7, &mut rng).unwrap();
    let b = Tensor::<f64>::normal(&[4], 0.0, 0.5, &mut rng).unwrap();
    let report = gradcheck(&[x, w, b], GradcheckOptions::default(), |s, v| s.checkpoint(&two_linear, v)).unwrap();
    assert_eq!(report.checked, 12 + 16 + 4);
}

/// A block that reads `l` only when recomputed: by then the forward, which read no value,
/// has let the `relu` overwrite it.
struct ReadsLate<'a> {
    store: &'a ParamStore<f64>,
    w: ParamId,
    b: ParamId,
    runs: Cell<u32>,
    read: Cell<Option<Result<usize, Error>>>,
}

impl Checkpoint<f64> for ReadsLate<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        let l = x[0].linear(s.param(self.store, self.w), s.param(self.store, self.b));
        let y = l.relu();
        self.runs.set(self.runs.get() + 1);
        if self.runs.get() == 2 {
            self.read.set(Some(l.value().map(<[f64]>::len)));
        }
        y
    }
}

#[test]
fn reading_an_overwritten_value_on_recomputation_is_an_error() {
    let (store, w, b, x) = linear_blocks(11);
    let block = ReadsLate { store: &store, w: w[0], b: b[0], runs: Cell::new(0), read: Cell::new(None) };
    let mut graph = Graph::<f64>::new();
    let dx = |checkpoint: bool, graph: &mut Graph<f64>| {
        graph.scope(|s| {
            let x = s.leaf(&x);
            let y = if checkpoint { s.checkpoint(&block, &[x]) } else { block.forward(s, &[x], 0) };
            s.backward(y.sum()).unwrap();
            x.grad().unwrap().to_vec()
        })
    };
    let direct = dx(false, &mut graph);
    block.runs.set(0);
    let checkpointed = dx(true, &mut graph);
    match block.read.take() {
        Some(Err(Error::InvalidArgument { op: "value", detail, .. })) => {
            assert!(detail.contains("overwritten in place"), "{detail}")
        }
        other => panic!("expected the typed error, got {other:?}"),
    }
    // The block did not use the value: its gradients are still right.
    assert_close(&direct, &checkpointed, "dx");
}

/// A block of four `relu(linear)` layers of width 64 on a batch of 256.
struct FourLinear<'a>(&'a ParamStore<f64>, &'a [ParamId], &'a [ParamId]);

impl Checkpoint<f64> for FourLinear<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        let mut h = x[0];
        for (&w, &b) in self.1.iter().zip(self.2) {
            h = h.linear(s.param(self.0, w), s.param(self.0, b)).relu();
        }
        h
    }
}

#[test]
fn in_place_ops_keep_one_buffer_per_layer_in_the_scratch_arena() {
    let (store, w, b) = model(4, 64, 12);
    let x = Tensor::<f64>::normal(&[256, 64], 0.0, 1.0, &mut rand::rngs::StdRng::seed_from_u64(13)).unwrap();
    let block = FourLinear(&store, &w, &b);
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f64>::new();
    graph.scope(|s| {
        let y = s.checkpoint(&block, &[s.input(&x)]);
        s.backward_into(y.square().mean(), &mut grads).unwrap();
    });
    let act = 256 * 64 * 8;
    let scratch = graph.stats().scratch.high_water;
    // Without in-place ops the forward alone holds 8 activations (a `linear` and a `relu`
    // output per layer). With them: the forward holds 4; the recomputation 4, and its
    // backward the seed, one reused activation gradient and the input's gradient, beside
    // the weights' gradients (measured 7.0 activations).
    assert!(scratch < 8 * act, "{} activations", scratch as f64 / act as f64);
    assert!(scratch >= 4 * act, "{} activations", scratch as f64 / act as f64);
}

/// `x·W`, panicking on its `panic_on`-th call (counting from 1).
struct Flaky<'a> {
    store: &'a ParamStore<f64>,
    w: ParamId,
    calls: Cell<u32>,
    panic_on: u32,
}

impl Checkpoint<f64> for Flaky<'_> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        self.calls.set(self.calls.get() + 1);
        assert_ne!(self.calls.get(), self.panic_on, "the block fails on this call");
        x[0].matmul(s.param(self.store, self.w))
    }
}

/// `s.backward_into(loss, grads)`, with a panic caught.
fn backward_into_unwinding<'s>(
    s: &'s Scope<'s, '_, f64>,
    loss: Var<'s, f64>,
    grads: &'s mut tapir::GradBuffer<f64>,
) -> std::thread::Result<Result<(), Error>> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        let grads = grads; // moved out of the closure, so that the closure is `FnOnce`
        s.backward_into(loss, grads)
    }))
}

#[test]
fn a_backward_into_whose_block_panics_lends_nothing_to_the_next() {
    // The block panics while recomputed for the first `backward_into`, after `v`'s first
    // gradient has taken its slot of `a` and before `u`'s has (`u` is read before the
    // block, so the walk reaches it after). The panic is a typed error (nothing unwinds
    // out of the engine, which the harness would also catch), and the caller runs
    // `backward_into` again into `b`: every parameter gets its gradient there, and
    // `Var::grad` reads it, as if the first pass had never run
    // (`L = Σ u³ + Σ x·W + Σ v²`: `∂L/∂u = 3u²`, `∂L/∂W[i][j] = Σ_r x[r][i]`, `∂L/∂v = 2v`).
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.25], &[2, 2]).unwrap()).unwrap();
    let v = store.add("v", Tensor::from_vec(vec![1.5, -0.75], &[2]).unwrap()).unwrap();
    let u = store.add("u", Tensor::from_vec(vec![2.0, -1.0], &[2]).unwrap()).unwrap();
    let x = Tensor::from_vec(vec![1.0, 2.0, -3.0, 0.5], &[2, 2]).unwrap();
    let flaky = Flaky { store: &store, w, calls: Cell::new(0), panic_on: 2 };
    let (mut a, mut b) = (store.zeros_like().unwrap(), store.zeros_like().unwrap());
    let mut graph = Graph::<f64>::new();
    let (gu, gv) = graph.scope(|s| {
        let uu = s.param(&store, u);
        let cube = uu.powf(3.0).sum();
        let y = s.checkpoint(&flaky, &[s.leaf(&x)]);
        let vv = s.param(&store, v);
        let loss = cube + y.sum() + (vv * vv).sum();
        let first = backward_into_unwinding(s, loss, &mut a);
        let Ok(Err(Error::Callback { op: "checkpoint", callback, detail, .. })) = &first else {
            panic!("the recomputation's panic is a typed error: {first:?}")
        };
        assert!(callback.contains("block (part 0)") && detail.contains("fails on this call"), "{first:?}");
        s.backward_into(loss, &mut b).unwrap();
        (uu.grad().unwrap().to_vec(), vv.grad().unwrap().to_vec())
    });
    assert_eq!((gu.as_slice(), gv.as_slice()), ([12.0, 3.0].as_slice(), [3.0, -1.5].as_slice()));
    assert_eq!(b.get(u).unwrap().data(), [12.0, 3.0]);
    assert_eq!(b.get(v).unwrap().data(), [3.0, -1.5]);
    assert_eq!(b.get(w).unwrap().data(), [-2.0, -2.0, 2.5, 2.5]);
    // The failed pass left `a` as it was.
    for p in [u, v, w] {
        assert!(a.get(p).unwrap().data().iter().all(|&g| g == 0.0));
    }
}
