//! The body of the cargo-fuzz target `optimizer_io`: arbitrary bytes through
//! [`load_optimizer_bytes`] (Adam, AdamW, SGD with and without momentum) and through
//! [`tapir_dist::checkpoint::from_bytes`]. The fuzz target and the replay test
//! (`tests/fuzz_replay.rs`) both call [`run_optimizer_io`]; [`seeds`] makes inputs that
//! reach past the parser (valid state with hostile metadata).
//!
//! Either loading fails, with the documented variant, and changes nothing (optimizer,
//! parameters); or it succeeds with state that the constructors accept (the learning rate
//! builds a fresh optimizer, the step counter can advance), and a following step, sampler
//! resume and shard never panic and, for the optimizer, succeed.

use tapir::{Error, ParamStore, Tensor};
use tapir_dist::checkpoint::{self, TrainState};
use tapir_dist::{DistributedSampler, SamplerState};
use tapir_nn::io::{load_optimizer_bytes, optimizer_tensors, write_checkpoint_with_metadata};
use tapir_nn::optim::{Adam, AdamW, Sgd, Stateful};

use crate::program::Finding;

fn store() -> ParamStore<f32> {
    let mut s = ParamStore::new();
    s.add("w", Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.0, 1.5, -0.25], &[2, 3]).expect("6 values"))
        .expect("a fresh name");
    s.add("b", Tensor::scalar(0.125)).expect("a fresh name");
    s
}

type Opt = Box<dyn Stateful<f32>>;

/// One optimizer of each kind, fresh, for `store` (the same on every call).
fn optimizers(store: &ParamStore<f32>) -> Vec<(&'static str, Opt)> {
    vec![
        ("Adam", Box::new(Adam::new(store, 0.01).expect("a valid lr"))),
        ("AdamW", Box::new(AdamW::new(store, 0.01, 0.1).expect("valid hyper-parameters"))),
        ("Sgd", Box::new(Sgd::new(store, 0.1).expect("a valid lr"))),
        ("Sgd+momentum", Box::new(Sgd::new(store, 0.1).and_then(|s| s.momentum(0.9, true)).expect("valid"))),
    ]
}

fn finding(bytes: &[u8], what: String) -> Finding {
    Finding { what, program: format!("optimizer state of {} bytes", bytes.len()) }
}

/// Everything an optimizer holds that loading may change, as text.
fn snapshot(opt: &dyn Stateful<f32>) -> String {
    format!("{} {} {} {:?}", opt.kind(), opt.lr().to_bits(), opt.step_count(), opt.buffers())
}

/// Loads `bytes` as optimizer state and as a `tapir_dist` checkpoint, and checks both.
///
/// # Errors
/// A [`Finding`] if a load fails with another variant, changes state on failure, or
/// yields state that the constructors would refuse or whose next step fails.
pub fn run_optimizer_io(bytes: &[u8]) -> Result<(), Finding> {
    let base = store();
    for (name, mut opt) in optimizers(&base) {
        let before = snapshot(opt.as_ref());
        match load_optimizer_bytes(&base, opt.as_mut(), bytes) {
            Err(Error::Io { op: "load", .. } | Error::InvalidArgument { op: "load_optimizer_bytes", .. }) => {
                if snapshot(opt.as_ref()) != before {
                    return Err(finding(bytes, format!("{name}: a failed load changed the optimizer")));
                }
            }
            Err(e) => return Err(finding(bytes, format!("{name}: load_optimizer_bytes failed with {e:?}"))),
            Ok(()) => check_loaded(bytes, name, &base, opt.as_mut())?,
        }
        let mut s = base.clone();
        let before = (snapshot(opt.as_ref()), tapir_dist::params_hash(&s));
        match checkpoint::from_bytes(&mut s, opt.as_mut(), bytes) {
            Err(_) => {
                if (snapshot(opt.as_ref()), tapir_dist::params_hash(&s)) != before {
                    return Err(finding(bytes, format!("{name}: a failed checkpoint load changed state")));
                }
            }
            Ok(state) => {
                check_loaded(bytes, name, &s, opt.as_mut())?;
                resume_sampler(&state);
            }
        }
    }
    Ok(())
}

/// The loaded optimizer passes the constructors' checks, and steps.
fn check_loaded(bytes: &[u8], name: &str, store: &ParamStore<f32>, opt: &mut dyn Stateful<f32>) -> Result<(), Finding> {
    if let Err(e) = Sgd::new(store, opt.lr()) {
        return Err(finding(bytes, format!("{name}: loaded a learning rate the constructors refuse: {e}")));
    }
    if opt.step_count() == u64::MAX {
        return Err(finding(bytes, format!("{name}: loaded a step counter that cannot advance")));
    }
    let mut s = store.clone();
    let grads = s.zeros_like().map_err(|e| finding(bytes, format!("zeros_like: {e}")))?;
    opt.step(&mut s, &grads).map_err(|e| finding(bytes, format!("{name}: the step after a load failed: {e}")))
}

/// Resuming a sampler at a loaded position either works or is refused; its next shard
/// never panics.
fn resume_sampler(state: &TrainState) {
    let mut sampler = DistributedSampler::new(10, 3, 1, 2, 0).expect("valid sampler");
    if sampler.set_state(state.sampler).is_ok() {
        let _ = sampler.next_shard();
    }
    let _ = sampler.global(state.sampler.batch);
    let _ = sampler.shard(state.sampler.batch);
    let _ = SamplerState::default();
}

/// Valid optimizer state and checkpoints with hostile metadata: the inputs a byte-level
/// fuzzer needs long to build, for the replay test and the fuzz corpus.
pub fn seeds() -> Vec<Vec<u8>> {
    let base = store();
    let hostile = [
        ("lr", "NaN"),
        ("lr", "-1"),
        ("lr", "inf"),
        ("lr", "1e39"),
        ("lr", "0.001"),
        ("steps", "18446744073709551615"),
        ("steps", "18446744073709551614"),
        ("steps", "-1"),
        ("kind", "Sgd"),
    ];
    let mut out = Vec::new();
    for (_, opt) in optimizers(&base) {
        for (key, value) in hostile {
            for prefix in ["", "optim."] {
                let (tensors, mut meta) = optimizer_tensors(&base, opt.as_ref(), prefix).expect("matching store");
                let full = format!("{prefix}{key}");
                meta.iter_mut().filter(|(k, _)| *k == full).for_each(|(_, v)| *v = value.to_string());
                let mut tensors = tensors;
                if !prefix.is_empty() {
                    // A whole checkpoint: the parameters and the training state too.
                    for (_, n, t) in base.iter() {
                        tensors.push((format!("param.{n}"), t.clone()));
                    }
                    for (k, v) in [("train.step", "3"), ("sampler.epoch", "1"), ("sampler.batch", value)] {
                        meta.push((k.to_string(), v.to_string()));
                    }
                }
                let refs: Vec<(&str, &Tensor<f32>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
                let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
                out.push(write_checkpoint_with_metadata(&refs, &meta).expect("unique names"));
            }
        }
    }
    out
}
