//! Checkpoints in the [safetensors] format: a little-endian header of JSON (names, dtypes,
//! shapes, offsets) followed by the raw tensor bytes, readable by the Python `safetensors`
//! package, PyTorch and candle.
//!
//! Parameter names are kept exactly (`"mlp.0.weight"`); tensors are written as `F32` or
//! `F64` after the store's element type, and either can be read into either (`F64` into
//! `f32` rounds to nearest). Loading into a store is all-or-nothing: every tensor is parsed
//! and checked against the store first, and any problem (a corrupt file, a missing or
//! unexpected tensor, a shape or dtype mismatch) is an [`Error::Io`] naming the tensors and
//! shapes involved, with the store unchanged.
//!
//! [safetensors]: https://huggingface.co/docs/safetensors

use std::borrow::Cow;
use std::collections::HashMap;
use std::path::Path;

use safetensors::tensor::{Dtype, SafeTensors, View};
use tapir::{Error, Float, ParamStore, Tensor};

use crate::optim::Stateful;

fn io(op: &'static str, detail: String) -> Error {
    Error::Io { op, detail }
}

/// One tensor's bytes, ready for `safetensors::serialize`.
struct Raw {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &Raw {
    fn dtype(&self) -> Dtype {
        self.dtype
    }

    fn shape(&self) -> &[usize] {
        &self.shape
    }

    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }

    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn raw<T: Float>(t: &Tensor<T>) -> Raw {
    let (dtype, bytes) = if T::NAME == "f32" {
        // `T` is f32 here, so the conversion through f64 is exact both ways.
        (Dtype::F32, t.data().iter().flat_map(|v| (v.to_f64() as f32).to_le_bytes()).collect())
    } else {
        (Dtype::F64, t.data().iter().flat_map(|v| v.to_f64().to_le_bytes()).collect())
    };
    Raw { dtype, shape: t.dims(), bytes }
}

/// The key safetensors reserves in its header for the file's metadata: a tensor of that
/// name would be written but make the file unreadable, so saving refuses it.
pub const RESERVED_NAME: &str = "__metadata__";

/// Serialises named tensors to safetensors bytes. Every file it writes can be read back
/// by [`read_checkpoint`].
///
/// # Errors
/// [`Error::Io`] if two tensors share a name, or a tensor is named [`RESERVED_NAME`]
/// (`"__metadata__"`, safetensors' header key; rename the parameter).
pub fn write_checkpoint<T: Float>(tensors: &[(&str, &Tensor<T>)]) -> tapir::Result<Vec<u8>> {
    write_checkpoint_with_metadata(tensors, &[])
}

/// Serialises named tensors to safetensors bytes, with `metadata` (string pairs, stored in
/// the header's `__metadata__` next to `"format": "tapir"`).
///
/// # Errors
/// [`Error::Io`] if two tensors share a name.
pub fn write_checkpoint_with_metadata<T: Float>(
    tensors: &[(&str, &Tensor<T>)],
    metadata: &[(&str, &str)],
) -> tapir::Result<Vec<u8>> {
    if tensors.iter().any(|(n, _)| *n == RESERVED_NAME) {
        return Err(io(
            "save",
            format!("a tensor is named {RESERVED_NAME:?}, the key safetensors reserves for metadata; rename it"),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    if let Some((dup, _)) = tensors.iter().find(|(n, _)| !seen.insert(*n)) {
        return Err(io("save", format!("two tensors are named {dup:?}; names must be unique")));
    }
    let raws: Vec<(&str, Raw)> = tensors.iter().map(|(n, t)| (*n, raw(t))).collect();
    let mut metadata: HashMap<String, String> = metadata.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    metadata.insert("format".to_string(), "tapir".to_string());
    safetensors::serialize(raws.iter().map(|(n, r)| (*n, r)), Some(metadata))
        .map_err(|e| io("save", format!("cannot serialise: {e}")))
}

/// Parses safetensors bytes into named tensors of element type `T`, in file order.
///
/// Accepts `F32` and `F64` tensors of rank up to [`tapir::MAX_RANK`]; never panics on
/// malformed input.
///
/// # Errors
/// [`Error::Io`] for a malformed header or data, or a tensor of another dtype or rank,
/// naming the tensor.
pub fn read_checkpoint<T: Float>(bytes: &[u8]) -> tapir::Result<Vec<(String, Tensor<T>)>> {
    let st = SafeTensors::deserialize(bytes).map_err(|e| io("load", format!("not a valid safetensors file: {e}")))?;
    let mut views = st.tensors();
    views.sort_by_key(|(_, v)| v.data().as_ptr() as usize);
    let mut out = Vec::with_capacity(views.len());
    for (name, view) in views {
        let data: Vec<T> = match view.dtype() {
            Dtype::F32 => view
                .data()
                .chunks_exact(4)
                .map(|c| T::from_f64(f32::from_le_bytes([c[0], c[1], c[2], c[3]]).into()))
                .collect(),
            Dtype::F64 => view
                .data()
                .chunks_exact(8)
                .map(|c| T::from_f64(f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]])))
                .collect(),
            other => {
                return Err(io("load", format!("tensor {name:?} has dtype {other:?}; only F32 and F64 can be loaded")))
            }
        };
        let shape = view.shape();
        let t = Tensor::from_vec(data, shape)
            .map_err(|e| io("load", format!("tensor {name:?} with shape {shape:?} cannot be a tensor: {e}")))?;
        out.push((name, t));
    }
    Ok(out)
}

/// The `__metadata__` string pairs of safetensors bytes (empty if there are none).
///
/// # Errors
/// [`Error::Io`] for a malformed header.
pub fn read_metadata(bytes: &[u8]) -> tapir::Result<HashMap<String, String>> {
    let (_, meta) =
        SafeTensors::read_metadata(bytes).map_err(|e| io("load", format!("not a valid safetensors file: {e}")))?;
    Ok(meta.metadata().clone().unwrap_or_default())
}

/// Tensors with their names, as a checkpoint holds them.
pub type NamedTensors<T> = Vec<(String, Tensor<T>)>;

/// Header metadata as key-value pairs.
pub type Metadata = Vec<(String, String)>;

/// An optimizer's state as named tensors and metadata, for a checkpoint: buffer `b` of
/// parameter `name` becomes the tensor `"{prefix}{b}.{name}"` (shaped like the parameter),
/// and the metadata holds `"{prefix}kind"`, `"{prefix}steps"` and `"{prefix}lr"` (the
/// learning rate, printed so that it parses back to the same bits).
///
/// # Errors
/// [`Error::Io`] if the optimizer's buffers do not match `store`.
pub fn optimizer_tensors<T: Float, O: Stateful<T> + ?Sized>(
    store: &ParamStore<T>,
    opt: &O,
    prefix: &str,
) -> tapir::Result<(NamedTensors<T>, Metadata)> {
    let mut tensors = Vec::new();
    for (buffer, per_param) in opt.buffers() {
        if per_param.len() != store.len() {
            return Err(io(
                "save",
                format!("optimizer buffer {buffer:?} has {} entries but the store {}", per_param.len(), store.len()),
            ));
        }
        for ((_, name, p), data) in store.iter().zip(per_param) {
            let t = Tensor::from_slice(data, &p.dims()).map_err(|e| {
                io("save", format!("optimizer buffer {buffer:?} of {name:?} does not fit shape {}: {e}", p.shape()))
            })?;
            tensors.push((format!("{prefix}{buffer}.{name}"), t));
        }
    }
    let metadata = vec![
        (format!("{prefix}kind"), opt.kind().to_string()),
        (format!("{prefix}steps"), opt.step_count().to_string()),
        (format!("{prefix}lr"), format!("{:?}", opt.lr())),
    ];
    Ok((tensors, metadata))
}

/// Restores an optimizer from [`optimizer_tensors`]' output, all-or-nothing: everything is
/// checked (kind, counters, every buffer of every parameter and its shape) before anything
/// is written. The learning rate must pass the constructors' check (finite in `f64` and in
/// `T`, non-negative) and the step count must leave room for one more step, exactly as
/// [`Optimizer::step`](crate::optim::Optimizer::step) requires.
///
/// # Errors
/// [`Error::Io`] naming the first missing or mismatched entry;
/// [`Error::InvalidArgument`] (naming `load_optimizer_tensors` and the caller's line) for a
/// learning rate or step count the optimizer would refuse. The optimizer is unchanged.
#[track_caller]
pub fn load_optimizer_tensors<T: Float, O: Stateful<T> + ?Sized>(
    store: &ParamStore<T>,
    opt: &mut O,
    prefix: &str,
    tensors: &HashMap<String, Tensor<T>>,
    metadata: &HashMap<String, String>,
) -> tapir::Result<()> {
    load_optimizer("load_optimizer_tensors", store, opt, prefix, tensors, metadata)
}

#[track_caller]
fn load_optimizer<T: Float, O: Stateful<T> + ?Sized>(
    op: &'static str,
    store: &ParamStore<T>,
    opt: &mut O,
    prefix: &str,
    tensors: &HashMap<String, Tensor<T>>,
    metadata: &HashMap<String, String>,
) -> tapir::Result<()> {
    let meta = |key: &str| {
        metadata
            .get(&format!("{prefix}{key}"))
            .ok_or_else(|| io("load", format!("the checkpoint has no optimizer entry {prefix}{key}")))
    };
    let kind = meta("kind")?;
    if kind != opt.kind() {
        return Err(io("load", format!("the checkpoint holds {kind} state but the optimizer is {}", opt.kind())));
    }
    let steps = meta("steps")?;
    let steps: u64 =
        steps.parse().map_err(|e| io("load", format!("optimizer step count {prefix}steps = {steps:?}: {e}")))?;
    let lr = meta("lr")?;
    let lr: f64 = lr.parse().map_err(|e| io("load", format!("optimizer learning rate {prefix}lr = {lr:?}: {e}")))?;
    // The same checks as the constructors and `step`, from the same functions.
    crate::optim::check_lr::<T>(op, lr)?;
    crate::optim::next_step(op, steps)?;
    let mut found = Vec::new();
    for (buffer, per_param) in opt.buffers() {
        if per_param.len() != store.len() {
            return Err(io(
                "load",
                format!("optimizer buffer {buffer} has {} entries but the store {}", per_param.len(), store.len()),
            ));
        }
        for ((_, name, p), data) in store.iter().zip(per_param) {
            let key = format!("{prefix}{buffer}.{name}");
            let t = tensors
                .get(&key)
                .ok_or_else(|| io("load", format!("optimizer tensor {key:?} is missing from the checkpoint")))?;
            if t.shape() != p.shape() || t.numel() != data.len() {
                return Err(io(
                    "load",
                    format!("optimizer tensor {key:?} has shape {} but parameter {name:?} {}", t.shape(), p.shape()),
                ));
            }
            found.push(key);
        }
    }
    let mut i = 0;
    for (_, per_param) in opt.buffers_mut() {
        for data in per_param.iter_mut() {
            data.copy_from_slice(tensors[&found[i]].data());
            i += 1;
        }
    }
    opt.set_step_count(steps);
    opt.set_lr(lr);
    Ok(())
}

/// An optimizer's state as safetensors bytes (see [`optimizer_tensors`], no prefix).
///
/// # Errors
/// As [`optimizer_tensors`].
pub fn optimizer_to_bytes<T: Float, O: Stateful<T> + ?Sized>(store: &ParamStore<T>, opt: &O) -> tapir::Result<Vec<u8>> {
    let (tensors, metadata) = optimizer_tensors(store, opt, "")?;
    let refs: Vec<(&str, &Tensor<T>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta: Vec<(&str, &str)> = metadata.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    write_checkpoint_with_metadata(&refs, &meta)
}

/// Restores an optimizer's state from [`optimizer_to_bytes`]' output; all-or-nothing, with
/// the checks of [`load_optimizer_tensors`].
///
/// # Errors
/// [`Error::Io`] for a malformed file or one that does not match the optimizer and store;
/// [`Error::InvalidArgument`] (naming `load_optimizer_bytes` and the caller's line) for a
/// learning rate or step count the optimizer would refuse. The optimizer is unchanged.
#[track_caller]
pub fn load_optimizer_bytes<T: Float, O: Stateful<T> + ?Sized>(
    store: &ParamStore<T>,
    opt: &mut O,
    bytes: &[u8],
) -> tapir::Result<()> {
    let tensors: HashMap<String, Tensor<T>> = read_checkpoint(bytes)?.into_iter().collect();
    load_optimizer("load_optimizer_bytes", store, opt, "", &tensors, &read_metadata(bytes)?)
}

/// The store's parameters as safetensors bytes, under their names.
///
/// # Errors
/// As [`write_checkpoint`].
pub fn to_bytes<T: Float>(store: &ParamStore<T>) -> tapir::Result<Vec<u8>> {
    let tensors: Vec<(&str, &Tensor<T>)> = store.iter().map(|(_, n, t)| (n, t)).collect();
    write_checkpoint(&tensors)
}

/// Replaces every parameter of `store` with the tensor of the same name in `bytes`.
/// All-or-nothing: on error the store is unchanged.
///
/// # Errors
/// [`Error::Io`] if the bytes are not a valid checkpoint, a parameter is missing from it,
/// it holds a tensor the store does not have, or a shape differs; the message names every
/// such tensor with both shapes.
pub fn load_bytes<T: Float>(store: &mut ParamStore<T>, bytes: &[u8]) -> tapir::Result<()> {
    let mut file: HashMap<String, Tensor<T>> = read_checkpoint(bytes)?.into_iter().collect();
    let mut problems = Vec::new();
    for (_, name, t) in store.iter() {
        match file.get(name) {
            None => problems.push(format!("tensor {name:?} (shape {}) is missing from the checkpoint", t.shape())),
            Some(f) if f.shape() != t.shape() => problems.push(format!(
                "tensor {name:?} has shape {} in the checkpoint but {} in the model",
                f.shape(),
                t.shape()
            )),
            Some(_) => {}
        }
    }
    let mut unexpected: Vec<&String> = file.keys().filter(|n| store.find(n).is_none()).collect();
    unexpected.sort();
    for name in unexpected {
        problems.push(format!("tensor {name:?} (shape {}) is not a parameter of the model", file[name].shape()));
    }
    if !problems.is_empty() {
        return Err(io(
            "load",
            format!("checkpoint does not match the model, nothing loaded: {}", problems.join("; ")),
        ));
    }
    let ids: Vec<(tapir::ParamId, String)> = store.iter().map(|(id, n, _)| (id, n.to_string())).collect();
    for (id, name) in ids {
        let src = file.remove(&name).expect("every parameter was found above");
        let dst = store.get_mut(id).expect("ids come from this store");
        *dst = src;
    }
    Ok(())
}

/// Writes the store's parameters to a safetensors file at `path`.
///
/// # Errors
/// As [`write_checkpoint`] (a refused store writes no file); [`Error::Io`] if the file cannot be written.
pub fn save<T: Float>(store: &ParamStore<T>, path: impl AsRef<Path>) -> tapir::Result<()> {
    let path = path.as_ref();
    let bytes = to_bytes(store)?;
    std::fs::write(path, bytes).map_err(|e| io("save", format!("cannot write {}: {e}", path.display())))
}

/// Loads a safetensors file into `store`; see [`load_bytes`].
///
/// # Errors
/// [`Error::Io`] if the file cannot be read, and as [`load_bytes`].
pub fn load<T: Float>(store: &mut ParamStore<T>, path: impl AsRef<Path>) -> tapir::Result<()> {
    let path = path.as_ref();
    let bytes = std::fs::read(path).map_err(|e| io("load", format!("cannot read {}: {e}", path.display())))?;
    load_bytes(store, &bytes).map_err(|e| match e {
        Error::Io { op, detail } => Error::Io { op, detail: format!("{}: {detail}", path.display()) },
        other => other,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn store<T: Float>() -> ParamStore<T> {
        let mut s = ParamStore::new();
        s.add(
            "layer.0.weight",
            Tensor::from_vec((0..6).map(|i| T::from_f64(i as f64 * 0.1)).collect(), &[2, 3]).unwrap(),
        )
        .unwrap();
        s.add("layer.0.bias", Tensor::from_vec(vec![T::from_f64(-1.5)], &[1]).unwrap()).unwrap();
        s.add("scalar", Tensor::scalar(T::from_f64(std::f64::consts::PI))).unwrap();
        s
    }

    #[test]
    fn round_trips_f32_and_f64_with_names() {
        let a = store::<f32>();
        let bytes = to_bytes(&a).unwrap();
        let mut b = store::<f32>();
        for (_, t) in b.iter_mut() {
            t.data_mut().fill(0.0);
        }
        load_bytes(&mut b, &bytes).unwrap();
        assert_eq!(
            a.iter().map(|(_, n, t)| (n.to_string(), t.clone())).collect::<Vec<_>>(),
            b.iter().map(|(_, n, t)| (n.to_string(), t.clone())).collect::<Vec<_>>()
        );
        let c = store::<f64>();
        let read = read_checkpoint::<f64>(&to_bytes(&c).unwrap()).unwrap();
        let mut names: Vec<&str> = read.iter().map(|(n, _)| n.as_str()).collect();
        names.sort();
        assert_eq!(names, ["layer.0.bias", "layer.0.weight", "scalar"]);
        let pi = read.iter().find(|(n, _)| n == "scalar").unwrap().1.item().unwrap();
        assert_eq!(pi, std::f64::consts::PI);
        // f32 files load into f64 stores exactly.
        let wide = read_checkpoint::<f64>(&bytes).unwrap();
        let w = wide.iter().find(|(n, _)| n == "layer.0.weight").unwrap();
        assert_eq!(w.1.data()[1], f64::from(0.1f32));
    }

    #[test]
    fn adam_state_round_trips_exactly() {
        use crate::optim::{Adam, Optimizer, Sgd};
        let mut s = store::<f64>();
        let mut grads = s.zeros_like().unwrap();
        let mut adam = Adam::new(&s, 0.1).unwrap();
        // Two steps on L = Σ p² (g = 2p) give non-trivial moments and a step count of 2.
        let mut g = tapir::Graph::new();
        for _ in 0..2 {
            grads.zero();
            g.scope(|sc| {
                let ids: Vec<tapir::ParamId> = s.iter().map(|(id, _, _)| id).collect();
                let mut l = sc.param(&s, ids[0]).square().sum();
                for &id in &ids[1..] {
                    l = l + sc.param(&s, id).square().sum();
                }
                sc.backward_into(l, &mut grads).unwrap();
            });
            adam.step(&mut s, &grads).unwrap();
        }
        adam.set_lr(0.037);
        let bytes = optimizer_to_bytes(&s, &adam).unwrap();
        let mut fresh = Adam::new(&s, 0.5).unwrap();
        load_optimizer_bytes(&s, &mut fresh, &bytes).unwrap();
        assert_eq!((fresh.steps(), fresh.lr()), (2, 0.037));
        assert_eq!(format!("{:?}", fresh.buffers()), format!("{:?}", adam.buffers()));
        // The wrong optimizer, or another model, loads nothing.
        let mut sgd = Sgd::new(&s, 0.1).unwrap();
        let e = load_optimizer_bytes(&s, &mut sgd, &bytes).unwrap_err().to_string();
        assert!(e.contains("holds Adam state but the optimizer is Sgd"), "{e}");
        let mut other = ParamStore::<f64>::new();
        other.add("layer.0.weight", Tensor::zeros(&[3, 2]).unwrap()).unwrap();
        let mut a2 = Adam::new(&other, 0.1).unwrap();
        let e = load_optimizer_bytes(&other, &mut a2, &bytes).unwrap_err().to_string();
        assert!(e.contains("\"m.layer.0.weight\" has shape [2, 3] but parameter \"layer.0.weight\" [3, 2]"), "{e}");
        assert_eq!(a2.steps(), 0);
    }

    #[test]
    fn duplicate_names_are_refused() {
        let t = Tensor::<f32>::zeros(&[1]).unwrap();
        let e = write_checkpoint(&[("a", &t), ("a", &t)]).unwrap_err();
        assert!(e.to_string().contains("\"a\""), "{e}");
    }
}
