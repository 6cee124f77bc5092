//! Adversarial tests for tapir-nn: layers, optimizers, initialisers and checkpoints fed
//! what a careless or hostile caller would feed them.
//!
//! Every error test asserts the variant, the op it names and, for located errors, the
//! caller's `line!()`. Sweeps are generated over every constructor and option.

use rand::SeedableRng;
use tapir::{Error, Graph, ParamStore, Tensor};
use tapir_nn::optim::{clip_grad_norm, Adam, AdamW, Optimizer, Sgd};
use tapir_nn::{
    Activation, AvgPool2d, Conv2d, Ctx, Dropout, Embedding, Flatten, Init, LayerNorm, Linear, MaxPool2d, Mlp, Module,
    Sequential,
};

/// Checks the op named by `e` and that it points at `line` of this file.
#[track_caller]
fn assert_at(e: &Error, op: &str, line: u32) {
    let at = e.location().unwrap_or_else(|| panic!("a located error: {e}"));
    assert_eq!(e.op(), op, "{e}");
    assert_eq!((at.file(), at.line()), (file!(), line), "{e}");
}

fn rng() -> rand::rngs::StdRng {
    rand::rngs::StdRng::seed_from_u64(3)
}

// ---------------------------------------------------------------------------------------
// Errors inside layers point at the caller's line.

#[test]
fn an_error_inside_a_boxed_layer_names_the_callers_line() {
    let mut store = ParamStore::<f64>::new();
    let mut r = rng();
    // fc2 expects 3 inputs but fc1 gives 8: the linear op inside fc2 fails.
    let model: Box<dyn Module<f64>> = Box::new(
        Sequential::new()
            .push(Linear::new(&mut store, "fc1", 4, 8, &mut r).unwrap())
            .push(Activation::Relu)
            .push(Linear::new(&mut store, "fc2", 3, 2, &mut r).unwrap()),
    );
    let x = Tensor::<f64>::ones(&[5, 4]).unwrap();
    let mut g = Graph::new();
    let (e, line) = g.scope(|s| {
        let cx = Ctx::train(s, &store);
        let line = line!() + 1;
        let y = model.forward(cx, s.input(&x));
        (y.value().map(<[f64]>::to_vec).unwrap_err(), line)
    });
    assert!(matches!(e, Error::InvalidArgument { op: "linear", .. }), "{e}");
    assert!(["[5, 8]", "[3, 2]", "[2]"].iter().all(|s| e.to_string().contains(s)), "{e}");
    assert_at(&e, "linear", line);
}

#[test]
fn every_layer_reports_the_callers_line_through_a_sequential() {
    // One failing input per layer kind, each layer boxed inside a Sequential inside a Box.
    let mut store = ParamStore::<f64>::new();
    let mut r = rng();
    let x4 = Tensor::<f64>::ones(&[2, 4]).unwrap(); // wrong rank for conv/pool, wrong width for 3-input layers
    let layers: Vec<(&str, Box<dyn Module<f64>>)> = vec![
        ("linear", Box::new(Linear::new(&mut store, "l", 3, 2, &mut r).unwrap())),
        ("mlp", Box::new(Mlp::builder(3).hidden(4).output(2).build(&mut store, "m", &mut r).unwrap())),
        ("conv", Box::new(Conv2d::new(&mut store, "c", 1, 1, [1, 1], &mut r).unwrap())),
        ("norm", Box::new(LayerNorm::new(&mut store, "n", 3).unwrap())),
        ("maxpool", Box::new(MaxPool2d::new(2))),
        ("avgpool", Box::new(AvgPool2d::new(2))),
    ];
    let mut g = Graph::new();
    for (name, layer) in layers {
        let model: Box<dyn Module<f64>> = Box::new(Sequential::new().push(Activation::Tanh).push(Boxed(layer)));
        let (e, line) = g.scope(|s| {
            let cx = Ctx::eval(s, &store);
            let line = line!() + 1;
            let _y = model.forward(cx, s.input(&x4));
            (s.check().expect_err(name), line)
        });
        let at = e.location().expect("located");
        assert_eq!((at.file(), at.line()), (file!(), line), "{name}: {e}");
    }
}

/// A boxed layer as a layer, so boxes nest.
struct Boxed(Box<dyn Module<f64>>);

impl Module<f64> for Boxed {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, f64>, x: tapir::Var<'s, f64>) -> tapir::Var<'s, f64> {
        self.0.forward(cx, x)
    }
}

