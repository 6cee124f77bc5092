//! Faults, one mode per run (`mpi_faults MODE`), launched by `tests/run-mpi.sh` under
//! `timeout`, so a hang fails the test instead of stalling CI:
//!
//! - `error`: the last rank's step returns an error at step 3; every rank must end the
//!   step with `RankFailed` naming that rank and its message, and so must a failed
//!   `agree` (work outside a step). Exits 0 when every rank saw that.
//! - `panic`: the same with a panic inside the step.
//! - `panic-outside`: the last rank panics outside a step; the panic hook calls
//!   `MPI_Abort` and mpirun ends every rank (the script expects a non-zero exit, fast).
//! - `kill`: the last rank kills itself with SIGKILL mid-run; mpirun tears the job down
//!   (the script expects a non-zero exit, fast).
//! - `return`: the last rank's `main` body returns an error outside a step while the others
//!   enter the next all-reduce; `Mpi::run` aborts the job instead of hanging in
//!   `MPI_Finalize`.

mod common;

use common::*;
use tapir::Graph;
use tapir_dist::{Comm, DataParallel, Error, Mpi};
use tapir_nn::optim::{Optimizer, Sgd};

fn main() -> std::process::ExitCode {
    Mpi::run(body)
}

fn body(comm: &Mpi) -> Result<(), Box<dyn std::error::Error>> {
    let mode = std::env::args().nth(1).expect("usage: mpi_faults error|panic|panic-outside|kill|return");
    let (rank, size) = (comm.rank(), comm.size());
    let victim = size - 1;
    let d = data::<f32>(64, 1);
    let (mut store, mlp) = model::<f32>(8, 1);
    let mut dp = DataParallel::new(comm, &mut store).unwrap();
    let mut grads = store.zeros_like()?;
    let mut opt = Sgd::new(&store, 0.1)?;
    let mut graph = Graph::new();
    for step in 0..10 {
        if step == 3 && rank == victim {
            match mode.as_str() {
                "panic-outside" => panic!("rank {rank} lost its data loader"),
                "return" => return Err(format!("rank {rank} cannot open its next shard").into()),
                "kill" => {
                    let _ = std::process::Command::new("kill").args(["-9", &std::process::id().to_string()]).status();
                    std::thread::sleep(std::time::Duration::from_secs(60));
                }
                _ => {}
            }
        }
        let idx: Vec<usize> = (rank * 4..rank * 4 + 4).collect();
        let result = dp.step(&mut grads, |g| {
            if step == 3 && rank == victim {
                match mode.as_str() {
                    "error" => return Err(format!("disk full on rank {rank}")),
                    "panic" => panic!("index {} out of range on rank {rank}", 99),
                    _ => {}
                }
            }
            local_grad(&mut graph, &store, &mlp, &d, &idx, g).map_err(|e| e.to_string())?;
            Ok(idx.len())
        });
        match (step, result) {
            (3, Err(Error::RankFailed { rank: r, size: s, message, .. })) => {
                let want = if mode == "error" { "disk full" } else { "panicked: index 99 out of range" };
                ensure(comm, r == victim && s == size && message.contains(want), format!("step 3: {message}"));
                eprintln!("rank {rank}: step 3 failed as expected: rank {r} of {s}: {message}");
                break;
            }
            (_, Ok(_)) if step != 3 => opt.step(&mut store, &grads).unwrap(),
            (_, other) => ensure(comm, false, format!("mode {mode}, step {step}: unexpected {other:?}")),
        }
    }
    // A failure outside a step: `agree` turns it into the same error everywhere.
    let loaded: Result<(), String> = if rank == victim { Err("cannot open shard 7".into()) } else { Ok(()) };
    match dp.agree(loaded) {
        Err(e) => ensure(
            comm,
            e.to_string().contains(&format!("rank {victim} of {size} failed")) && e.to_string().contains("shard 7"),
            e.to_string(),
        ),
        Ok(()) => ensure(comm, false, "agree must fail on every rank"),
    }
    say(comm, format!("ok: mode {mode}: every rank ended with an error naming rank {victim}"));
    Ok(())
}
