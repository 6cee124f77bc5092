//! Where W2's memory goes: the MLP step of `just compare`'s W2, with the scope's memory
//! report printed after backward, and the process's peak RSS after 3 steps.
//!
//! ```sh
//! cargo run --release -p benches --example w2_memory
//! ```

use benches::{MLP_BATCH, MLP_DIMS};
use rand::SeedableRng;
use tapir::{ParamStore, Tensor};

fn main() {
    let mut r = rand::rngs::StdRng::seed_from_u64(2);
    let mut store = ParamStore::<f32>::new();
    let mut layers = Vec::new();
    for (i, w) in MLP_DIMS.windows(2).enumerate() {
        let std = (2.0 / w[0] as f32).sqrt();
        let wid = store.add(format!("w{i}"), Tensor::normal(&[w[0], w[1]], 0.0, std, &mut r).unwrap()).unwrap();
        let bid = store.add(format!("b{i}"), Tensor::zeros(&[w[1]]).unwrap()).unwrap();
        layers.push((wid, bid));
    }
    let x = Tensor::normal(&[MLP_BATCH, MLP_DIMS[0]], 0.0, 1.0, &mut r).unwrap();
    let labels: Vec<usize> = (0..MLP_BATCH).map(|i| i % MLP_DIMS[3]).collect();
    let mut grads = store.zeros_like().unwrap();
    let mut g = benches::graph(1);
    let mib = |b: usize| b as f64 / (1 << 20) as f64;
    for step in 0..3 {
        grads.zero();
        let report = g.scope(|s| {
            let mut h = s.input(&x);
            for (i, &(w, b)) in layers.iter().enumerate() {
                h = h.linear(s.param(&store, w), s.param(&store, b));
                if i + 1 < layers.len() {
                    h = h.relu();
                }
            }
            s.backward_into(h.cross_entropy(&labels), &mut grads).unwrap();
            s.memory_report()
        });
        if step == 2 {
            println!("{report}");
        }
    }
    let st = g.stats();
    println!(
        "parameters {:.1} MiB, gradient buffer {:.1} MiB, input {:.1} MiB; arena high-water {:.1} MiB, capacity {:.1} MiB; \
         peak RSS {:.1} MiB",
        mib(store.numel() * 4),
        mib(grads.as_slice().len() * 4),
        mib(x.numel() * 4),
        mib(st.arena.high_water),
        mib(st.arena.capacity),
        benches::rss::peak_kib().unwrap_or(0) as f64 / 1024.0
    );
}