// ---------------------------------------------------------------------------------------
// Flatten keeps the row size of an empty batch.

#[test]
fn flatten_of_empty_batches() {
    let store = ParamStore::<f32>::new();
    let mut g = Graph::new();
    for (dims, want) in [
        (vec![0, 3, 4], vec![0, 12]),
        (vec![0, 5], vec![0, 5]),
        (vec![2, 0, 7], vec![2, 0]),
        (vec![2, 3, 4], vec![2, 12]),
        (vec![0, 1 << 20, 1 << 11], vec![0, 1 << 31]),
        (vec![], vec![1, 1]),
    ] {
        let x = Tensor::<f32>::zeros(&dims).unwrap();
        let got = g.scope(|s| Flatten.forward(Ctx::eval(s, &store), s.input(&x)).to_tensor()).unwrap();
        assert_eq!(got.dims(), want, "{dims:?}");
    }
    // The row size of [0, 2³¹, 2³¹] does not fit a dimension: a shape error at our line.
    let x = Tensor::<f32>::zeros(&[0, 1 << 31, 1 << 31]).unwrap();
    let (e, line) = g.scope(|s| {
        let line = line!() + 1;
        let y = Flatten.forward(Ctx::eval(s, &store), s.input(&x));
        (y.value().map(<[f32]>::len).unwrap_err(), line)
    });
    assert!(matches!(e, Error::InvalidShape { .. }), "{e}");
    assert_at(&e, "reshape", line);
}

// ---------------------------------------------------------------------------------------
// Gradient clipping with huge and tiny gradients.

fn store_with_grads<T: tapir::Float>(values: &[T]) -> (ParamStore<T>, tapir::GradBuffer<T>, tapir::ParamId) {
    let mut store = ParamStore::new();
    let id = store.add("p", Tensor::zeros(&[values.len()]).unwrap()).unwrap();
    let mut grads = store.zeros_like().unwrap();
    grads.get_mut(id).unwrap().data_mut().copy_from_slice(values);
    (store, grads, id)
}

#[test]
fn clip_grad_norm_scales_huge_and_tiny_gradients() {
    // Four gradients of 1e200: ‖g‖ = √4·1e200 = 2e200, clipped to 1 gives 0.5 each.
    let (store, mut grads, id) = store_with_grads(&[1e200f64; 4]);
    let norm = clip_grad_norm(&store, &mut grads, 1.0).unwrap();
    assert!((norm / 2e200 - 1.0).abs() < 1e-12, "{norm}");
    for &g in grads.get(id).unwrap().data() {
        assert!((g - 0.5).abs() < 1e-12, "{g}");
    }
    // f32 near its largest value: ‖g‖ = 2·3e38 = 6e38 (above f32::MAX, fine in f64).
    let (store, mut grads, id) = store_with_grads(&[3e38f32; 4]);
    let norm = clip_grad_norm(&store, &mut grads, 2.0).unwrap();
    assert!((norm / 6e38 - 1.0).abs() < 1e-6, "{norm}");
    assert!(grads.get(id).unwrap().data().iter().all(|&g| (g - 1.0).abs() < 1e-5));
    // Tiny gradients: squares underflow, the scaled norm does not. ‖g‖ = 2e-300.
    let (store, mut grads, _) = store_with_grads(&[1e-300f64; 4]);
    let norm = clip_grad_norm(&store, &mut grads, 1.0).unwrap();
    assert!((norm / 2e-300 - 1.0).abs() < 1e-12, "{norm}");
    // NaN anywhere: the norm is NaN and nothing changes.
    let (store, mut grads, id) = store_with_grads(&[1.0f64, f64::NAN, 1e300]);
    assert!(clip_grad_norm(&store, &mut grads, 1.0).unwrap().is_nan());
    assert_eq!(grads.get(id).unwrap().data()[2], 1e300);
    // Infinity: the norm is infinite and nothing changes.
    let (store, mut grads, id) = store_with_grads(&[f64::INFINITY, 1.0]);
    assert_eq!(clip_grad_norm(&store, &mut grads, 1.0).unwrap(), f64::INFINITY);
    assert_eq!(grads.get(id).unwrap().data()[1], 1.0);
    // Bad max_norm, every kind.
    for bad in [0.0, -1.0, f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let line = line!() + 1;
        let e = clip_grad_norm(&store, &mut grads, bad).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
        assert_at(&e, "clip_grad_norm", line);
    }
}

// ---------------------------------------------------------------------------------------
// Optimizers validate every hyper-parameter.

