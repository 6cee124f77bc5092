//! Issue #31's classes in tapir-nn: optimizer state loaded from bytes is validated as the
//! constructors validate it (and changes nothing on error), the step counter cannot wrap,
//! and layer errors name the constructor or layer called, every size and the caller's line.
//!
//! Every test asserts the variant and the whole message (the location is checked apart,
//! as `line!()`).

use std::collections::HashMap;

use rand::SeedableRng;
use tapir::{Error, Graph, ParamStore, Tensor};
use tapir_nn::io::{load_optimizer_bytes, optimizer_tensors, write_checkpoint_with_metadata};
use tapir_nn::optim::{Adam, Optimizer, Sgd, Stateful};
use tapir_nn::{CausalSelfAttention, Conv2d, Ctx, Embedding, Gpt, GptConfig, Init, Linear, Module, TransformerBlock};

/// `e`'s message without its ` (at file:line:col)` suffix, and that location's line,
/// after checking that it is in this file.
fn split(e: &Error) -> (String, u32) {
    let at = e.location().unwrap_or_else(|| panic!("a located error: {e}"));
    assert_eq!(at.file(), file!(), "{e}");
    let text = e.to_string();
    let suffix = format!(" (at {at})");
    (text.strip_suffix(&suffix).unwrap_or_else(|| panic!("{text:?} ends with {suffix:?}")).to_string(), at.line())
}

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(5)
}

fn store() -> ParamStore<f32> {
    let mut s = ParamStore::new();
    s.add("w", Tensor::from_vec(vec![1.0, -2.0, 3.0], &[3]).unwrap()).unwrap();
    s
}

/// Adam state for `store()` with the metadata `key` replaced by `value`.
fn adam_bytes_with(key: &str, value: &str) -> Vec<u8> {
    let s = store();
    let mut adam = Adam::new(&s, 0.01).unwrap();
    adam.set_step_count(4);
    let (tensors, mut meta) = optimizer_tensors(&s, &adam, "").unwrap();
    meta.iter_mut().filter(|(k, _)| k == key).for_each(|(_, v)| *v = value.to_string());
    let refs: Vec<(&str, &Tensor<f32>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta: Vec<(&str, &str)> = meta.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    write_checkpoint_with_metadata(&refs, &meta).unwrap()
}

#[test]
fn loading_refuses_what_the_constructors_refuse_and_changes_nothing() {
    let s = store();
    let cases = [
        ("lr", "NaN", "load_optimizer_bytes: learning rate NaN must be finite in f32 and in 0.0.."),
        ("lr", "-0.5", "load_optimizer_bytes: learning rate -0.5 must be finite in f32 and in 0.0.."),
        ("lr", "inf", "load_optimizer_bytes: learning rate inf must be finite in f32 and in 0.0.."),
        // Finite in f64 but not in f32: the constructor refuses it too.
        ("lr", "1e39", "load_optimizer_bytes: learning rate 1e39 must be finite in f32 and in 0.0.."),
        (
            "steps",
            "18446744073709551615",
            "load_optimizer_bytes: step count 18446744073709551615 is the u64 limit; the next step cannot be counted",
        ),
    ];
    for (key, value, want) in cases {
        // `{}` of 1e39 writes all its digits.
        let want = want.replace("1e39", &format!("{}", 1e39f64));
        let bytes = adam_bytes_with(key, value);
        let mut opt = Adam::new(&s, 0.25).unwrap();
        let before = format!("{opt:?}");
        let line = line!() + 1;
        let e = load_optimizer_bytes(&s, &mut opt, &bytes).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { op: "load_optimizer_bytes", .. }), "{e}");
        assert_eq!(split(&e), (want.clone(), line), "{key} = {value}");
        assert_eq!(format!("{opt:?}"), before, "{key} = {value}: the optimizer is unchanged");
        // The constructor says the same of the same learning rate (one check, shared).
        if let (Ok(lr), "lr") = (value.parse::<f64>(), key) {
            let e = Adam::new(&s, lr).unwrap_err().to_string();
            assert!(e.starts_with(&want.replace("load_optimizer_bytes", "Adam::new")), "{e}");
        }
    }
    // One step below the limit loads, and its next step is refused rather than wrapped.
    let mut opt = Adam::new(&s, 0.25).unwrap();
    load_optimizer_bytes(&s, &mut opt, &adam_bytes_with("steps", "18446744073709551614")).unwrap();
    let mut s2 = s.clone();
    let grads = s2.zeros_like().unwrap();
    opt.step(&mut s2, &grads).unwrap();
    let line = line!() + 1;
    let e = opt.step(&mut s2, &grads).unwrap_err();
    let want = "Adam::step: step count 18446744073709551615 is the u64 limit; the next step cannot be counted";
    assert!(matches!(e, Error::InvalidArgument { op: "Adam::step", .. }), "{e}");
    assert_eq!(split(&e), (want.to_string(), line));
    let w = s2.find("w").unwrap();
    let after_one = s2.get(w).unwrap().data().to_vec();
    assert!(opt.step(&mut s2, &grads).is_err());
    assert_eq!(s2.get(w).unwrap().data(), &after_one[..], "a refused step changes no parameter");
}

