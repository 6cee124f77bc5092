//! User-defined ops (`CustomOp`): values and gradients against closed forms and finite
//! differences, inputs given twice, accumulation with built-in ops, and every way a
//! callback can fail turning into a typed error that names the op, with the graph still
//! usable for the next scope.

use tapir::testing::{gradcheck, GradcheckOptions};
use tapir::{CustomError, CustomInputs, CustomOp, Error, Float, Graph, Shape, Tensor};

/// `y = ln(1 + eˣ)`, stable for any `x`; saves `σ(x)` for backward.
struct Softplus;

impl<T: Float> CustomOp<T> for Softplus {
    fn name(&self) -> &'static str {
        "fused_softplus"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        match inputs {
            [x] => Ok(*x),
            _ => Err(CustomError::Failed(format!("takes one input, got {}", inputs.len()))),
        }
    }
    fn saved_len(&self, inputs: &[Shape]) -> usize {
        inputs[0].numel()
    }
    fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], sig: &mut [T]) -> Result<(), CustomError> {
        for ((y, s), &x) in out.iter_mut().zip(sig.iter_mut()).zip(x.value(0)) {
            let e = (-x.abs()).exp();
            *y = x.max(T::ZERO) + e.ln_1p();
            *s = if x >= T::ZERO { T::ONE / (T::ONE + e) } else { e / (T::ONE + e) };
        }
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, T>,
        _: &[T],
        sig: &[T],
        dout: &[T],
        dx: &mut [Option<&mut [T]>],
    ) -> Result<(), CustomError> {
        if let Some(dx) = dx[0].as_deref_mut() {
            for ((d, &g), &s) in dx.iter_mut().zip(dout).zip(sig) {
                *d += g * s;
            }
        }
        Ok(())
    }
}

/// Round in forward, identity in backward.
struct RoundSte;

impl<T: Float> CustomOp<T> for RoundSte {
    fn name(&self) -> &'static str {
        "round_ste"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        inputs.first().copied().ok_or_else(|| "takes one input".into())
    }
    fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], _: &mut [T]) -> Result<(), CustomError> {
        for (y, &x) in out.iter_mut().zip(x.value(0)) {
            *y = T::from_f64(x.to_f64().round());
        }
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, T>,
        _: &[T],
        _: &[T],
        dout: &[T],
        dx: &mut [Option<&mut [T]>],
    ) -> Result<(), CustomError> {
        if let Some(dx) = dx[0].as_deref_mut() {
            dx.iter_mut().zip(dout).for_each(|(d, &g)| *d += g);
        }
        Ok(())
    }
}

/// `out = a ⊙ b + c`, three inputs of one shape: `da += dout ⊙ b`, `db += dout ⊙ a`, `dc += dout`.
struct MulAdd;

impl<T: Float> CustomOp<T> for MulAdd {
    fn name(&self) -> &'static str {
        "mul_add"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        let [a, b, c] = inputs else { return Err(format!("takes three inputs, got {}", inputs.len()).into()) };
        for other in [b, c] {
            if other != a {
                return Err(CustomError::ShapeMismatch { lhs: *a, rhs: *other });
            }
        }
        Ok(*a)
    }
    fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], _: &mut [T]) -> Result<(), CustomError> {
        let (a, b, c) = (x.value(0), x.value(1), x.value(2));
        for (i, y) in out.iter_mut().enumerate() {
            *y = a[i] * b[i] + c[i];
        }
        Ok(())
    }
    fn backward(
        &self,
        x: CustomInputs<'_, T>,
        _: &[T],
        _: &[T],
        dout: &[T],
        dx: &mut [Option<&mut [T]>],
    ) -> Result<(), CustomError> {
        let (a, b) = (x.value(0), x.value(1));
        let [da, db, dc] = dx else { return Err("three gradient slots".into()) };
        for (i, &g) in dout.iter().enumerate() {
            if let Some(da) = da.as_deref_mut() {
                da[i] += g * b[i];
            }
            if let Some(db) = db.as_deref_mut() {
                db[i] += g * a[i];
            }
            if let Some(dc) = dc.as_deref_mut() {
                dc[i] += g;
            }
        }
        Ok(())
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    PanicInName,
    PanicInShape,
    PanicInForward,
    FailInForward,
    NanInForward,
    PanicInBackward,
    FailInBackward,
    NanInBackward,
}

/// The identity, failing where told to.
struct Faulty(Fault);