type Made = (tapir::Result<()>, u32);

/// Every optimizer constructor and option, each applied to `v` in `f32` (so `1e300`,
/// finite in `f64`, is out of range too), with the op it should name.
fn options(store: &ParamStore<f32>, v: f64) -> Vec<(&'static str, Made)> {
    let ok = |r: tapir::Result<()>, l| (r, l);
    vec![
        ("Sgd::new", ok(Sgd::new(store, v).map(drop), line!())),
        ("Sgd::momentum", ok(Sgd::new(store, 0.1).unwrap().momentum(v, false).map(drop), line!())),
        ("Sgd::weight_decay", ok(Sgd::new(store, 0.1).unwrap().weight_decay(v).map(drop), line!())),
        ("Adam::new", ok(Adam::new(store, v).map(drop), line!())),
        ("Adam::betas", ok(Adam::new(store, 0.1).unwrap().betas(v, 0.9).map(drop), line!())),
        ("Adam::betas", ok(Adam::new(store, 0.1).unwrap().betas(0.9, v).map(drop), line!())),
        ("Adam::eps", ok(Adam::new(store, 0.1).unwrap().eps(v).map(drop), line!())),
        ("Adam::weight_decay", ok(Adam::new(store, 0.1).unwrap().weight_decay(v).map(drop), line!())),
        ("AdamW::new", ok(AdamW::new(store, v, 0.01).map(drop), line!())),
        ("AdamW::new", ok(AdamW::new(store, 0.1, v).map(drop), line!())),
        ("Adam::betas", ok(AdamW::new(store, 0.1, 0.01).unwrap().betas(v, 0.9).map(drop), line!())),
        ("Adam::eps", ok(AdamW::new(store, 0.1, 0.01).unwrap().eps(v).map(drop), line!())),
    ]
}

#[test]
fn every_bad_hyper_parameter_is_refused_at_construction() {
    let mut store = ParamStore::<f32>::new();
    store.add("w", Tensor::ones(&[3]).unwrap()).unwrap();
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0, -1e-30, 1e300, f64::MAX] {
        for (op, (r, line)) in options(&store, bad) {
            let e = r.expect_err(op);
            assert!(matches!(e, Error::InvalidArgument { .. }), "{op} {bad}: {e}");
            assert_at(&e, op, line);
        }
    }
    // Betas must be below 1 as well.
    for bad in [1.0, 1.5] {
        let line = line!() + 1;
        let e = Adam::new(&store, 0.1).unwrap().betas(bad, 0.9).unwrap_err();
        assert_at(&e, "Adam::betas", line);
    }
    let line = line!() + 1;
    let e = Sgd::new(&store, 0.1).unwrap().momentum(0.0, true).unwrap_err();
    assert_at(&e, "Sgd::momentum", line);
    // Zero and moderate values are fine everywhere.
    for good in [0.0, 1e-8, 0.5] {
        for (op, (r, _)) in options(&store, good) {
            r.unwrap_or_else(|e| panic!("{op} {good}: {e}"));
        }
    }
}

#[test]
fn a_non_finite_learning_rate_set_later_is_refused_at_step() {
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let grads = store.zeros_like().unwrap();
    let mut opts: Vec<(&str, Box<dyn Optimizer<f64>>)> = vec![
        ("Sgd::step", Box::new(Sgd::new(&store, 0.1).unwrap())),
        ("Adam::step", Box::new(Adam::new(&store, 0.1).unwrap())),
        ("AdamW::step", Box::new(AdamW::new(&store, 0.1, 0.01).unwrap())),
    ];
    for (op, opt) in &mut opts {
        opt.set_lr(f64::NAN);
        let line = line!() + 1;
        let e = opt.step(&mut store, &grads).unwrap_err();
        assert_at(&e, op, line);
    }
    assert_eq!(store.get(w).unwrap().data(), &[1.0, 1.0]);
}

