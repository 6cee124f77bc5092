//! Resumable checkpoints: everything a resumed run needs to continue bit-identically, in
//! one safetensors file written by rank 0 and read by rank 0, which broadcasts its bytes
//! (so the ranks need no shared filesystem to resume).
//!
//! | what                          | where in the file                                   |
//! |-------------------------------|-----------------------------------------------------|
//! | parameters                    | tensors `param.{name}`                               |
//! | optimizer buffers (Adam m, v) | tensors `optim.{buffer}.{name}`                      |
//! | optimizer kind, steps, lr     | metadata `optim.kind`, `optim.steps`, `optim.lr`     |
//! | training step (the schedule's)| metadata `train.step`                               |
//! | sampler epoch and batch       | metadata `sampler.epoch`, `sampler.batch`            |
//! | RNG states                    | metadata `rng.{name}` (a [`SplitMix64`](crate::SplitMix64) state) |
//! | world size when written       | metadata `train.world_size` (informational)         |
//!
//! Every rank holds the same parameters and optimizer state (the reduction is bitwise
//! identical), so rank 0's copy stands for all of them.

use std::collections::HashMap;
use std::path::Path;

use tapir::{Float, ParamStore, Tensor};
use tapir_nn::io;
use tapir_nn::optim::Stateful;

use crate::comm::Comm;
use crate::data_parallel::DataParallel;
use crate::error::{invalid, Error, Result};
use crate::sampler::SamplerState;

/// The training-loop state next to the parameters and the optimizer.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TrainState {
    /// Optimizer steps taken; the learning-rate schedule's next step.
    pub step: u64,
    /// Where the sampler is.
    pub sampler: SamplerState,
    /// Named RNG states (for example a [`SplitMix64`](crate::SplitMix64) for data
    /// augmentation), restored as they were saved.
    pub rngs: Vec<(String, u64)>,
}

/// Serialises parameters, optimizer state and `state` to safetensors bytes.
///
/// # Errors
/// [`Error::Tapir`] if the optimizer's buffers do not match `store`.
pub fn to_bytes<T: Float, O: Stateful<T> + ?Sized>(
    store: &ParamStore<T>,
    opt: &O,
    state: &TrainState,
    world_size: usize,
) -> Result<Vec<u8>> {
    let mut tensors: Vec<(String, Tensor<T>)> =
        store.iter().map(|(_, name, t)| (format!("param.{name}"), t.clone())).collect();
    let (optim, mut meta) = io::optimizer_tensors(store, opt, "optim.")?;
    tensors.extend(optim);
    meta.push(("train.step".into(), state.step.to_string()));
    meta.push(("train.world_size".into(), world_size.to_string()));
    meta.push(("sampler.epoch".into(), state.sampler.epoch.to_string()));
    meta.push(("sampler.batch".into(), state.sampler.batch.to_string()));
    for (name, s) in &state.rngs {
        meta.push((format!("rng.{name}"), s.to_string()));
    }
    let refs: Vec<(&str, &Tensor<T>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Ok(io::write_checkpoint_with_metadata(&refs, &meta)?)
}

/// Restores parameters and optimizer state from [`to_bytes`]' output and returns the
/// training state. All-or-nothing: on error `store` and `opt` are unchanged.
///
/// # Errors
/// [`Error::InvalidArgument`] naming the first missing or mismatched entry (a parameter,
/// an optimizer buffer, a metadata field).
#[track_caller]
pub fn from_bytes<T: Float, O: Stateful<T> + ?Sized>(
    store: &mut ParamStore<T>,
    opt: &mut O,
    bytes: &[u8],
) -> Result<TrainState> {
    const OP: &str = "checkpoint::from_bytes";
    let mut tensors: HashMap<String, Tensor<T>> = io::read_checkpoint(bytes)?.into_iter().collect();
    let meta = io::read_metadata(bytes)?;
    // Parsed without closures that build errors: `#[track_caller]` does not pass through
    // closures, and every error must name the caller's line.
    let location = std::panic::Location::caller();
    let fail = |detail: String| Error::InvalidArgument { op: OP, detail, location };
    let number = |key: &str| -> Result<u64> {
        let v = meta.get(key).ok_or_else(|| fail(format!("the checkpoint has no metadata {key}")))?;
        v.parse().map_err(|e| fail(format!("metadata {key} = {v:?} is not a count: {e}")))
    };
    let step = number("train.step")?;
    let batch = number("sampler.batch")?;
    let sampler = SamplerState {
        epoch: number("sampler.epoch")?,
        batch: usize::try_from(batch)
            .map_err(|_| fail(format!("metadata sampler.batch = {batch} does not fit a usize on this machine")))?,
    };
    let mut rngs: Vec<(String, u64)> = Vec::new();
    for key in meta.keys().filter(|k| k.starts_with("rng.")) {
        rngs.push((key["rng.".len()..].to_string(), number(key)?));
    }
    rngs.sort();
    for (_, name, t) in store.iter() {
        let key = format!("param.{name}");
        match tensors.get(&key) {
            None => return Err(fail(format!("parameter {name:?} (shape {}) is not in the checkpoint", t.shape()))),
            Some(f) if f.shape() != t.shape() => {
                return Err(fail(format!(
                    "parameter {name:?} has shape {} in the checkpoint but {} in the model",
                    f.shape(),
                    t.shape()
                )))
            }
            Some(_) => {}
        }
    }
    // Checks every optimizer entry before writing any, so a failure here leaves both
    // the optimizer and (not yet written) the parameters unchanged.
    io::load_optimizer_tensors(store, opt, "optim.", &tensors, &meta)?;
    let names: Vec<(tapir::ParamId, String)> = store.iter().map(|(id, n, _)| (id, format!("param.{n}"))).collect();
    for (id, key) in names {
        let src = tensors.remove(&key).expect("every parameter was found above");
        *store.get_mut(id)? = src;
    }
    Ok(TrainState { step, sampler, rngs })
}

/// Writes a checkpoint to `path` from rank 0 (to `path.tmp`, then renamed, so a crash
/// never leaves half a file). Collective: every rank calls it and gets the same result.
///
/// # Errors
/// [`Error::RankFailed`] on every rank if rank 0 could not write the file.
pub fn save<T: Float, C: Comm, O: Stateful<T> + ?Sized>(
    dp: &mut DataParallel<T, C>,
    path: impl AsRef<Path>,
    store: &ParamStore<T>,
    opt: &O,
    state: &TrainState,
) -> Result<()> {
    let result = if dp.rank() == 0 { write_file(path.as_ref(), store, opt, state, dp.size()) } else { Ok(()) };
    dp.agree(result)
}

fn write_file<T: Float, O: Stateful<T> + ?Sized>(
    path: &Path,
    store: &ParamStore<T>,
    opt: &O,
    state: &TrainState,
    world: usize,
) -> Result<()> {
    let bytes = to_bytes(store, opt, state, world)?;
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| invalid("checkpoint::save", format!("cannot write {}: {e}", path.display())))
}

