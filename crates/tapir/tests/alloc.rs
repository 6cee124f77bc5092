//! A warmed-up training step makes zero heap allocations in the engine: recording,
//! backward, gradient accumulation into a caller-owned buffer, and the arena reset,
//! custom ops included.
//! Matrix products run sequentially here (`set_threads(1)`), so faer's GEMM is counted
//! too; see `docs/design.md` for rayon's share when they run in parallel.

mod common;

use rand::SeedableRng;
use tapir::{CustomError, CustomInputs, CustomOp, Graph, ParamStore, Shape, Tensor};

/// `y = a ⊙ b` with both inputs copied to the saved scratch: recording it uses the side
/// table, the scratch lists and a saved slice; its backward, the gradient slots.
struct SavedMul;

impl CustomOp<f32> for SavedMul {
    fn name(&self) -> &'static str {
        "saved_mul"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn saved_len(&self, inputs: &[Shape]) -> usize {
        2 * inputs[0].numel()
    }
    fn forward(&self, x: CustomInputs<'_, f32>, out: &mut [f32], saved: &mut [f32]) -> Result<(), CustomError> {
        let (a, b) = (x.value(0), x.value(1));
        for (i, y) in out.iter_mut().enumerate() {
            *y = a[i] * b[i];
        }
        saved[..a.len()].copy_from_slice(a);
        saved[a.len()..].copy_from_slice(b);
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, f32>,
        _: &[f32],
        saved: &[f32],
        dout: &[f32],
        dx: &mut [Option<&mut [f32]>],
    ) -> Result<(), CustomError> {
        let (a, b) = saved.split_at(dout.len());
        for (k, other) in [b, a].into_iter().enumerate() {
            if let Some(d) = dx[k].as_deref_mut() {
                for ((d, &g), &o) in d.iter_mut().zip(dout).zip(other) {
                    *d += g * o;
                }
            }
        }
        Ok(())
    }
}

#[global_allocator]
static ALLOC: common::Counting = common::Counting::new();

