//! Deep graphs need no stack: backward and reset are loops over the tape.

use tapir::{Graph, Tensor};

#[test]
fn million_op_chain_on_a_default_stack() {
    // Record, backward and reset 10^6 ops on a thread with the default 2 MiB stack:
    // backward is a loop over the tape, never recursion.
    let handle = std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(|| {
            let mut graph = Graph::<f64>::new();
            let x0 = Tensor::from_vec(vec![0.5], &[1]).unwrap();
            let (grad, nodes) = graph.scope(|s| {
                let x = s.leaf(&x0);
                let mut y = x;
                for _ in 0..1_000_000 {
                    y = y * 1.000001;
                }
                let loss = y.sum();
                s.backward(loss).unwrap();
                (x.grad().unwrap()[0], s.stats().nodes)
            });
            // d/dx (x · c^n) = c^n.
            let expected = 1.000001f64.powi(1_000_000);
            assert!((grad - expected).abs() < 1e-9 * expected, "{grad} vs {expected}");
            assert_eq!(nodes, 1_000_002);
            assert_eq!(graph.stats().arena.bytes_in_use, 0, "the scope's end reset the arena");
        })
        .unwrap();
    handle.join().unwrap();
}
