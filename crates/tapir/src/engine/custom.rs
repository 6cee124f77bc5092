//! The machinery of user-defined ops ([`CustomOp`]): [`Scope::custom`]'s recording, the
//! guarded callbacks, and the op's backward and recorded derivative, which the engine's
//! walks dispatch to (the interface and the side-table row are `record/custom_op.rs`).
//!
//! Every callback runs under [`guarded`]: a panic or a [`CustomError`] becomes the
//! [`Error`] of its phase, naming the op, so user code cannot poison the engine.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::kernels;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::custom_op::{CustomError, CustomInputs, CustomScratch};
use crate::record::handles::{CustomEntry, CustomOp, Scope, Var};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::Op;

/// A panic's message, as well as it can be recovered.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    msg.to_string()
}

/// A callback's panic as the detail of [`Error::CustomOp`].
fn panic_detail(payload: &(dyn Any + Send)) -> String {
    format!("panicked: {}", panic_message(payload))
}

/// Runs one callback of the op `op`: a panic or a [`CustomError`] becomes the [`Error`]
/// of `phase` at `location`.
pub(crate) fn guarded<R>(
    op: &'static str,
    phase: &'static str,
    location: Loc,
    f: impl FnOnce() -> std::result::Result<R, CustomError>,
) -> Result<R> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(e.into_error(op, phase, location)),
        Err(payload) => Err(Error::CustomOp { op, phase, detail: panic_detail(&*payload), location }),
    }
}

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Records the user-defined op `op` on `inputs` (see [`CustomOp`]). The output
    /// requires a gradient if any input does; errors name the op by [`CustomOp::name`].
    ///
    /// # A fused, numerically stable softplus
    ///
    /// `y = ln(1 + eˣ)`, computed as `max(x, 0) + ln(1 + e^{-|x|})` so that it neither
    /// overflows for large `x` nor loses the tail for very negative `x`. Forward saves
    /// `σ(x) = dy/dx` for backward (`dx += dout ⊙ σ(x)`), and the result is checked against
    /// the built-in [`Var::softplus`]:
    ///
    /// ```
    /// use tapir::{CustomError, CustomInputs, CustomOp, Float, Graph, Shape, Tensor};
    ///
    /// struct Softplus;
    ///
    /// impl<T: Float> CustomOp<T> for Softplus {
    ///     fn name(&self) -> &'static str {
    ///         "fused_softplus"
    ///     }
    ///     fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
    ///         match inputs {
    ///             [x] => Ok(*x),
    ///             _ => Err(CustomError::Failed(format!("takes one input, got {}", inputs.len()))),
    ///         }
    ///     }
    ///     fn saved_len(&self, inputs: &[Shape]) -> usize {
    ///         inputs[0].numel() // σ(x), one per element
    ///     }
    ///     fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], sig: &mut [T]) -> Result<(), CustomError> {
    ///         for ((y, s), &x) in out.iter_mut().zip(sig.iter_mut()).zip(x.value(0)) {
    ///             let e = (-x.abs()).exp(); // in (0, 1]: never overflows
    ///             *y = x.max(T::ZERO) + e.ln_1p();
    ///             // σ(x) = 1/(1 + e^{-x}) = e^{x}/(1 + e^{x}), whichever exponent is ≤ 0.
    ///             *s = if x >= T::ZERO { T::ONE / (T::ONE + e) } else { e / (T::ONE + e) };
    ///         }
    ///         Ok(())
    ///     }
    ///     fn backward(
    ///         &self,
    ///         _x: CustomInputs<'_, T>,
    ///         _out: &[T],
    ///         sig: &[T],
    ///         dout: &[T],
    ///         dx: &mut [Option<&mut [T]>],
    ///     ) -> Result<(), CustomError> {
    ///         if let Some(dx) = dx[0].as_deref_mut() {
    ///             for ((d, &g), &s) in dx.iter_mut().zip(dout).zip(sig) {
    ///                 *d += g * s; // accumulate: x may feed other ops too
    ///             }
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = Tensor::<f64>::from_vec(vec![-800.0, -3.0, -1e-3, 0.0, 0.5, 4.0, 800.0], &[7])?;
    /// let mut g = Graph::<f64>::new();
    /// let (ours, ours_dx) = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     let y = s.custom(&Softplus, &[x]);
    ///     s.backward(y.sum())?;
    ///     Ok::<_, tapir::Error>((y.to_tensor()?, x.grad_tensor().unwrap()))
    /// })?;
    /// let (builtin, builtin_dx) = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     let y = x.softplus();
    ///     s.backward(y.sum())?;
    ///     Ok::<_, tapir::Error>((y.to_tensor()?, x.grad_tensor().unwrap()))
    /// })?;
    /// for (a, b) in ours.data().iter().zip(builtin.data()).chain(ours_dx.data().iter().zip(builtin_dx.data())) {
    ///     assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{a} vs {b}");
    /// }
    /// assert_eq!(ours.data()[6], 800.0); // ln(1 + e^800) with no overflow
    /// assert_eq!(ours_dx.data()[0], 0.0); // σ(-800) underflows to 0, as it should
    /// # Ok(()) }
    /// ```
    ///
    /// # A straight-through estimator
    ///
    /// Forward rounds; backward pretends the op was the identity (`dx += dout`), the trick
    /// that trains through quantisation:
    ///
    /// ```
    /// use tapir::{CustomError, CustomInputs, CustomOp, Float, Graph, Shape, Tensor};
    ///
    /// struct RoundSte;
    ///
    /// impl<T: Float> CustomOp<T> for RoundSte {
    ///     fn name(&self) -> &'static str {
    ///         "round_ste"
    ///     }
    ///     fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
    ///         inputs.first().copied().ok_or_else(|| CustomError::Failed("takes one input".into()))
    ///     }
    ///     fn forward(&self, x: CustomInputs<'_, T>, out: &mut [T], _: &mut [T]) -> Result<(), CustomError> {
    ///         for (y, &x) in out.iter_mut().zip(x.value(0)) {
    ///             *y = T::from_f64(x.to_f64().round());
    ///         }
    ///         Ok(())
    ///     }
    ///     fn backward(
    ///         &self,
    ///         _x: CustomInputs<'_, T>,
    ///         _out: &[T],
    ///         _saved: &[T],
    ///         dout: &[T],
    ///         dx: &mut [Option<&mut [T]>],
    ///     ) -> Result<(), CustomError> {
    ///         if let Some(dx) = dx[0].as_deref_mut() {
    ///             for (d, &g) in dx.iter_mut().zip(dout) {
    ///                 *d += g; // straight through
    ///             }
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = Tensor::<f32>::from_vec(vec![0.2, 0.7, -1.4, 2.5], &[4])?;
    /// let mut g = Graph::<f32>::new();
    /// let (y, dx) = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     let y = s.custom(&RoundSte, &[x]);
    ///     s.backward((y * 3.0).sum())?; // L = 3 Σ round(x), passed straight through: dL/dx = 3
    ///     Ok::<_, tapir::Error>((y.to_tensor()?, x.grad().unwrap().to_vec()))
    /// })?;
    /// assert_eq!(y.data(), [0.0, 1.0, -1.0, 3.0]);
    /// assert_eq!(dx, [3.0; 4]);
    /// # Ok(()) }
    /// ```
    ///
    /// `op` is borrowed for `'g`, so it must outlive the scope: an op made, or borrowing
    /// data made, inside the scope cannot be recorded.
    ///
    /// ```compile_fail
    /// # use tapir::{CustomError, CustomInputs, CustomOp, Float, Graph, Shape, Tensor};
    /// struct Shift<'a>(&'a [f32]);
    /// impl CustomOp<f32> for Shift<'_> {
    ///     fn name(&self) -> &'static str { "shift" }
    ///     fn output_shape(&self, x: &[Shape]) -> Result<Shape, CustomError> { Ok(x[0]) }
    ///     fn forward(&self, x: CustomInputs<'_, f32>, out: &mut [f32], _: &mut [f32]) -> Result<(), CustomError> {
    ///         for ((y, &x), &c) in out.iter_mut().zip(x.value(0)).zip(self.0) { *y = x + c; }
    ///         Ok(())
    ///     }
    ///     fn backward(&self, _: CustomInputs<'_, f32>, _: &[f32], _: &[f32], dout: &[f32],
    ///                 dx: &mut [Option<&mut [f32]>]) -> Result<(), CustomError> {
    ///         if let Some(dx) = dx[0].as_deref_mut() { dx.iter_mut().zip(dout).for_each(|(d, g)| *d += g); }
    ///         Ok(())
    ///     }
    /// }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let c = s.full(&[2], 1.0).value().unwrap(); // lives in the scope's arena
    ///     let shift = Shift(c);
    ///     let _ = s.custom(&shift, &[s.leaf(&x)]); // `shift` does not outlive the scope
    /// });
    /// ```
    ///
    /// and its twin compiles, the data and the op being made before the scope:
    ///
    /// ```
    /// # use tapir::{CustomError, CustomInputs, CustomOp, Float, Graph, Shape, Tensor};
    /// # struct Shift<'a>(&'a [f32]);
    /// # impl CustomOp<f32> for Shift<'_> {
    /// #     fn name(&self) -> &'static str { "shift" }
    /// #     fn output_shape(&self, x: &[Shape]) -> Result<Shape, CustomError> { Ok(x[0]) }
    /// #     fn forward(&self, x: CustomInputs<'_, f32>, out: &mut [f32], _: &mut [f32]) -> Result<(), CustomError> {
    /// #         for ((y, &x), &c) in out.iter_mut().zip(x.value(0)).zip(self.0) { *y = x + c; }
    /// #         Ok(())
    /// #     }
    /// #     fn backward(&self, _: CustomInputs<'_, f32>, _: &[f32], _: &[f32], dout: &[f32],
    /// #                 dx: &mut [Option<&mut [f32]>]) -> Result<(), CustomError> {
    /// #         if let Some(dx) = dx[0].as_deref_mut() { dx.iter_mut().zip(dout).for_each(|(d, g)| *d += g); }
    /// #         Ok(())
    /// #     }
    /// # }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let c = [1.0f32, 2.0]; // outside the scope
    /// let shift = Shift(&c);
    /// let mut g = Graph::<f32>::new();
    /// let y = g.scope(|s| s.custom(&shift, &[s.leaf(&x)]).to_tensor()).unwrap();
    /// assert_eq!(y.data(), [2.0, 3.0]);
    /// ```
    ///
    /// The callbacks get slices and shapes, never the scope, so they cannot record on it
    /// (the tape's `RefCell` is borrowed while they run). An op that holds the scope to
    /// try anyway cannot be recorded, since the scope does not live for `'g`:
    ///
    /// ```compile_fail
    /// # use tapir::{CustomError, CustomInputs, CustomOp, Graph, Scope, Shape, Tensor};
    /// struct Sneaky<'s, 'g>(&'s Scope<'s, 'g, f32>);
    /// impl CustomOp<f32> for Sneaky<'_, '_> {
    ///     fn name(&self) -> &'static str { "sneaky" }
    ///     fn output_shape(&self, x: &[Shape]) -> Result<Shape, CustomError> { Ok(x[0]) }
    ///     fn forward(&self, _: CustomInputs<'_, f32>, _: &mut [f32], _: &mut [f32]) -> Result<(), CustomError> {
    ///         let _ = self.0.scalar(1.0); // would re-enter the tape's RefCell
    ///         Ok(())
    ///     }
    ///     fn backward(&self, _: CustomInputs<'_, f32>, _: &[f32], _: &[f32], _: &[f32],
    ///                 _: &mut [Option<&mut [f32]>]) -> Result<(), CustomError> { Ok(()) }
    /// }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let _ = s.custom(&Sneaky(s), &[s.leaf(&x)]); // `s` lives for 's, not 'g
    /// });
    /// ```
    ///
    /// and its twin, which only asks the same op its name, compiles:
    ///
    /// ```
    /// # use tapir::{CustomError, CustomInputs, CustomOp, Graph, Scope, Shape, Tensor};
    /// # struct Sneaky<'s, 'g>(&'s Scope<'s, 'g, f32>);
    /// # impl CustomOp<f32> for Sneaky<'_, '_> {
    /// #     fn name(&self) -> &'static str { "sneaky" }
    /// #     fn output_shape(&self, x: &[Shape]) -> Result<Shape, CustomError> { Ok(x[0]) }
    /// #     fn forward(&self, _: CustomInputs<'_, f32>, _: &mut [f32], _: &mut [f32]) -> Result<(), CustomError> {
    /// #         let _ = self.0.scalar(1.0); // would re-enter the tape's RefCell
    /// #         Ok(())
    /// #     }
    /// #     fn backward(&self, _: CustomInputs<'_, f32>, _: &[f32], _: &[f32], _: &[f32],
    /// #                 _: &mut [Option<&mut [f32]>]) -> Result<(), CustomError> { Ok(()) }
    /// # }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     assert_eq!(Sneaky(s).name(), "sneaky");
    /// });
    /// ```
    ///
    /// # Errors
    /// Recorded as the scope's error: the shape errors of [`CustomError`] (with the
    /// caller's location); [`Error::CustomOp`] if `output_shape`, `saved_len` or `forward`
    /// panics or fails; [`Error::NonFinite`] under anomaly detection; the arena's errors.
    /// In backward, [`Scope::backward`] returns [`Error::CustomOp`] (located where the op
    /// was recorded) if the op's backward panics or fails.
    #[track_caller]
    pub fn custom(&'s self, op: &'g dyn CustomOp<T>, inputs: &[Var<'s, T>]) -> Var<'s, T> {
        // The name is the caller's code too: a panic there is a typed error as well,
        // named by the kind.
        match guarded("custom", "name", Location::caller(), || Ok(op.name())) {
            Ok(name) => self.core.record_as(name, |r| record(r, op, inputs)),
            Err(e) => self.core.fail(e),
        }
    }
}

/// Checks, runs the op's forward and files it in the side table.
fn record<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    op: &'s (dyn CustomOp<T> + 's),
    inputs: &[Var<'s, T>],
) -> Result<(Op<'s, T>, Shape, &'s [T])> {
    let count = u32::try_from(inputs.len())
        .map_err(|_| r.invalid(format!("takes at most {} inputs, got {}", u32::MAX, inputs.len())))?;
    let mut scratch = r.take_custom_scratch();
    let result = forward(r, op, inputs, &mut scratch);
    r.restore_custom_scratch(scratch);
    let (shape, value, saved) = result?;
    let first = r.store_ids(inputs.iter().map(|x| x.id))?;
    let table = r.push_custom(CustomEntry { op, saved, name: r.op, location: r.location })?;
    Ok((Op::Custom { table, first, count }, shape, value))
}