impl CustomOp<f64> for Faulty {
    fn name(&self) -> &'static str {
        assert!(self.0 != Fault::PanicInName, "no name today");
        "faulty"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        assert!(self.0 != Fault::PanicInShape, "no shape today");
        Ok(inputs[0])
    }
    fn forward(&self, x: CustomInputs<'_, f64>, out: &mut [f64], _: &mut [f64]) -> Result<(), CustomError> {
        match self.0 {
            Fault::PanicInForward => panic!("forward exploded"),
            Fault::FailInForward => Err("the device is busy".into()),
            _ => {
                out.copy_from_slice(x.value(0));
                if self.0 == Fault::NanInForward {
                    out[0] = f64::NAN;
                }
                Ok(())
            }
        }
    }
    fn backward(
        &self,
        _: CustomInputs<'_, f64>,
        _: &[f64],
        _: &[f64],
        dout: &[f64],
        dx: &mut [Option<&mut [f64]>],
    ) -> Result<(), CustomError> {
        let dx = dx[0].as_deref_mut().expect("x requires a gradient");
        match self.0 {
            Fault::PanicInBackward => {
                let i = dout.len() + 3;
                dx[i] = 1.0; // out of bounds
                Ok(())
            }
            Fault::FailInBackward => Err(CustomError::Failed("no backward for you".into())),
            _ => {
                dx.iter_mut().zip(dout).for_each(|(d, &g)| *d += g);
                if self.0 == Fault::NanInBackward {
                    dx[1] = f64::INFINITY;
                }
                Ok(())
            }
        }
    }
}

fn t(v: &[f64]) -> Tensor<f64> {
    Tensor::from_vec(v.to_vec(), &[v.len()]).unwrap()
}

fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

#[test]
fn fused_softplus_matches_the_builtin_and_the_closed_form() {
    let xs = [-745.0, -40.0, -3.0, -1e-8, 0.0, 1e-8, 0.7, 5.0, 40.0, 745.0];
    let x = t(&xs);
    let mut g = Graph::<f64>::new();
    let run = |g: &mut Graph<f64>, fused: bool| {
        g.scope(|s| {
            let x = s.leaf(&x);
            let y = if fused { s.custom(&Softplus, &[x]) } else { x.softplus() };
            s.backward(y.sum()).unwrap();
            (y.to_tensor().unwrap(), x.grad_tensor().unwrap())
        })
    };
    let (y, dx) = run(&mut g, true);
    let (yb, dxb) = run(&mut g, false);
    for (i, &x) in xs.iter().enumerate() {
        // Closed forms, written independently of both implementations: ln(1 + eˣ) = ln1p(eˣ)
        // for x < 30, x + ln1p(e⁻ˣ) above; d/dx = σ(x).
        let exact = if x < 30.0 { x.exp().ln_1p() } else { x + (-x).exp().ln_1p() };
        assert!((y.data()[i] - exact).abs() <= 1e-15 * exact.abs().max(1e-300), "y({x}) = {} vs {exact}", y.data()[i]);
        assert!((dx.data()[i] - sigmoid(x)).abs() <= 1e-15, "dy/dx({x})");
        assert!((y.data()[i] - yb.data()[i]).abs() <= 1e-15 * yb.data()[i].abs().max(1e-300), "vs builtin at {x}");
        assert!((dx.data()[i] - dxb.data()[i]).abs() <= 1e-15, "gradient vs builtin at {x}");
    }
    // f32 too, against the builtin.
    let x32 = Tensor::<f32>::from_vec(vec![-90.0, -2.0, 0.0, 3.0, 90.0], &[5]).unwrap();
    let mut g = Graph::<f32>::new();
    let (a, b) = g.scope(|s| {
        let x = s.input(&x32);
        (s.custom(&Softplus, &[x]).to_tensor().unwrap(), x.softplus().to_tensor().unwrap())
    });
    for (a, b) in a.data().iter().zip(b.data()) {
        assert!((a - b).abs() <= 1e-6 * b.abs().max(1e-30), "{a} vs {b}");
    }
}