#[test]
fn a_missing_optimizer_key_is_named_plainly() {
    let s = store();
    let adam = Adam::new(&s, 0.01).unwrap();
    let (tensors, meta) = optimizer_tensors(&s, &adam, "optim.").unwrap();
    let tensors: HashMap<String, Tensor<f32>> = tensors.into_iter().collect();
    let meta: HashMap<String, String> = meta.into_iter().filter(|(k, _)| k != "optim.lr").collect();
    let mut fresh = Adam::new(&s, 0.5).unwrap();
    let e = tapir_nn::io::load_optimizer_tensors(&s, &mut fresh, "optim.", &tensors, &meta).unwrap_err();
    assert!(matches!(e, Error::Io { op: "load", .. }), "{e}");
    assert_eq!(e.to_string(), "load: the checkpoint has no optimizer entry optim.lr");
    // Sgd has no counter, but a corrupt one is refused all the same (it never writes one).
    let mut sgd = Sgd::new(&s, 0.1).unwrap();
    let (t, mut m) = optimizer_tensors(&s, &sgd, "").unwrap();
    m.iter_mut().filter(|(k, _)| k == "lr").for_each(|(_, v)| *v = "NaN".into());
    let refs: Vec<(&str, &Tensor<f32>)> = t.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let meta: Vec<(&str, &str)> = m.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let bytes = write_checkpoint_with_metadata(&refs, &meta).unwrap();
    let e = load_optimizer_bytes(&s, &mut sgd, &bytes).unwrap_err();
    assert!(e.to_string().starts_with("load_optimizer_bytes: learning rate NaN must be finite"), "{e}");
    assert_eq!(sgd.lr(), 0.1);
}