fn forward<'s, T: Float>(
    r: &Rec<'_, 's, T>,
    op: &'s (dyn CustomOp<T> + 's),
    inputs: &[Var<'s, T>],
    scratch: &mut CustomScratch<'s, T>,
) -> Result<(Shape, &'s [T], &'s [T])> {
    let (name, location) = (r.op, r.location);
    scratch.values.clear();
    scratch.shapes.clear();
    for x in inputs {
        scratch.values.push(r.value(x.id));
        scratch.shapes.push(r.shape(x.id));
    }
    let shapes = &scratch.shapes[..];
    let shape = guarded(name, "output_shape", location, || op.output_shape(shapes))?;
    let saved_len = guarded(name, "saved_len", location, || Ok(op.saved_len(shapes)))?;
    let out = r.alloc(shape.numel())?;
    let saved = r.alloc(saved_len)?;
    let args = CustomInputs { values: &scratch.values, shapes };
    guarded(name, "forward", location, || op.forward(args, out, saved))?;
    Ok((shape, out, saved))
}

/// Calls the op's backward with the gradient slots of its inputs, taken out of the
/// gradient map for the call and put back (added, for an input given twice) afterwards.
#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    table: u32,
    first: u32,
    count: u32,
) -> Result<()> {
    let entry = ctx.custom_entry(table);
    let mut scratch = std::mem::take(&mut *ctx.custom);
    let dout = ctx.grads[out].take().expect("backward visits only nodes whose gradient exists");
    let result = backward_with(ctx, entry, (out, &*dout), first, count, &mut scratch);
    // Put every slot back, whether or not the op failed, so gradients stay readable; a slot
    // that is not the one handed out (the op's backward failed the check below) goes back
    // to no node, so no node reads a gradient of another length or another input's.
    let given = scratch.given.drain(..);
    for ((id, g), given) in ctx.stored_ids(first, count).zip(scratch.grads.drain(..)).zip(given) {
        if let Some(g) = g.filter(|g| given == Some(address(g))) {
            match &mut ctx.grads[id] {
                Some(slot) => kernels::add_assign(slot, g), // the same input given again, or a lent slot
                slot @ None => *slot = Some(g),
            }
        }
    }
    ctx.grads[out] = Some(dout);
    *ctx.custom = scratch;
    result
}

