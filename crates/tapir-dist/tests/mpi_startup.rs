//! Under mpirun with 1, 2 and 4 ranks: rank 0's parameters reach every rank, and a rank
//! whose model differs from rank 0's fails at start on every rank, with an error naming
//! it and the first differing parameter (a different width, dtype, an extra parameter).
//! Also: one rank's NaN metric weight fails `mean_metrics` on every rank with one error.

mod common;

use common::*;
use tapir::{ParamStore, Tensor};
use tapir_dist::{params_hash, Comm, DataParallel, Error, Mpi};

fn main() {
    let comm = Mpi::init().unwrap();
    let (rank, size) = (comm.rank(), comm.size());

    // Broadcast: every rank starts from its own seed and ends with rank 0's values.
    let (mut store, _) = model::<f32>(12, 100 + rank as u64);
    let mut before = vec![0u64; size];
    comm.all_gather_u64(params_hash(&store), &mut before);
    let mut dp = DataParallel::new(&comm, &mut store).unwrap();
    ensure(&comm, params_hash(&store) == before[0], "after DataParallel::new every rank holds rank 0's parameters");
    say(&comm, "ok: rank 0's parameters are broadcast");

    // A NaN metric weight on the last rank: every rank returns the same error (decided
    // from the reduced slots), none hangs, and the next call works.
    let victim = size - 1;
    let mut m = [rank as f64, 1.0];
    let weight = if rank == victim { f64::NAN } else { 2.0 };
    match dp.mean_metrics(&mut m, weight) {
        Err(Error::InvalidArgument { op: "DataParallel::mean_metrics", detail, .. }) => ensure(
            &comm,
            detail == format!("rank {victim} of {size} passed the weight NaN; weights must be finite and non-negative")
                && m == [rank as f64, 1.0],
            format!("mean_metrics with a NaN weight: {detail}, values {m:?}"),
        ),
        other => ensure(&comm, false, format!("mean_metrics with a NaN weight: {other:?}")),
    }
    dp.mean_metrics(&mut m, 1.0).unwrap();
    ensure(&comm, m[1] == 1.0, format!("mean_metrics after the refused call: {m:?}"));
    say(&comm, "ok: a NaN metric weight fails every rank alike");
    drop(dp);

    if size == 1 {
        return;
    }

    // Rank 1 builds a narrower hidden layer.
    let (mut store, _) = model::<f64>(if rank == 1 { 8 } else { 12 }, 5);
    match DataParallel::new(&comm, &mut store) {
        Err(e @ Error::ModelMismatch { rank: 1, index: 0, .. }) => {
            let text = e.to_string();
            let want =
                "rank 1's parameter 0 is \"mlp.0.weight\" f64 [5, 8] but rank 0's is \"mlp.0.weight\" f64 [5, 12]";
            ensure(&comm, text.contains(want), format!("message names both versions: {text}"));
        }
        other => ensure(&comm, false, format!("a narrower rank 1 must fail everywhere, got {other:?}")),
    }
    say(&comm, "ok: a different width on rank 1 fails on every rank, naming mlp.0.weight and both shapes");

    // Rank 1 trains in f64, the others in f32.
    let e = if rank == 1 {
        let (mut store, _) = model::<f64>(12, 5);
        DataParallel::new(&comm, &mut store).map(|_| ())
    } else {
        let (mut store, _) = model::<f32>(12, 5);
        DataParallel::new(&comm, &mut store).map(|_| ())
    };
    let want = "rank 1's parameter 0 is \"mlp.0.weight\" f64 [5, 12] but rank 0's is \"mlp.0.weight\" f32 [5, 12]";
    match e {
        Err(e @ Error::ModelMismatch { rank: 1, .. }) => ensure(&comm, e.to_string().contains(want), e.to_string()),
        other => ensure(&comm, false, format!("an f64 rank 1 must fail everywhere, got {other:?}")),
    }
    say(&comm, "ok: a different dtype on rank 1 fails on every rank, naming f64 and f32");

    // The last rank has one parameter more.
    let (mut store, _): (ParamStore<f32>, _) = model(12, 5);
    if rank == size - 1 {
        store.add("extra.bias", Tensor::zeros(&[3]).unwrap()).unwrap();
    }
    let n = store.len();
    match DataParallel::new(&comm, &mut store) {
        Err(Error::ModelMismatch { rank: r, root, theirs, .. }) if r == size - 1 => {
            ensure(
                &comm,
                root.starts_with("nothing") && theirs == "\"extra.bias\" f32 [3]",
                format!("{root} / {theirs}"),
            );
        }
        other => ensure(&comm, false, format!("an extra parameter ({n}) must fail everywhere, got {other:?}")),
    }
    say(&comm, "ok: an extra parameter on the last rank fails on every rank, naming it");
}