#[test]
fn the_opt_in_check_refuses_non_finite_gradients() {
    for bad in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY] {
        let mut store = ParamStore::<f64>::new();
        let w = store.add("w", Tensor::ones(&[3]).unwrap()).unwrap();
        let mut grads = store.zeros_like().unwrap();
        grads.get_mut(w).unwrap().data_mut()[1] = bad;
        let mut opts: Vec<(&str, Box<dyn Optimizer<f64>>)> = vec![
            ("Sgd::step", Box::new(Sgd::new(&store, 0.1).unwrap().momentum(0.9, false).unwrap().check_finite(true))),
            ("Adam::step", Box::new(Adam::new(&store, 0.1).unwrap().check_finite(true))),
            ("AdamW::step", Box::new(AdamW::new(&store, 0.1, 0.01).unwrap().check_finite(true))),
        ];
        for (op, opt) in &mut opts {
            let line = line!() + 1;
            let e = opt.step(&mut store, &grads).unwrap_err();
            assert!(matches!(e, Error::NonFinite { phase: "gradient", .. }), "{e}");
            assert_at(&e, op, line);
            assert_eq!(store.get(w).unwrap().data(), &[1.0; 3], "{op}: nothing updated");
            // After a finite step the optimizer still works: its state was not poisoned.
            let clean = store.zeros_like().unwrap();
            opt.step(&mut store, &clean).unwrap();
            assert!(store.get(w).unwrap().data().iter().all(|v| v.is_finite()));
        }
        // Without the check (the default) the parameter is poisoned, as documented.
        let mut plain = Sgd::new(&store, 0.1).unwrap();
        plain.step(&mut store, &grads).unwrap();
        assert!(!store.get(w).unwrap().data()[1].is_finite());
    }
}

#[test]
fn optimizers_refuse_another_stores_parameters_and_buffers() {
    let mut a = ParamStore::<f64>::new();
    a.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let mut b = ParamStore::<f64>::new();
    b.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let (ga, gb) = (a.zeros_like().unwrap(), b.zeros_like().unwrap());
    let mut opts: Vec<(&str, Box<dyn Optimizer<f64>>)> = vec![
        ("Sgd::step", Box::new(Sgd::new(&a, 0.1).unwrap())),
        ("Adam::step", Box::new(Adam::new(&a, 0.1).unwrap())),
        ("AdamW::step", Box::new(AdamW::new(&a, 0.1, 0.01).unwrap())),
    ];
    for (op, opt) in &mut opts {
        // The same layout, another store: the optimizer's state is a's.
        let line = line!() + 1;
        let e = opt.step(&mut b, &gb).unwrap_err();
        assert!(matches!(e, Error::WrongStore { .. }), "{e}");
        assert_at(&e, op, line);
        // a's optimizer and store with b's gradients.
        let line = line!() + 1;
        let e = opt.step(&mut a, &gb).unwrap_err();
        assert!(matches!(e, Error::WrongStore { .. }), "{e}");
        assert_at(&e, op, line);
        opt.step(&mut a, &ga).unwrap();
    }
    let mut gb = gb;
    let line = line!() + 1;
    let e = clip_grad_norm(&a, &mut gb, 1.0).unwrap_err();
    assert!(matches!(e, Error::WrongStore { .. }), "{e}");
    assert_at(&e, "clip_grad_norm", line);
}

// ---------------------------------------------------------------------------------------
// Initialisers check finiteness in the target dtype.

fn inits(gain: f64) -> [Init; 4] {
    [
        Init::KaimingUniform { gain },
        Init::KaimingNormal { gain },
        Init::XavierUniform { gain },
        Init::XavierNormal { gain },
    ]
}

#[test]
fn huge_gains_never_return_non_finite_weights() {
    // The case: 1e300 is finite in f64 but not in f32.
    let line = line!() + 1;
    let e = Init::KaimingUniform { gain: 1e300 }.tensor::<f32, _>(&[4, 4], 4, 4, &mut rng()).unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e}");
    assert_at(&e, "Init::tensor", line);
    // Every initialiser, every gain, both dtypes: finite weights or an error at our line.
    for gain in [0.0, 1.0, 1e30, 1e38, 1e300, f64::MAX, f64::INFINITY, f64::NAN, -1.0] {
        for init in inits(gain) {
            let line = line!() + 1;
            match init.tensor::<f32, _>(&[8, 8], 8, 8, &mut rng()) {
                Ok(t) => assert!(t.data().iter().all(|v| v.is_finite()), "{init:?}"),
                Err(e) => assert_at(&e, "Init::tensor", line),
            }
            let line = line!() + 1;
            match init.tensor::<f64, _>(&[8, 8], 8, 8, &mut rng()) {
                Ok(t) => assert!(t.data().iter().all(|v| v.is_finite()), "{init:?}"),
                Err(e) => assert_at(&e, "Init::tensor", line),
            }
        }
        if (0.0..=1e30).contains(&gain) {
            for init in inits(gain) {
                assert!(init.tensor::<f32, _>(&[8, 8], 8, 8, &mut rng()).is_ok(), "{init:?}");
            }
        }
    }
    for v in [1e300, f64::INFINITY, f64::NAN] {
        let line = line!() + 1;
        let e = Init::Constant(v).tensor::<f32, _>(&[2], 1, 1, &mut rng()).unwrap_err();
        assert_at(&e, "Init::Constant", line);
    }
}

