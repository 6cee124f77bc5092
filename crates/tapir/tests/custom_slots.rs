//! A custom op's backward must add into the gradient slots it is given and leave them in
//! place; its recorded derivative must return gradients of its inputs' shapes. Every way
//! of breaking that is a typed error naming the op, the input and the shapes, and a slot
//! of `backward_into`'s buffer is never handed to user code, so the buffer is unchanged
//! on error.

use tapir::{CustomError, CustomInputs, CustomOp, Error, Graph, ParamStore, Scope, Shape, Tensor, Var};

/// A buffer that lives for the rest of the process, as user code could hand back in a slot.
/// Its address stays in a static list, so LeakSanitizer sees it as reachable.
fn leaked(n: usize) -> &'static mut [f64] {
    static KEPT: std::sync::Mutex<Vec<usize>> = std::sync::Mutex::new(Vec::new());
    let buf = Box::leak(vec![0.0; n].into_boxed_slice());
    KEPT.lock().unwrap().push(buf.as_ptr() as usize);
    buf
}

/// How the op's backward misbehaves.
#[derive(Clone, Copy)]
enum Misbehave {
    /// Adds `dout` as it should.
    Not,
    /// Hands back a shorter view of slot 0.
    Shorter,
    /// Hands back a buffer of its own, one element longer, for slot 0.
    Longer,
    /// Swaps the slots of its two inputs (of the same shape).
    Swap,
    /// Writes into slot 0, then drops it.
    Drop,
    /// Puts a buffer in slot 1, which was `None` (the input needs no gradient).
    Fill,
}

/// `y = a + b` for two inputs of one shape; backward as `mode` says. Its recorded
/// derivative returns `Σ g` (a scalar) for each input when `wrong_grad` is set.
struct Sum2 {
    mode: Misbehave,
    wrong_grad: bool,
}