/// Loads a checkpoint on every rank: rank 0 reads `path` and broadcasts its bytes.
/// Collective; every rank gets the same result.
///
/// # Errors
/// [`Error::RankFailed`] on every rank if rank 0 cannot read the file or it does not
/// match the model and optimizer (nothing is loaded anywhere then).
#[track_caller]
pub fn load<T: Float, C: Comm, O: Stateful<T> + ?Sized>(
    dp: &mut DataParallel<T, C>,
    path: impl AsRef<Path>,
    store: &mut ParamStore<T>,
    opt: &mut O,
) -> Result<TrainState> {
    let path = path.as_ref();
    let location = std::panic::Location::caller();
    let mut bytes = Vec::new();
    let read = if dp.rank() == 0 {
        std::fs::read(path).map(|b| bytes = b).map_err(|e| Error::InvalidArgument {
            op: "checkpoint::load",
            detail: format!("cannot read {}: {e}", path.display()),
            location,
        })
    } else {
        Ok(())
    };
    dp.agree(read)?;
    dp.comm().broadcast_bytes(0, &mut bytes);
    // Every rank parses the same bytes against the same model, so they agree; `agree`
    // still guards against a rank whose model differs.
    let parsed = from_bytes(store, opt, &bytes);
    dp.agree(parsed.map_err(|e: Error| e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::comm::Local;
    use tapir_nn::optim::{Adam, Sgd};

    fn store() -> ParamStore<f32> {
        let mut s = ParamStore::new();
        s.add("a", Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap()).unwrap();
        s.add("b", Tensor::scalar(-0.5)).unwrap();
        s
    }

    #[test]
    fn everything_round_trips_through_a_file() {
        let mut s = store();
        let mut dp = DataParallel::new(Local, &mut s).unwrap();
        let mut opt = Adam::new(&s, 0.01).unwrap();
        opt.set_step_count(7);
        let state = TrainState {
            step: 7,
            sampler: SamplerState { epoch: 2, batch: 3 },
            rngs: vec![("augment".into(), u64::MAX - 3)],
        };
        let dir = std::env::temp_dir().join(format!("tapir-dist-ckpt-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("run.safetensors");
        save(&mut dp, &path, &s, &opt, &state).unwrap();
        let mut s2 = store();
        s2.iter_mut().for_each(|(_, t)| t.data_mut().fill(0.0));
        let mut opt2 = Adam::new(&s2, 0.5).unwrap();
        let got = load(&mut dp, &path, &mut s2, &mut opt2).unwrap();
        assert_eq!(got, state);
        assert_eq!(crate::data_parallel::params_hash(&s2), crate::data_parallel::params_hash(&s));
        assert_eq!((opt2.steps(), tapir_nn::optim::Optimizer::lr(&opt2)), (7, 0.01));
        // Another optimizer or a missing file: an error, nothing loaded.
        let mut sgd = Sgd::new(&s2, 0.1).unwrap();
        let e = load(&mut dp, &path, &mut s2, &mut sgd).unwrap_err().to_string();
        assert!(e.contains("holds Adam state but the optimizer is Sgd"), "{e}");
        let e = load(&mut dp, dir.join("nope"), &mut s2, &mut opt2).unwrap_err().to_string();
        assert!(e.contains("cannot read") && e.contains("rank 0 of 1 failed"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