fn backward_with<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    entry: CustomEntry<'s, T>,
    (out, dout): (NodeId<'s>, &[T]),
    first: u32,
    count: u32,
    scratch: &mut CustomScratch<'s, T>,
) -> Result<()> {
    scratch.values.clear();
    scratch.shapes.clear();
    scratch.grads.clear();
    scratch.given.clear();
    for id in ctx.stored_ids(first, count) {
        scratch.values.push(ctx.value(id));
        scratch.shapes.push(ctx.shape(id));
        // A slot taken by an earlier occurrence of the same input reads `None` here and
        // gets a fresh zeroed buffer, added to the first one afterwards.
        let slot = if !ctx.requires_grad(id) {
            None
        } else {
            // On failure, the slots taken so far are the first ones, in order, and the
            // caller puts them back.
            let g = match ctx.grads[id].take() {
                Some(g) => g,
                None => ctx.first_grad(id)?,
            };
            if ctx.is_lent(g) {
                // A slot of `backward_into`'s buffer stays the engine's: user code gets a
                // fresh buffer, added into the slot once checked, so that a misbehaving
                // backward cannot leave the caller's buffer changed.
                let n = g.len();
                ctx.grads[id] = Some(g);
                Some(ctx.fresh_grad(n)?)
            } else {
                Some(g)
            }
        };
        scratch.given.push(slot.as_deref().map(address));
        scratch.grads.push(slot);
    }
    let args = CustomInputs { values: &scratch.values, shapes: &scratch.shapes };
    let (grads, value) = (&mut scratch.grads[..], ctx.value(out));
    guarded(entry.name, "backward", entry.location, || entry.op.backward(args, value, entry.saved, dout, grads))?;
    check_slots(entry, scratch)
}

