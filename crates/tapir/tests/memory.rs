//! 10,000 iterations of a small training step, a custom op and a checkpointed block among
//! its ops: the engine's live heap bytes are the same at the end of every iteration after
//! the first, and the high-water marks and capacities of the arena and of the checkpoints'
//! scratch arena stay constant. This binary holds this one test only: the live-byte count
//! is process-wide, and another test running beside it would move it.

mod common;

use rand::SeedableRng;
use tapir::{CustomError, CustomInputs, CustomOp, Graph, ParamStore, Scope, Shape, Tensor, Var};

/// `y = x²`, a custom op with its own backward (`dx += 2x · dout`).
struct Square;

impl CustomOp<f32> for Square {
    fn name(&self) -> &'static str {
        "square"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn forward(&self, x: CustomInputs<'_, f32>, out: &mut [f32], _: &mut [f32]) -> Result<(), CustomError> {
        out.iter_mut().zip(x.value(0)).for_each(|(y, &x)| *y = x * x);
        Ok(())
    }
    fn backward(
        &self,
        x: CustomInputs<'_, f32>,
        _: &[f32],
        _: &[f32],
        dout: &[f32],
        dx: &mut [Option<&mut [f32]>],
    ) -> Result<(), CustomError> {
        if let Some(d) = dx[0].as_deref_mut() {
            d.iter_mut().zip(x.value(0)).zip(dout).for_each(|((d, &x), &g)| *d += 2.0 * x * g);
        }
        Ok(())
    }
}

/// The checkpointed block: `tanh(h · u)`.
fn block<'c>(_: &'c Scope<'c, '_, f32>, v: &[Var<'c, f32>]) -> Var<'c, f32> {
    v[0].matmul(v[1]).tanh()
}

#[global_allocator]
static ALLOC: common::Counting = common::Counting::new();

#[test]
fn ten_thousand_steps_keep_memory_flat() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut store = ParamStore::<f32>::new();
    let w = store.add("w", Tensor::normal(&[10, 8], 0.0, 0.3, &mut rng).unwrap()).unwrap();
    let b = store.add("b", Tensor::zeros(&[8]).unwrap()).unwrap();
    let u = store.add("u", Tensor::normal(&[8, 8], 0.0, 0.3, &mut rng).unwrap()).unwrap();
    let v = store.add("v", Tensor::normal(&[8, 3], 0.0, 0.3, &mut rng).unwrap()).unwrap();
    let x = Tensor::normal(&[6, 10], 0.0, 1.0, &mut rng).unwrap();
    let labels = [0usize, 1, 2, 0, 1, 2];
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);

    let mut first = None;
    let mut losses = Vec::with_capacity(10); // before the first measurement: it must not grow
    for i in 0..10_000 {
        grads.zero();
        let loss = graph
            .scope(|s| {
                let h = (s.input(&x).matmul(s.param(&store, w)) + s.param(&store, b)).tanh();
                let h = s.checkpoint(&block, &[s.custom(&Square, &[h]), s.param(&store, u)]);
                let loss = h.matmul(s.param(&store, v)).cross_entropy(&labels);
                s.backward_into(loss, &mut grads)?;
                loss.item()
            })
            .unwrap();
        if i % 1000 == 0 {
            losses.push(loss);
        }
        for (id, t) in store.iter_mut() {
            for (p, d) in t.data_mut().iter_mut().zip(grads.get(id).unwrap().data()) {
                *p -= 0.05 * d;
            }
        }
        let stats = graph.stats();
        let (arena, scratch) = (stats.arena, stats.scratch);
        let now =
            (ALLOC.live_bytes(), arena.high_water, arena.capacity, scratch.high_water, scratch.capacity, stats.nodes);
        match first {
            None => first = Some(now),
            Some(f) => assert_eq!(
                now, f,
                "iteration {i}: (live bytes, high water, capacity, scratch high water, scratch capacity, nodes) changed"
            ),
        }
    }
    assert!(graph.stats().scratch.high_water > 0, "the block ran on the scratch arena");
    assert!(losses[9] < 0.5 * losses[0], "the step trains: losses every 1,000 steps {losses:?}");
}
