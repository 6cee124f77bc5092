//! `func::jacfwd` against `func::jacobian` on a tall Jacobian: an MLP R^8 → 64 → R^4096
//! (tanh), the case forward mode is for (issue 35): `jacfwd` takes 8 forward passes with
//! tangents, `jacobian` 4,096 reverse sweeps. Prints the medians, their ratio and the
//! largest difference between the two Jacobians.
//!
//! ```sh
//! cargo run --release -p benches --example jacfwd -- 5 1     # ROUNDS THREADS
//! ```

use std::time::Instant;

use tapir::{func, Graph, Tensor};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn weights(rows: usize, cols: usize, salt: usize) -> Tensor<f32> {
    let scale = 1.0 / (rows as f32).sqrt();
    let data = (0..rows * cols).map(|i| (((i * 7919 + salt) % 1000) as f32 / 500.0 - 1.0) * scale).collect();
    Tensor::from_vec(data, &[rows, cols]).expect("a valid shape")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rounds: usize = args.first().and_then(|s| s.parse().ok()).unwrap_or(5);
    let threads: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(1);
    tapir::init_threads(threads).expect("no parallel work before this");
    let (w1, w2) = (weights(8, 64, 1), weights(64, 4096, 2));
    let x = Tensor::from_vec((0..8).map(|i| i as f32 / 8.0 - 0.4).collect(), &[8]).expect("a valid shape");
    let mut g = Graph::<f32>::new();
    g.set_threads(threads);
    let (mut fwd, mut rev, mut diff) = (Vec::new(), Vec::new(), 0.0f32);
    for _ in 0..rounds {
        let t = Instant::now();
        let a = func::jacfwd(&mut g, &x, |s, x| {
            x.reshape(&[1, 8]).matmul(s.input(&w1)).tanh().matmul(s.input(&w2)).reshape(&[4096])
        })
        .expect("jacfwd");
        fwd.push(t.elapsed().as_secs_f64() * 1e3);
        let t = Instant::now();
        let b = func::jacobian(&mut g, &x, |s, x| {
            x.reshape(&[1, 8]).matmul(s.input(&w1)).tanh().matmul(s.input(&w2)).reshape(&[4096])
        })
        .expect("jacobian");
        rev.push(t.elapsed().as_secs_f64() * 1e3);
        diff = a.data().iter().zip(b.data()).fold(diff, |m, (a, b)| m.max((a - b).abs()));
    }
    let (f, r) = (median(&mut fwd), median(&mut rev));
    println!("jacfwd   {f:10.3} ms (median of {rounds}, {threads} thread(s))");
    println!("jacobian {r:10.3} ms");
    println!("ratio    {:10.1}x   max |difference| {diff:e}", r / f);
}
