//! Checkpoints: interoperability with the Python `safetensors` package (fixtures written
//! and checked in numpy by `tests/fixtures/make_fixture.py`), round trips, and corrupt or
//! mismatched files, which must fail with a clear error and load nothing.

use std::path::PathBuf;

use rand::SeedableRng;
use tapir::{Error, Float, Graph, ParamStore, Tensor};
use tapir_nn::{io, Ctx, Mlp, Module};

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

/// The fixture's architecture, 4 -> 8 (ReLU) -> 3, freshly initialised.
fn model<T: Float>(hidden: usize) -> (ParamStore<T>, Mlp) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(99);
    let mut store = ParamStore::new();
    let mlp = Mlp::builder(4).hidden(hidden).output(3).build(&mut store, "mlp", &mut rng).unwrap();
    (store, mlp)
}

fn io_tensor(name: &str) -> Tensor<f64> {
    let bytes = std::fs::read(fixture("mlp_io.safetensors")).unwrap();
    io::read_checkpoint::<f64>(&bytes).unwrap().into_iter().find(|(n, _)| n == name).unwrap().1
}

fn outputs<T: Float>(store: &ParamStore<T>, mlp: &Mlp, x: &Tensor<T>) -> Vec<f64> {
    let mut g = Graph::new();
    g.scope(|s| mlp.forward(Ctx::eval(s, store), s.input(x)).value().unwrap().iter().map(|v| v.to_f64()).collect())
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}

fn snapshot<T: Float>(store: &ParamStore<T>) -> Vec<(String, Tensor<T>)> {
    store.iter().map(|(_, n, t)| (n.to_string(), t.clone())).collect()
}

#[test]
fn python_checkpoints_give_the_numpy_outputs() {
    let x64 = io_tensor("inputs");
    let x32 = Tensor::<f32>::from_vec(x64.data().iter().map(|&v| v as f32).collect(), &x64.dims()).unwrap();
    assert_eq!(x64.dims(), [5, 4]);

    // F32 file into an f32 model: f32 arithmetic, so within 1e-6 of numpy's f64.
    let (mut store, mlp) = model::<f32>(8);
    io::load(&mut store, fixture("mlp_f32.safetensors")).unwrap();
    let want = io_tensor("outputs_f32");
    let d = max_diff(&outputs(&store, &mlp, &x32), want.data());
    assert!(d < 1e-6, "f32 model differs from numpy by {d}");

    // F32 file into an f64 model: the widening is exact, so only rounding in the sums remains.
    let (mut store, mlp) = model::<f64>(8);
    io::load(&mut store, fixture("mlp_f32.safetensors")).unwrap();
    let d = max_diff(&outputs(&store, &mlp, &x64), want.data());
    assert!(d < 1e-12, "f64 model with f32 weights differs from numpy by {d}");

    // F64 file into an f64 model.
    io::load(&mut store, fixture("mlp_f64.safetensors")).unwrap();
    let d = max_diff(&outputs(&store, &mlp, &x64), io_tensor("outputs_f64").data());
    assert!(d < 1e-12, "f64 model differs from numpy by {d}");
}