#[test]
fn warmed_up_training_step_allocates_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(7);
    let mut store = ParamStore::<f32>::new();
    let w1 = store.add("w1", Tensor::normal(&[16, 32], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let b1 = store.add("b1", Tensor::zeros(&[32]).unwrap()).unwrap();
    let w2 = store.add("w2", Tensor::normal(&[32, 4], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let x = Tensor::normal(&[8, 16], 0.0, 1.0, &mut rng).unwrap();
    let labels = [0usize, 1, 2, 3, 0, 1, 2, 3];
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);

    let mut losses = [0.0f32; 50];
    let mut counts = [0usize; 50];
    for (step, (loss_out, count)) in losses.iter_mut().zip(&mut counts).enumerate() {
        let before = ALLOC.allocations();
        grads.zero();
        let loss = graph.scope(|s| {
            let h = (s.input(&x).matmul(s.param(&store, w1)) + s.param(&store, b1)).relu();
            let logits = h.matmul(s.param(&store, w2));
            // Exercise more of the op set: softmax, reductions, shape ops, the same handle twice.
            let reg = (logits.softmax(-1) * logits.softmax(-1)).sum_axes(&[1], false).mean();
            // A custom op, given the same handle twice (an extra gradient slot in backward).
            let act = s.custom(&SavedMul, &[h, h]).mean() + s.custom(&SavedMul, &[logits, logits.tanh()]).mean();
            let loss = logits.cross_entropy(&labels)
                + reg * 0.01
                + h.t().narrow(0, 0, 4).square().mean() * 0.001
                + act * 0.001;
            s.backward_into(loss, &mut grads).unwrap();
            loss.item().unwrap()
        });
        for (id, t) in store.iter_mut() {
            let g = grads.get(id).unwrap();
            for (p, d) in t.data_mut().iter_mut().zip(g.data()) {
                *p -= 0.1 * d;
            }
        }
        *loss_out = loss;
        *count = ALLOC.allocations() - before;
        let _ = step;
    }
    assert!(counts[0] > 0, "the first step sets the arena and tape up");
    assert!(counts[1..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert!(losses[49] < losses[0], "the step trains: {} -> {}", losses[0], losses[49]);
}

/// A training step and a much smaller evaluation step, alternating: the arena's release
/// policy (64 consecutive small scopes) never fires, so nothing shrinks and regrows.
#[test]
fn alternating_train_and_eval_steps_allocate_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(8);
    let w = Tensor::<f32>::normal(&[256, 256], 0.0, 0.1, &mut rng).unwrap();
    let big = Tensor::<f32>::normal(&[512, 256], 0.0, 1.0, &mut rng).unwrap();
    let small = Tensor::<f32>::normal(&[2, 256], 0.0, 1.0, &mut rng).unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut counts = vec![];
    for step in 0..300 {
        let x = if step % 2 == 0 { &big } else { &small };
        let before = ALLOC.allocations();
        graph.scope(|s| {
            let w = s.leaf(&w);
            let loss = s.input(x).matmul(w).tanh().square().mean();
            s.backward(loss).unwrap();
        });
        counts.push(ALLOC.allocations() - before);
    }
    assert!(counts[2..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert_eq!(graph.stats().arena.releases, 0);
}

/// A warmed-up Hessian-vector product step (reverse over reverse, through `Scope::grad`
/// twice): the recorded gradients are arena nodes and the walk's side table is kept by the
/// graph, so after the first step nothing is allocated on the heap.
#[test]
fn warmed_up_hvp_step_allocates_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut store = ParamStore::<f32>::new();
    let w1 = store.add("w1", Tensor::normal(&[16, 32], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let b1 = store.add("b1", Tensor::zeros(&[32]).unwrap()).unwrap();
    let w2 = store.add("w2", Tensor::normal(&[32, 4], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let v: Vec<Tensor<f32>> =
        [[16, 32].as_slice(), &[32], &[32, 4]].iter().map(|d| Tensor::normal(d, 0.0, 1.0, &mut rng).unwrap()).collect();
    let mut hv: Vec<Vec<f32>> = v.iter().map(|t| vec![0.0; t.numel()]).collect();
    let x = Tensor::normal(&[8, 16], 0.0, 1.0, &mut rng).unwrap();
    let labels = [0usize, 1, 2, 3, 0, 1, 2, 3];
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut counts = [0usize; 20];
    for count in &mut counts {
        let before = ALLOC.allocations();
        graph.scope(|s| {
            let p = [s.param(&store, w1), s.param(&store, b1), s.param(&store, w2)];
            let h = (s.input(&x).matmul(p[0]) + p[1]).tanh();
            let logits = h.matmul(p[2]);
            let loss = logits.cross_entropy(&labels) + h.t().narrow(0, 0, 4).square().mean() * 0.01;
            let g = s.grad(loss, p).unwrap();
            let mut dot = s.scalar(0.0);
            for (gi, vi) in g.iter().zip(&v) {
                dot = dot + (*gi * s.input(vi)).sum();
            }
            let hvs = s.grad(dot, p).unwrap();
            for (out, h) in hv.iter_mut().zip(hvs) {
                out.copy_from_slice(h.value().unwrap());
            }
        });
        *count = ALLOC.allocations() - before;
    }
    assert!(counts[0] > 0, "the first step sets the arena, tape and side table up");
    assert!(counts[1..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert!(hv.iter().flatten().any(|&v| v != 0.0) && hv.iter().flatten().all(|v| v.is_finite()));
}

/// Two layers, `part` picking which: a checkpointed block reading parameters, whose
/// `linear` output the `relu` overwrites in place.
struct Block<'a> {
    store: &'a ParamStore<f32>,
    w: [tapir::ParamId; 2],
    b: tapir::ParamId,
}

impl tapir::Checkpoint<f32> for Block<'_> {
    fn forward<'c, 'e>(
        &'e self,
        s: &'c tapir::Scope<'c, 'e, f32>,
        x: &[tapir::Var<'c, f32>],
        part: u32,
    ) -> tapir::Var<'c, f32> {
        let w = s.param(self.store, self.w[part as usize]);
        let h = x[0].linear(w, s.param(self.store, self.b)).relu();
        (h.matmul(w) + x[0]).tanh()
    }
}

/// Checkpointed blocks: the nested scopes, their tapes, the scratch arena's resets and the
/// recomputation in backward reuse what the first step set up.
#[test]
fn warmed_up_checkpointed_step_allocates_nothing() {
    checkpointed_steps(false);
}

/// The same step with the per-op profile on: its counters are a fixed table, made when
/// profiling is turned on, so counting allocates nothing either.
#[test]
fn warmed_up_profiled_step_allocates_nothing() {
    checkpointed_steps(true);
}

fn checkpointed_steps(profile: bool) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(9);
    let mut store = ParamStore::<f32>::new();
    let w0 = store.add("w0", Tensor::normal(&[16, 16], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let w1 = store.add("w1", Tensor::normal(&[16, 16], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let b = store.add("b", Tensor::normal(&[16], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let x = Tensor::normal(&[8, 16], 0.0, 1.0, &mut rng).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    graph.set_profiling(profile);
    let mut counts = [0usize; 20];
    for count in &mut counts {
        let before = ALLOC.allocations();
        grads.zero();
        let block = Block { store: &store, w: [w0, w1], b };
        graph.scope(|s| {
            let h = s.checkpoint_part(&block, 0, &[s.input(&x)]);
            let h = s.checkpoint_part(&block, 1, &[h]);
            s.backward_into(h.square().mean(), &mut grads).unwrap();
        });
        for (id, t) in store.iter_mut() {
            let g = grads.get(id).unwrap();
            for (p, d) in t.data_mut().iter_mut().zip(g.data()) {
                *p -= 0.1 * d;
            }
        }
        *count = ALLOC.allocations() - before;
    }
    assert!(counts[0] > 0, "the first step sets the arenas and tapes up");
    assert!(counts[2..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert!(graph.stats().scratch.high_water > 0, "the blocks ran on the scratch arena");
    assert_eq!(graph.profile().is_empty(), !profile);
}

/// The same holds for a scope held open between calls ([`tapir::Session`]), with nodes
/// kept by index as a binding keeps them: opening and closing reuse the graph's memory.
#[test]
fn warmed_up_session_step_allocates_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(10);
    let mut store = ParamStore::<f32>::new();
    let w = store.add("w", Tensor::normal(&[16, 8], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let x: Vec<f32> = Tensor::<f32>::normal(&[4, 16], 0.0, 1.0, &mut rng).unwrap().data().to_vec();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut session = tapir::Session::new(graph);
    let mut counts = vec![];
    for _ in 0..20 {
        let before = ALLOC.allocations();
        grads.zero();
        session.open();
        let xi = session.with(|s| s.tensor(&x, &[4, 16]).index()).unwrap();
        let wi = session.with(|s| s.param_copied(&store, w).index()).unwrap();
        let li = session.with(|s| s.var_at(xi).unwrap().matmul(s.var_at(wi).unwrap()).tanh().square().mean().index());
        session.with(|s| s.backward_add(s.var_at(li.unwrap()).unwrap(), &mut grads).unwrap()).unwrap();
        session.close();
        counts.push(ALLOC.allocations() - before);
    }
    assert!(counts[0] > 0, "the first step sets the arena and tape up");
    assert!(counts[1..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
}

/// And for a session that lends its scope the store and the gradient buffer
/// ([`tapir::Session::with_param`], [`tapir::Session::backward_into`]): holding the store's
/// `Arc` and the buffer reuses the session's own slots.
#[test]
fn warmed_up_lending_session_step_allocates_nothing() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    let mut store = ParamStore::<f32>::new();
    let w = store.add("w", Tensor::normal(&[16, 8], 0.0, 0.2, &mut rng).unwrap()).unwrap();
    let x: Vec<f32> = Tensor::<f32>::normal(&[4, 16], 0.0, 1.0, &mut rng).unwrap().data().to_vec();
    let mut grads = Some(store.zeros_like().unwrap());
    let store = std::sync::Arc::new(store);
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut session = tapir::Session::new(graph);
    let mut counts = vec![];
    for _ in 0..20 {
        let before = ALLOC.allocations();
        let mut buffer = grads.take().unwrap();
        buffer.zero();
        session.open();
        let xi = session.with(|s| s.tensor(&x, &[4, 16]).index()).unwrap();
        let li = session.with_param(&store, w, |s, w| s.var_at(xi).unwrap().matmul(w).tanh().square().mean().index());
        session.backward_into(li.unwrap(), buffer).ok().unwrap().unwrap();
        session.close();
        grads = session.take_grads();
        counts.push(ALLOC.allocations() - before);
    }
    assert!(grads.unwrap().as_slice().iter().any(|&g| g != 0.0), "the gradients came back");
    assert!(counts[0] > 0, "the first step sets the arena and tape up");
    assert!(counts[1..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
}