// ---------------------------------------------------------------------------------------
// Layer constructors never abort on absurd sizes.

#[test]
fn layer_constructors_report_out_of_memory_and_leave_the_store_alone() {
    // 2⁵⁹ weights: a valid shape beyond any address space, refused by every allocator
    // whatever the overcommit policy.
    let (big, wide) = (1usize << 30, 1usize << 29);
    let mut store = ParamStore::<f32>::new();
    let mut r = rng();
    let k = [1 << 15, 1];
    let results: Vec<(&str, Error, u32)> = vec![
        ("Linear::new", Linear::new(&mut store, "l", big, wide, &mut r).unwrap_err(), line!()),
        ("Embedding::new", Embedding::new(&mut store, "e", big, wide, &mut r).unwrap_err(), line!()),
        ("Conv2d::new", Conv2d::new(&mut store, "c", 1 << 15, 1 << 14, k, &mut r).unwrap_err(), line!()),
        ("LayerNorm::new", LayerNorm::new(&mut store, "n", 1 << 32).unwrap_err(), line!()),
    ];
    for (op, e, line) in &results {
        assert!(matches!(e, Error::TensorOutOfMemory { .. } | Error::InvalidShape { .. }), "{op}: {e}");
        assert_at(e, op, *line);
    }
    assert!(matches!(results[0].1, Error::TensorOutOfMemory { requested, .. } if requested == 4 << 59));
    assert!(store.is_empty(), "a failed constructor adds nothing");
    // Dropout's probability, every bad kind.
    for p in [f64::NAN, -0.1, 1.0, f64::INFINITY] {
        let line = line!() + 1;
        let e = Dropout::new(p, 0).unwrap_err();
        assert_at(&e, "Dropout::new", line);
    }
}

// ---------------------------------------------------------------------------------------
// Every checkpoint written can be read back.

#[test]
fn reserved_names_are_refused_at_save_and_every_other_name_round_trips() {
    let mut store = ParamStore::<f32>::new();
    store.add("__metadata__", Tensor::ones(&[2]).unwrap()).unwrap();
    let e = tapir_nn::io::to_bytes(&store).unwrap_err();
    assert!(matches!(e, Error::Io { op: "save", .. }) && e.to_string().contains("__metadata__"), "{e}");
    let path = std::env::temp_dir().join(format!("tapir-adversarial-{}.safetensors", std::process::id()));
    let e = tapir_nn::io::save(&store, &path).unwrap_err();
    assert!(matches!(e, Error::Io { op: "save", .. }), "{e}");
    assert!(!path.exists(), "nothing written");
    // Names that look like the reserved one, or are odd for JSON, save and load back.
    for name in ["__metadata", "__metadata__ ", "_metadata_", "", " ", "a.b", "ü", "\"q\"", "\n", "\\", "{}"] {
        let mut s = ParamStore::<f32>::new();
        s.add(name, Tensor::from_vec(vec![1.5, -2.0], &[2]).unwrap()).unwrap();
        let bytes = tapir_nn::io::to_bytes(&s).unwrap_or_else(|e| panic!("{name:?}: {e}"));
        let mut back = ParamStore::<f32>::new();
        let id = back.add(name, Tensor::zeros(&[2]).unwrap()).unwrap();
        tapir_nn::io::load_bytes(&mut back, &bytes).unwrap_or_else(|e| panic!("{name:?}: {e}"));
        assert_eq!(back.get(id).unwrap().data(), &[1.5, -2.0], "{name:?}");
    }
}

#[test]
fn embedding_lookups_report_the_callers_line() {
    let mut store = ParamStore::<f64>::new();
    let emb = Embedding::new(&mut store, "e", 3, 2, &mut rng()).unwrap();
    let mut g = Graph::new();
    let (e, line) = g.scope(|s| {
        let line = line!() + 1;
        let v = emb.forward(Ctx::eval(s, &store), &[0, 7]);
        (v.value().map(<[f64]>::len).unwrap_err(), line)
    });
    assert!(matches!(e, Error::IndexOutOfRange { index: 7, len: 3, .. }), "{e}");
    assert_at(&e, "index_select", line);
}