/// A slice's address and length: what identifies a gradient slot.
fn address<T>(g: &[T]) -> (usize, usize) {
    (g.as_ptr() as usize, g.len())
}

/// Every slot the op's backward hands back must be the one it was given: the same buffer
/// (not a shorter or longer one, not another input's, not one of its own), and present
/// exactly where one was given.
fn check_slots<T: Float>(entry: CustomEntry<'_, T>, scratch: &CustomScratch<'_, T>) -> Result<()> {
    let slots = scratch.given.iter().zip(&scratch.grads).zip(&scratch.shapes).enumerate();
    for (k, ((&given, got), &shape)) in slots {
        let got = got.as_deref().map(address);
        if got == given {
            continue;
        }
        let swapped = got.and_then(|g| scratch.given.iter().position(|&o| o == Some(g)));
        let what = match (given, got, swapped) {
            (_, None, _) => "was dropped (set to `None`)".to_string(),
            (None, Some((_, n)), _) => format!("was `None` (the input needs no gradient) but came back as [{n}]"),
            (Some(_), Some((_, n)), Some(j)) => format!("came back holding input {j}'s slot, [{n}]"),
            (Some(_), Some((_, n)), None) => format!("came back as another buffer, [{n}]"),
        };
        return Err(Error::CustomOp {
            op: entry.name,
            phase: "backward",
            detail: format!(
                "the gradient slot of input {k} (shape {shape}) {what}; backward must add into the slots it is given \
                 and leave them in place"
            ),
            location: entry.location,
        });
    }
    Ok(())
}