#[test]
fn gradcheck_works_on_custom_ops_unchanged() {
    let opts = GradcheckOptions::default();
    let x = Tensor::from_vec(vec![-2.0, -0.3, 0.0, 0.4, 1.7, 3.0], &[2, 3]).unwrap();
    let r = gradcheck(std::slice::from_ref(&x), opts, |s, v| s.custom(&Softplus, &[v[0]])).unwrap();
    assert_eq!(r.checked, 6);
    let y = Tensor::from_vec(vec![0.5, -1.5, 2.0, 0.25, -0.75, 1.0], &[2, 3]).unwrap();
    let z = Tensor::from_vec(vec![0.1, 0.2, -0.3, 0.4, -0.5, 0.6], &[2, 3]).unwrap();
    let r = gradcheck(&[x.clone(), y.clone(), z], opts, |s, v| s.custom(&MulAdd, &[v[0], v[1], v[2]])).unwrap();
    assert_eq!(r.checked, 18);
    // An input given twice, and the custom op composed with built-in ones.
    gradcheck(&[x, y], opts, |s, v| s.custom(&MulAdd, &[v[0], v[0], v[1].tanh()]).exp()).unwrap();
}

#[test]
fn straight_through_estimator_rounds_forward_and_passes_gradients() {
    let x = t(&[0.2, 0.7, -1.4, 2.5, -2.6]);
    let r = t(&[1.0, -2.0, 3.0, 0.5, 4.0]);
    let mut g = Graph::<f64>::new();
    let (y, dx) = g.scope(|s| {
        let x = s.leaf(&x);
        let y = s.custom(&RoundSte, &[x]);
        // L = Σ round(x) ⊙ r, passed straight through: dL/dx = r.
        s.backward((y * s.input(&r)).sum()).unwrap();
        (y.value().unwrap().to_vec(), x.grad().unwrap().to_vec())
    });
    assert_eq!(y, [0.0, 1.0, -1.0, 3.0, -3.0]);
    assert_eq!(dx, r.data());
}

#[test]
fn an_input_given_twice_gets_both_contributions_and_built_in_ops_add_theirs() {
    let x = t(&[0.5, -2.0, 3.0]);
    let mut g = Graph::<f64>::new();
    let dx = g.scope(|s| {
        let x = s.leaf(&x);
        // y = x ⊙ x + x, and L = Σ y + Σ 3x: dL/dx = 2x + 1 + 3.
        let y = s.custom(&MulAdd, &[x, x, x]);
        s.backward(y.sum() + (x * 3.0).sum()).unwrap();
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [5.0, 0.0, 10.0]);
}

#[test]
fn inputs_without_gradients_get_no_slot_and_constants_stay_constant() {
    let (a, b) = (t(&[1.0, 2.0]), t(&[3.0, 4.0]));
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let c = s.custom(&MulAdd, &[s.input(&a), s.input(&b), s.input(&a)]);
        assert!(!c.requires_grad());
        assert_eq!(c.value().unwrap(), [4.0, 10.0]);
        let a = s.leaf(&a);
        let y = s.custom(&MulAdd, &[a, s.input(&b), s.input(&b)]);
        s.backward(y.sum()).unwrap(); // Faulty-free: slots 1 and 2 are None
        assert_eq!(a.grad().unwrap(), b.data()); // d(a ⊙ b + b)/da = b
    });
}

#[test]
fn shape_errors_are_the_usual_typed_errors_at_the_callers_line() {
    let (a, b) = (t(&[1.0, 2.0]), t(&[1.0, 2.0, 3.0]));
    let mut g = Graph::<f64>::new();
    let (line, e) = g.scope(|s| {
        let x = s.leaf(&a);
        let (line, _) = (line!(), s.custom(&MulAdd, &[x, x, s.input(&b)]));
        (line, s.check().unwrap_err())
    });
    match &e {
        Error::ShapeMismatch { op: "mul_add", lhs, rhs, location } => {
            assert_eq!((lhs.to_vec(), rhs.to_vec()), (vec![2], vec![3]));
            assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
        }
        e => panic!("expected a shape mismatch, got {e}"),
    }
    let e = g.scope(|s| {
        let _ = s.custom(&MulAdd, &[s.leaf(&a)]);
        s.check().unwrap_err()
    });
    assert!(
        matches!(&e, Error::CustomOp { op: "mul_add", phase: "output_shape", detail, .. } if detail.contains("three inputs")),
        "{e}"
    );
}

