//! Shared by the MPI test binaries (each is `harness = false`, launched by mpirun with
//! 1, 2 and 4 ranks by `just test-mpi`): a small classifier, its data, single-process
//! reference training, and `ensure`, which aborts the whole job on a failed check.

#![allow(dead_code)]

use rand::SeedableRng;
use tapir::{Float, GradBuffer, Graph, ParamStore, Tensor};
use tapir_dist::{Comm, Mpi, SplitMix64};
use tapir_nn::{Activation, Ctx, Mlp, Module};

pub const FEATURES: usize = 5;
pub const CLASSES: usize = 3;

/// Fails the job: prints `what` with the rank and calls `MPI_Abort`, so mpirun exits
/// non-zero on every rank at once.
pub fn ensure(comm: &Mpi, ok: bool, what: impl AsRef<str>) {
    if !ok {
        comm.abort(1, &format!("check failed: {}", what.as_ref()));
    }
}

/// A synthetic dataset: `n` points in `[-1, 1)^5`, labelled by which of three fixed
/// directions they point most along (learnable, not separable by chance).
pub struct Data<T: Float> {
    pub x: Vec<T>,
    pub y: Vec<usize>,
}

pub fn data<T: Float>(n: usize, seed: u64) -> Data<T> {
    let mut rng = SplitMix64::new(seed);
    let mut x = Vec::with_capacity(n * FEATURES);
    let mut y = Vec::with_capacity(n);
    for _ in 0..n {
        let row: Vec<f64> = (0..FEATURES).map(|_| (rng.next_u64() >> 11) as f64 / (1u64 << 52) as f64 - 1.0).collect();
        let score = |c: usize| row.iter().enumerate().map(|(j, v)| v * (((j + c) % 3) as f64 - 1.0)).sum::<f64>();
        y.push((0..CLASSES).max_by(|&a, &b| score(a).total_cmp(&score(b))).unwrap());
        x.extend(row.into_iter().map(T::from_f64));
    }
    Data { x, y }
}

/// `FEATURES → hidden (tanh) → CLASSES`, initialised from `seed`.
pub fn model<T: Float>(hidden: usize, seed: u64) -> (ParamStore<T>, Mlp) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut store = ParamStore::new();
    let mlp = Mlp::builder(FEATURES)
        .hidden(hidden)
        .activation(Activation::Tanh)
        .output(CLASSES)
        .build(&mut store, "mlp", &mut rng)
        .expect("the model builds");
    (store, mlp)
}

/// Rows `idx` of the data as a batch (allocates: tests only).
pub fn batch<T: Float>(d: &Data<T>, idx: &[usize]) -> (Tensor<T>, Vec<usize>) {
    let x: Vec<T> = idx.iter().flat_map(|&i| d.x[i * FEATURES..(i + 1) * FEATURES].iter().copied()).collect();
    (Tensor::from_vec(x, &[idx.len(), FEATURES]).unwrap(), idx.iter().map(|&i| d.y[i]).collect())
}

/// Adds the mean cross-entropy gradient over rows `idx` into `grads` and returns the loss
/// (0 for an empty batch, which adds nothing).
pub fn local_grad<T: Float>(
    graph: &mut Graph<T>,
    store: &ParamStore<T>,
    mlp: &Mlp,
    d: &Data<T>,
    idx: &[usize],
    grads: &mut GradBuffer<T>,
) -> tapir::Result<f64> {
    if idx.is_empty() {
        return Ok(0.0);
    }
    let (x, y) = batch(d, idx);
    graph.scope(|s| {
        let loss = mlp.forward(Ctx::train(s, store), s.input(&x)).cross_entropy(&y);
        s.backward_into(loss, grads)?;
        Ok(loss.item()?.to_f64())
    })
}

/// Every parameter, flattened, as f64.
pub fn flat<T: Float>(store: &ParamStore<T>) -> Vec<f64> {
    store.iter().flat_map(|(_, _, t)| t.data().iter().map(|v| v.to_f64())).collect()
}

/// `‖a − b‖ / ‖b‖`.
pub fn rel_err(a: &[f64], b: &[f64]) -> f64 {
    let diff: f64 = a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum::<f64>().sqrt();
    diff / b.iter().map(|y| y * y).sum::<f64>().sqrt()
}

/// Prints one line from rank 0.
pub fn say(comm: &Mpi, line: impl AsRef<str>) {
    if comm.rank() == 0 {
        println!("[{} ranks] {}", comm.size(), line.as_ref());
    }
}