/// Recorded derivative: the op's [`CustomOp::grad`], or [`Error::SecondOrderUnsupported`].
/// The handle lists are built per call (custom ops are outside the zero-allocation path).
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    table: u32,
    first: u32,
    count: u32,
) -> Result<()> {
    let entry = ctx.core.tape.borrow().custom[table as usize];
    let inputs: Vec<Var<'s, T>> = (0..count).map(|k| ctx.var(ctx.stored_id(first, k))).collect();
    let mut dinputs: Vec<Option<Var<'s, T>>> = vec![None; inputs.len()];
    let y = ctx.var(out);
    let provided = guarded(entry.name, "grad", entry.location, || Ok(entry.op.grad(&inputs, y, g, &mut dinputs)))?;
    if !provided {
        return Err(Error::SecondOrderUnsupported {
            op: ctx.core.op_name("grad"),
            custom: entry.name,
            inputs: inputs.iter().map(|x| x.shape()).collect(),
            location: Location::caller(),
        });
    }
    if ctx.core.tape.borrow().error.is_some() {
        // The op's derivative failed to record; the scope keeps the error.
        return Ok(());
    }
    for (k, (x, dx)) in inputs.iter().zip(&dinputs).enumerate() {
        if let Some(dx) = dx.filter(|dx| dx.shape() != x.shape()) {
            return Err(Error::CustomOp {
                op: entry.name,
                phase: "grad",
                detail: format!(
                    "returned a gradient of shape {} for input {k} of shape {}; each must have its input's shape",
                    dx.shape(),
                    x.shape()
                ),
                location: entry.location,
            });
        }
    }
    for (x, dx) in inputs.iter().zip(dinputs) {
        if let Some(dx) = dx.filter(|_| ctx.wants(x.id)) {
            ctx.add(x.id, dx);
        }
    }
    Ok(())
}