/// Records `Faulty(fault)` on `[1, 2, 3]` and runs backward; returns the scope's error,
/// then checks that the same graph runs a clean scope afterwards.
fn fault(fault: Fault, anomaly: bool) -> (u32, Error) {
    let op = Faulty(fault);
    let clean = Faulty(Fault::NanInForward); // NaN only in element 0; fine without anomaly
    let x = t(&[1.0, 2.0, 3.0]);
    let mut g = Graph::<f64>::new();
    g.set_anomaly_detection(anomaly);
    let out = g.scope(|s| {
        let x = s.leaf(&x);
        let (line, y) = (line!(), s.custom(&op, &[x]));
        match s.check() {
            Err(e) => (line, e),
            Ok(()) => (line, s.backward(y.sum()).expect_err("backward fails")),
        }
    });
    // Nothing leaks into the next scope: the side table, the scratch lists and the tape
    // start empty, and a custom op records and differentiates normally.
    g.set_anomaly_detection(false);
    let dx = g.scope(|s| {
        let x = s.leaf(&x);
        let y = s.custom(&clean, &[x]).narrow(0, 1, 2) + s.custom(&Softplus, &[x]).narrow(0, 1, 2);
        s.backward(y.sum()).unwrap();
        assert_eq!(s.stats().nodes, 7);
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [0.0, 1.0 + sigmoid(2.0), 1.0 + sigmoid(3.0)]);
    out
}

#[test]
fn a_panicking_or_failing_callback_is_a_typed_error_naming_the_op() {
    for (kind, phase, detail) in [
        (Fault::PanicInShape, "output_shape", "panicked: no shape today"),
        (Fault::PanicInForward, "forward", "panicked: forward exploded"),
        (Fault::FailInForward, "forward", "the device is busy"),
        (Fault::PanicInBackward, "backward", "panicked: index out of bounds"),
        (Fault::FailInBackward, "backward", "no backward for you"),
    ] {
        let (line, e) = fault(kind, false);
        match &e {
            Error::CustomOp { op: "faulty", phase: p, detail: d, location } => {
                assert_eq!(*p, phase, "{e}");
                assert!(d.starts_with(detail), "{e}");
                // Located where the op was recorded, in backward too.
                assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
            }
            e => panic!("expected a custom-op error for {phase}, got {e}"),
        }
        assert!(e.to_string().starts_with(&format!("faulty: the custom op's {phase} failed")), "{e}");
    }
    // A panicking name is named by the kind.
    let (line, e) = fault(Fault::PanicInName, false);
    assert!(
        matches!(&e, Error::CustomOp { op: "custom", phase: "name", location, .. } if location.line() == line),
        "{e}"
    );
}

#[test]
fn non_finite_values_under_anomaly_detection_name_the_op() {
    let (line, e) = fault(Fault::NanInForward, true);
    assert!(
        matches!(e, Error::NonFinite { op: "faulty", phase: "forward", location, .. } if location.line() == line),
        "{e}"
    );
    let (_, e) = fault(Fault::NanInBackward, true);
    assert!(matches!(e, Error::NonFinite { op: "faulty", phase: "backward", .. }), "{e}");
    // Without anomaly detection, the same values pass.
    let x = t(&[1.0, 2.0]);
    let op = Faulty(Fault::NanInBackward);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        s.backward(s.custom(&op, &[x]).sum()).unwrap();
        assert_eq!(x.grad().unwrap(), [1.0, f64::INFINITY]);
    });
}

#[test]
fn dumps_and_memory_reports_use_the_ops_own_name() {
    let x = t(&[1.0, 2.0]);
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        let y = s.custom(&Softplus, &[x]);
        s.backward(s.custom(&MulAdd, &[y, x, y]).sum()).unwrap();
        let dump = s.dump();
        assert!(dump.contains("%1 = fused_softplus %0 : [2] grad"), "{dump}");
        assert!(dump.contains("%2 = mul_add %1 %0 %1 : [2] grad"), "{dump}");
        let report = s.memory_report();
        let fused = report.ops.iter().find(|o| o.op == "fused_softplus").expect("listed by name");
        assert_eq!((fused.nodes, fused.value_bytes, fused.grad_bytes), (1, 16, 16));
        assert!(s.to_dot().contains("label=\"%2 mul_add\\n[2]\""));
    });
}