#[test]
fn names_shapes_and_values_survive_a_round_trip_through_a_file() {
    let (store, mlp) = model::<f64>(8);
    let dir = std::env::temp_dir().join(format!("tapir-nn-ckpt-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("mlp.safetensors");
    io::save(&store, &path).unwrap();
    // The same architecture built again: its own store, so its own ids (ids are tied to
    // the store they were made in).
    let (mut other, other_mlp) = model::<f64>(8);
    for (_, t) in other.iter_mut() {
        t.data_mut().fill(0.0);
    }
    io::load(&mut other, &path).unwrap();
    assert_eq!(snapshot(&store), snapshot(&other));
    let x = Tensor::<f64>::ones(&[2, 4]).unwrap();
    assert_eq!(outputs(&store, &mlp, &x), outputs(&other, &other_mlp, &x));
    let names: Vec<String> =
        io::read_checkpoint::<f32>(&std::fs::read(&path).unwrap()).unwrap().into_iter().map(|(n, _)| n).collect();
    let mut sorted = names.clone();
    sorted.sort();
    assert_eq!(sorted, ["mlp.0.bias", "mlp.0.weight", "mlp.1.bias", "mlp.1.weight"]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Loads `bytes` into a fresh model, expects an `Io` error mentioning every `needle`, and
/// checks the store was left untouched.
fn refuses(bytes: &[u8], hidden: usize, needles: &[&str]) {
    let (mut store, _) = model::<f32>(hidden);
    let before = snapshot(&store);
    let e = io::load_bytes(&mut store, bytes).unwrap_err();
    assert!(matches!(e, Error::Io { op: "load", .. }), "{e:?}");
    let msg = e.to_string();
    for n in needles {
        assert!(msg.contains(n), "error {msg:?} does not mention {n:?}");
    }
    assert_eq!(snapshot(&store), before, "a failed load changed the store");
}

#[test]
fn mismatched_checkpoints_name_the_tensor_and_both_shapes_and_load_nothing() {
    let good = std::fs::read(fixture("mlp_f32.safetensors")).unwrap();
    // Hidden width 7 instead of 8: three of the four tensors disagree.
    refuses(
        &good,
        7,
        &["\"mlp.0.weight\"", "[4, 8]", "[4, 7]", "\"mlp.1.weight\"", "[8, 3]", "[7, 3]", "nothing loaded"],
    );

    // A missing tensor, and one the model does not have.
    let (store, _) = model::<f32>(8);
    let mut tensors: Vec<(String, Tensor<f32>)> = snapshot(&store);
    tensors.retain(|(n, _)| n != "mlp.1.bias");
    let extra = Tensor::<f32>::zeros(&[2, 2]).unwrap();
    let mut named: Vec<(&str, &Tensor<f32>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    named.push(("mlp.2.weight", &extra));
    let bytes = io::write_checkpoint(&named).unwrap();
    refuses(&bytes, 8, &["\"mlp.1.bias\"", "missing", "\"mlp.2.weight\"", "[2, 2]", "not a parameter"]);

    // A dtype we do not read.
    let data = [0u8; 4 * 8 * 4];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::I32, vec![4, 8], &data).unwrap();
    let bytes = safetensors::serialize([("mlp.0.weight", view)], None).unwrap();
    refuses(&bytes, 8, &["\"mlp.0.weight\"", "I32"]);
}

#[test]
fn corrupt_files_are_errors_not_panics() {
    let good = std::fs::read(fixture("mlp_f64.safetensors")).unwrap();
    refuses(&[], 8, &["not a valid safetensors file"]);
    refuses(&good[..good.len() - 1], 8, &["not a valid safetensors file"]);
    refuses(&good[..20], 8, &["not a valid safetensors file"]);
    let mut bad_header = good.clone();
    bad_header[9] = b'!';
    refuses(&bad_header, 8, &["not a valid safetensors file"]);
    // A header length far beyond the file.
    let mut huge = good.clone();
    huge[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    refuses(&huge, 8, &["not a valid safetensors file"]);
    // Every truncation and every single-byte corruption of the header: an error or a
    // load, never a panic.
    let (mut store, _) = model::<f64>(8);
    for len in 0..good.len() {
        let _ = io::load_bytes(&mut store, &good[..len]);
    }
    let header = 8 + u64::from_le_bytes(good[..8].try_into().unwrap()) as usize;
    for i in 0..header.min(good.len()) {
        let mut b = good.clone();
        b[i] ^= 0x55;
        let _ = io::read_checkpoint::<f32>(&b);
    }
    let e = io::load(&mut store, fixture("no_such_file.safetensors")).unwrap_err();
    assert!(e.to_string().contains("no_such_file.safetensors"), "{e}");
}

#[test]
fn rank_above_six_is_an_error_naming_the_tensor() {
    let data = [0u8; 4];
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![1; 7], &data).unwrap();
    let bytes = safetensors::serialize([("deep", view)], None).unwrap();
    let e = io::read_checkpoint::<f32>(&bytes).unwrap_err();
    assert!(e.to_string().contains("\"deep\"") && e.to_string().contains("[1, 1, 1, 1, 1, 1, 1]"), "{e}");
}
