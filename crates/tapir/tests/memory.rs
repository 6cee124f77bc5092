//! 10,000 iterations of a small training step: the engine's live heap bytes are the same
//! at the end of every iteration after the first, and the arena's high-water mark and
//! capacity stay constant. This binary holds this one test only: the live-byte count is
//! process-wide, and another test running beside it would move it.

mod common;

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};

#[global_allocator]
static ALLOC: common::Counting = common::Counting::new();

#[test]
fn ten_thousand_steps_keep_memory_flat() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let mut store = ParamStore::<f32>::new();
    let w = store.add("w", Tensor::normal(&[10, 8], 0.0, 0.3, &mut rng).unwrap()).unwrap();
    let b = store.add("b", Tensor::zeros(&[8]).unwrap()).unwrap();
    let v = store.add("v", Tensor::normal(&[8, 3], 0.0, 0.3, &mut rng).unwrap()).unwrap();
    let x = Tensor::normal(&[6, 10], 0.0, 1.0, &mut rng).unwrap();
    let labels = [0usize, 1, 2, 0, 1, 2];
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);

    let mut first = None;
    for i in 0..10_000 {
        grads.zero();
        graph
            .scope(|s| {
                let h = (s.input(&x).matmul(s.param(&store, w)) + s.param(&store, b)).tanh();
                let loss = h.matmul(s.param(&store, v)).cross_entropy(&labels);
                s.backward_into(loss, &mut grads)
            })
            .unwrap();
        for (id, t) in store.iter_mut() {
            for (p, d) in t.data_mut().iter_mut().zip(grads.get(id).unwrap().data()) {
                *p -= 0.05 * d;
            }
        }
        let stats = graph.stats();
        let now = (ALLOC.live_bytes(), stats.arena.high_water, stats.arena.capacity, stats.nodes);
        match first {
            None => first = Some(now),
            Some(f) => assert_eq!(now, f, "iteration {i}: (live bytes, high water, capacity, nodes) changed"),
        }
    }
}