#[test]
fn callbacks_can_use_another_graph_but_never_this_scope() {
    // The callbacks see slices only; an op may run a scope of a graph of its own (a
    // nested, independent tape), which cannot touch the scope recording it.
    struct Inner(std::cell::RefCell<Graph<f64>>);
    impl CustomOp<f64> for Inner {
        fn name(&self) -> &'static str {
            "inner"
        }
        fn output_shape(&self, x: &[Shape]) -> Result<Shape, CustomError> {
            Ok(x[0])
        }
        fn forward(&self, x: CustomInputs<'_, f64>, out: &mut [f64], _: &mut [f64]) -> Result<(), CustomError> {
            let x = Tensor::from_vec(x.value(0).to_vec(), &[out.len()]).map_err(|e| e.to_string())?;
            let y = self.0.borrow_mut().scope(|s| s.input(&x).square().to_tensor()).map_err(|e| e.to_string())?;
            out.copy_from_slice(y.data());
            Ok(())
        }
        fn backward(
            &self,
            x: CustomInputs<'_, f64>,
            _: &[f64],
            _: &[f64],
            dout: &[f64],
            dx: &mut [Option<&mut [f64]>],
        ) -> Result<(), CustomError> {
            let dx = dx[0].as_deref_mut().ok_or("x requires a gradient")?;
            for ((d, &g), &x) in dx.iter_mut().zip(dout).zip(x.value(0)) {
                *d += 2.0 * x * g;
            }
            Ok(())
        }
    }
    let op = Inner(std::cell::RefCell::new(Graph::new()));
    let x = t(&[1.5, -2.0]);
    let mut g = Graph::<f64>::new();
    let dx = g.scope(|s| {
        let x = s.leaf(&x);
        s.backward(s.custom(&op, &[x]).sum()).unwrap();
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [3.0, -4.0]); // d(Σ x²)/dx = 2x
}

#[test]
fn parameters_enter_as_inputs_and_every_backward_entry_point_works() {
    let mut store = tapir::ParamStore::<f64>::new();
    let w = store.add("w", t(&[0.5, -1.0, 2.0])).unwrap();
    let x = t(&[3.0, 4.0, -1.0]);
    let mut grads = store.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        // L = Σ (w ⊙ x + w): dL/dw = x + 1, accumulated into the buffer.
        let y = s.custom(&MulAdd, &[s.param(&store, w), s.input(&x), s.param(&store, w)]);
        s.backward_into(y.sum(), &mut grads).unwrap();
    });
    assert_eq!(grads.get(w).unwrap().data(), [4.0, 5.0, 0.0]);
    g.scope(|s| {
        let x = s.leaf(&x);
        let y = s.custom(&RoundSte, &[x]);
        // Seeded at the custom node itself, twice over a retained tape: fresh each time.
        for _ in 0..2 {
            s.backward_retain(s.custom(&MulAdd, &[y, y, y]).sum()).unwrap();
            // y = round(x) = [3, 4, -1]; d(y² + y)/dy = 2y + 1, passed straight through.
            assert_eq!(x.grad().unwrap(), [7.0, 9.0, -1.0]);
        }
        s.backward_with(y, &[1.0, 2.0, 3.0]).unwrap();
        assert_eq!(x.grad().unwrap(), [1.0, 2.0, 3.0]);
    });
}

#[test]
fn running_out_of_arena_in_a_custom_backward_puts_every_slot_back() {
    let x = t(&[1.0, 2.0, 3.0, 4.0]);
    let mut g = Graph::<f64>::new();
    fn record<'s>(s: &'s tapir::Scope<'s, '_, f64>, x: tapir::Var<'s, f64>) -> tapir::Var<'s, f64> {
        s.custom(&MulAdd, &[x, x, x]).sum()
    }
    let forward = g.scope(|s| {
        let _ = record(s, s.leaf(&x));
        s.stats().arena.bytes_in_use
    });
    // Room for the seed (8 bytes), dy (32) and x's first slot (32), not for the slot of
    // x's second occurrence.
    g.set_arena_limit(Some(forward + 8 + 32 + 32));
    g.scope(|s| {
        let x = s.leaf(&x);
        let e = s.backward(record(s, x)).unwrap_err();
        assert!(matches!(e, Error::ArenaLimit { op: "backward", .. }), "{e}");
        // The op's backward never ran; x's first slot went back to the map untouched.
        assert_eq!(x.grad().unwrap(), [0.0; 4]);
    });
    g.set_arena_limit(None);
    let dx = g.scope(|s| {
        let x = s.leaf(&x);
        s.backward(record(s, x)).unwrap();
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [3.0, 5.0, 7.0, 9.0]); // d(x² + x)/dx = 2x + 1
}