#[test]
fn zero_sizes_name_the_constructor_called_and_the_callers_line() {
    let mut store = ParamStore::<f32>::new();
    let mut r = rng();
    type Made = Result<(), Error>;
    let cases: Vec<(Made, u32, &str)> = vec![
        (
            Linear::new(&mut store, "a", 0, 4, &mut r).map(drop),
            line!() - 1,
            "Linear::new: fan_in 0 and fan_out 4 must be positive (weight [0, 4])",
        ),
        (
            Linear::with_init(&mut store, "b", 3, 0, Init::Constant(1.0), true, &mut r).map(drop),
            line!() - 1,
            "Linear::with_init: fan_in 3 and fan_out 0 must be positive (weight [3, 0])",
        ),
        (
            Linear::with_init(&mut store, "c", 3, 2, Init::XavierUniform { gain: f64::NAN }, true, &mut r).map(drop),
            line!() - 1,
            "Linear::with_init: scale NaN is not finite in f32",
        ),
        (
            Embedding::new(&mut store, "d", 0, 4, &mut r).map(drop),
            line!() - 1,
            "Embedding::new: count 0 and dim 4 must be positive",
        ),
        (
            Conv2d::new(&mut store, "e", 2, 3, [0, 3], &mut r).map(drop),
            line!() - 1,
            "Conv2d::new: in_channels 2, out_channels 3 and kernel [0, 3] must be positive",
        ),
        (
            TransformerBlock::new(&mut store, "f", 0, 1, 4, 0.02, 0.02, &mut r).map(drop),
            line!() - 1,
            "TransformerBlock::new: dim 0 must be a positive multiple of heads 1, and context 4 positive",
        ),
        (
            TransformerBlock::new(&mut store, "g", usize::MAX, 1, 4, 0.02, 0.02, &mut r).map(drop),
            line!() - 1,
            "TransformerBlock::new: the MLP width 4·dim = 4 × 18446744073709551615 overflows usize",
        ),
        (
            CausalSelfAttention::new(&mut store, "h", usize::MAX, 1, 4, Init::RELU, &mut r).map(drop),
            line!() - 1,
            "CausalSelfAttention::new: the qkv width 3·dim = 3 × 18446744073709551615 overflows usize",
        ),
        (
            Gpt::new(&mut store, GptConfig { vocab: 5, context: 4, dim: 0, heads: 1, layers: 1 }, &mut r).map(drop),
            line!() - 1,
            "Gpt::new: vocab 5, layers 1 and context 4 must be positive, and dim 0 a positive multiple of heads 1",
        ),
    ];
    for (made, line, want) in cases {
        let e = made.unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert_eq!(split(&e), (want.to_string(), line));
    }
    assert!(store.is_empty(), "a refused constructor adds nothing");
}

#[test]
fn a_huge_layer_count_is_out_of_memory_not_an_abort() {
    let mut store = ParamStore::<f32>::new();
    let config = GptConfig { vocab: 5, context: 4, dim: 4, heads: 1, layers: usize::MAX };
    let line = line!() + 1;
    let e = Gpt::new(&mut store, config, &mut rng()).unwrap_err();
    assert!(matches!(e, Error::TensorOutOfMemory { op: "Gpt::new", requested: usize::MAX, .. }), "{e}");
    let want = format!("Gpt::new: out of memory allocating {} bytes for a tensor of shape []", usize::MAX);
    assert_eq!(split(&e), (want, line));
    assert!(store.is_empty());
}

#[test]
fn attention_checks_the_rank_before_the_context() {
    let mut store = ParamStore::<f64>::new();
    let attn = CausalSelfAttention::new(&mut store, "a", 4, 2, 3, Init::RELU, &mut rng()).unwrap();
    let cases: [(&[usize], &str); 3] = [
        (&[5, 4], "CausalSelfAttention::forward: expects [batch, time, channels], got input [5, 4]"),
        (&[1, 2, 6], "CausalSelfAttention::forward: input [1, 2, 6] has 6 channels but the layer's width is 4"),
        (&[1, 5, 4], "CausalSelfAttention::forward: input [1, 5, 4] has 5 positions, more than the context of 3"),
    ];
    for (dims, want) in cases {
        let x = Tensor::<f64>::zeros(dims).unwrap();
        let mut g = Graph::new();
        let (e, line) = g.scope(|s| {
            let line = line!() + 1;
            let y = attn.forward(Ctx::eval(s, &store), s.input(&x));
            (y.value().map(<[f64]>::len).unwrap_err(), line)
        });
        assert!(matches!(e, Error::InvalidArgument { op: "CausalSelfAttention::forward", .. }), "{e}");
        assert_eq!(split(&e), (want.to_string(), line));
    }
}