impl CustomOp<f64> for Sum2 {
    fn name(&self) -> &'static str {
        "sum2"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn forward(&self, x: CustomInputs<'_, f64>, out: &mut [f64], _: &mut [f64]) -> Result<(), CustomError> {
        for ((y, a), b) in out.iter_mut().zip(x.value(0)).zip(x.value(1)) {
            *y = a + b;
        }
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, f64>,
        _: &[f64],
        _: &[f64],
        dout: &[f64],
        dx: &mut [Option<&mut [f64]>],
    ) -> Result<(), CustomError> {
        for d in dx.iter_mut().flatten() {
            d.iter_mut().zip(dout).for_each(|(d, g)| *d += g);
        }
        match self.mode {
            Misbehave::Not => {}
            Misbehave::Shorter => {
                let s = dx[0].take().expect("input 0 needs a gradient");
                dx[0] = Some(&mut s[1..]);
            }
            Misbehave::Longer => dx[0] = Some(leaked(dout.len() + 1)),
            Misbehave::Swap => dx.swap(0, 1),
            Misbehave::Drop => {
                if let Some(d) = dx[0].as_deref_mut() {
                    d.fill(7.0);
                }
                dx[0] = None;
            }
            Misbehave::Fill => dx[1] = Some(leaked(dout.len())),
        }
        Ok(())
    }
    fn grad<'s>(
        &self,
        _: &[Var<'s, f64>],
        _: Var<'s, f64>,
        g: Var<'s, f64>,
        dinputs: &mut [Option<Var<'s, f64>>],
    ) -> bool {
        for d in dinputs.iter_mut() {
            *d = Some(if self.wrong_grad { g.sum() } else { g });
        }
        true
    }
}

/// The error of a backward through `sum2` misbehaving as `mode`, with `b` a constant
/// (no gradient slot) if `b_const`, and the line the op was recorded on.
fn backward_error(mode: Misbehave, b_const: bool) -> (Error, u32) {
    let (a, b) = (Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap(), Tensor::ones(&[2, 2]).unwrap());
    let op = Sum2 { mode, wrong_grad: false };
    let mut g = Graph::<f64>::new();
    let (e, line) = g.scope(|s| {
        let bv = if b_const { s.input(&b) } else { s.leaf(&b) };
        let (y, line) = (s.custom(&op, &[s.leaf(&a), bv]), line!());
        (s.backward(y.sum()).unwrap_err(), line)
    });
    // The graph stays usable.
    let ok = Sum2 { mode: Misbehave::Not, wrong_grad: false };
    let dx = g.scope(|s| {
        let x = s.leaf(&a);
        s.backward(s.custom(&ok, &[x, s.leaf(&b)]).sum()).unwrap();
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [1.0; 4]);
    (e, line)
}

fn assert_slot_error(e: &Error, line: u32, input: usize, what: &str) {
    let Error::CustomOp { op, phase, detail, location } = e else { panic!("expected Error::CustomOp, got {e:?}") };
    assert_eq!((*op, *phase), ("sum2", "backward"), "{e}");
    assert!(detail.contains(&format!("the gradient slot of input {input} (shape [2, 2])")), "{e}");
    assert!(detail.contains(what), "{e}");
    assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
}

#[test]
fn a_shorter_or_longer_slot_is_an_error_naming_the_input_and_both_shapes() {
    let (e, line) = backward_error(Misbehave::Shorter, false);
    assert_slot_error(&e, line, 0, "came back as another buffer, [3]");
    let (e, line) = backward_error(Misbehave::Longer, false);
    assert_slot_error(&e, line, 0, "came back as another buffer, [5]");
}

#[test]
fn swapped_slots_of_the_same_shape_are_an_error() {
    let (e, line) = backward_error(Misbehave::Swap, false);
    assert_slot_error(&e, line, 0, "came back holding input 1's slot, [4]");
}

#[test]
fn a_dropped_slot_or_one_filled_in_is_an_error() {
    let (e, line) = backward_error(Misbehave::Drop, false);
    assert_slot_error(&e, line, 0, "was dropped");
    let (e, line) = backward_error(Misbehave::Fill, true);
    assert_slot_error(&e, line, 1, "was `None` (the input needs no gradient) but came back as [4]");
}

#[test]
fn backward_into_leaves_the_buffer_unchanged_when_a_slot_comes_back_wrong() {
    let mut store = ParamStore::<f64>::new();
    let p = store.add("p", Tensor::from_vec(vec![1.0, -2.0, 0.5, 3.0], &[2, 2]).unwrap()).unwrap();
    let q = store.add("q", Tensor::ones(&[2, 2]).unwrap()).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    for mode in [Misbehave::Drop, Misbehave::Shorter, Misbehave::Swap] {
        let op = Sum2 { mode, wrong_grad: false };
        let e = g.scope(|s: &Scope<'_, '_, f64>| {
            let y = s.custom(&op, &[s.param(&store, p), s.param(&store, q)]);
            s.backward_into(y.sum(), &mut grads).unwrap_err()
        });
        assert!(matches!(&e, Error::CustomOp { op: "sum2", phase: "backward", .. }), "{e}");
        assert_eq!(grads.get(p).unwrap().data(), [0.0; 4], "{e}");
        assert_eq!(grads.get(q).unwrap().data(), [0.0; 4], "{e}");
    }
    // A well-behaved pass then writes `∂Σ(p + q)/∂p = 1` into the same buffer.
    let op = Sum2 { mode: Misbehave::Not, wrong_grad: false };
    g.scope(|s| s.backward_into(s.custom(&op, &[s.param(&store, p), s.param(&store, q)]).sum(), &mut grads)).unwrap();
    assert_eq!(grads.get(p).unwrap().data(), [1.0; 4]);
    assert_eq!(grads.get(q).unwrap().data(), [1.0; 4]);
}

#[test]
fn a_recorded_derivative_of_the_wrong_shape_is_an_error() {
    let a = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0], &[2, 2]).unwrap();
    let op = Sum2 { mode: Misbehave::Not, wrong_grad: true };
    let mut g = Graph::<f64>::new();
    let (e, line) = g.scope(|s| {
        let x = s.leaf(&a);
        let (y, line) = (s.custom(&op, &[x, x]), line!());
        (s.grad(y.sum(), [x]).unwrap_err(), line)
    });
    let Error::CustomOp { op, phase, detail, location } = &e else { panic!("expected Error::CustomOp, got {e:?}") };
    assert_eq!((*op, *phase), ("sum2", "grad"));
    assert!(detail.contains("returned a gradient of shape [] for input 0 of shape [2, 2]"), "{e}");
    assert_eq!(location.line(), line, "{e}");
    // The right shapes pass: `∂Σ(x + x)/∂x = 2`.
    let op = Sum2 { mode: Misbehave::Not, wrong_grad: false };
    let dx = g.scope(|s| {
        let x = s.leaf(&a);
        let [d] = s.grad(s.custom(&op, &[x, x]).sum(), [x]).unwrap();
        d.value().unwrap().to_vec()
    });
    assert_eq!(dx, [2.0; 4]);
}