/// A custom op's tangent, from [`CustomOp::jvp`]: the inputs' tangents at the level (`None`
/// for zero) in, the output's out, checked to have the output's shape.
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    table: u32,
    first: u32,
    count: u32,
) -> Result<Option<Var<'s, T>>> {
    let entry = ctx.core.tape.borrow().custom[table as usize];
    let inputs: Vec<Var<'s, T>> = (0..count).map(|k| ctx.var(ctx.stored_id(first, k))).collect();
    let tangents: Vec<Option<Var<'s, T>>> = inputs.iter().map(|x| ctx.tangent(x.id)).collect();
    let y = ctx.var(out);
    let mut tangent = None;
    let provided =
        guarded(entry.name, "jvp", entry.location, || Ok(entry.op.jvp(&inputs, y, &tangents, &mut tangent)))?;
    if !provided {
        return Err(Error::ForwardUnsupported {
            op: "jvp",
            custom: entry.name,
            inputs: inputs.iter().map(|x| x.shape()).collect(),
            location: entry.location,
        });
    }
    match tangent {
        Some(t) if ctx.core.tape.borrow().error.is_none() && t.shape() != y.shape() => Err(Error::CustomOp {
            op: entry.name,
            phase: "jvp",
            detail: format!(
                "returned a tangent of shape {} for an output of shape {}; it must have the output's shape",
                t.shape(),
                y.shape()
            ),
            location: entry.location,
        }),
        t => Ok(t),
    }
}
