//! User-defined ops: [`CustomOp`], recorded with [`Scope::custom`].
//!
//! A custom op has one output. The caller supplies its name, its output shape from the
//! input shapes, a forward pass from input slices into a zeroed output slice of the right
//! length (and, optionally, into a scratch slice of its own size saved for backward), and
//! a backward pass that *adds* `∂L/∂inputᵢ` into each input's gradient from `dout = ∂L/∂out`,
//! like the built-in ops.
//!
//! How it is stored: the node is `Op::Custom { table, first, count }`. The inputs are
//! stored ids (as concat's); `table` indexes the scope's side table of [`CustomEntry`]s,
//! each a borrowed `&'s dyn CustomOp<T>` (the caller lends it for `'g`, which outlives the
//! scope), the saved slice in the arena, the op's name and the caller's location. Nothing
//! is boxed: the side table is a `Vec` of `Copy` entries that the graph keeps between
//! scopes, emptied and relabelled like the tape's other vectors, so recording a custom op
//! allocates only in the arena after warm-up, and the scope's end still frees everything
//! in O(1) without running a destructor.
//!
//! The callbacks receive slices and shapes only, never the scope or a handle, so they
//! cannot record on the scope (the `RefCell` holding the tape is borrowed while they run).
//! A callback that panics or returns a [`CustomError`] becomes an [`Error`] naming the op:
//! while recording, the scope's first error; in backward, the error `backward` returns.

use std::any::Any;
use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};

use crate::error::{Error, Loc, Result};
use crate::graph::{NodeId, Scope, Var};
use crate::kernels;
use crate::ops::Op;
use crate::record::{BackwardCtx, GradCtx, Rec};
use crate::shape::Shape;
use crate::Float;

/// A user-defined op with one output and its own backward, recorded with
/// [`Scope::custom`]. Implement it for `f32` and `f64` at once with
/// `impl<T: Float> CustomOp<T> for MyOp`.
///
/// The op is borrowed for the graph's lifetime (`&'g dyn CustomOp<T>`), not boxed or
/// cloned: define it before [`Graph::scope`](crate::Graph::scope). A constant expression
/// such as `&Softplus` for a unit struct is promoted to `'static` and may be written inline.
/// Parameters enter as inputs (`s.custom(&op, &[x, s.param(&store, w)])`), so a custom op
/// holds them by [`ParamId`](crate::ParamId) at most, like the layers of `tapir-nn`.
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
/// # Second derivatives
///
/// [`Scope::grad`] records every op's derivative as ops on the tape, so that it can be
/// differentiated again. A custom op takes part by implementing [`grad`](CustomOp::grad),
/// which expresses its derivative with [`Var`] methods; without it, `Scope::grad` through
/// the op is [`Error::SecondOrderUnsupported`] naming the op (the fast
/// [`backward`](CustomOp::backward) is unaffected).
pub trait CustomOp<T> {
    /// The op's name in errors, anomaly reports, [`Scope::dump`] and
    /// [`Scope::memory_report`] (not the generic `"custom"` of [`OpKind::Custom`](crate::OpKind::Custom)).
    fn name(&self) -> &'static str;

    /// The output's shape from the inputs' shapes, in the order given to
    /// [`Scope::custom`]. A [`CustomError`] becomes the scope's error, with this op's name
    /// and the caller's location.
    ///
    /// # Errors
    /// A [`CustomError`] if the shapes do not suit the op.
    fn output_shape(&self, inputs: &[Shape]) -> std::result::Result<Shape, CustomError>;

    /// How many elements of scratch [`forward`](CustomOp::forward) saves for
    /// [`backward`](CustomOp::backward) (in the arena, zeroed). None by default.
    fn saved_len(&self, inputs: &[Shape]) -> usize {
        let _ = inputs;
        0
    }

    /// Computes the output into `out` (zeroed, with the element count of
    /// [`output_shape`](CustomOp::output_shape)) and fills `saved` (of
    /// [`saved_len`](CustomOp::saved_len) elements) with whatever backward needs.
    ///
    /// # Errors
    /// A [`CustomError`], which becomes the scope's error.
    fn forward(
        &self,
        inputs: CustomInputs<'_, T>,
        out: &mut [T],
        saved: &mut [T],
    ) -> std::result::Result<(), CustomError>;

    /// Adds `∂L/∂inputᵢ` into `dinputs[i]` from `dout = ∂L/∂out`, for every `i` whose
    /// slot is `Some` (`None`: that input needs no gradient). Add, do not overwrite: the
    /// slot may already hold other ops' contributions. `out` is the forward output and
    /// `saved` what forward saved. An input given twice gets two slots, each to be added to.
    ///
    /// # Errors
    /// A [`CustomError`], which [`Scope::backward`] returns.
    fn backward(
        &self,
        inputs: CustomInputs<'_, T>,
        out: &[T],
        saved: &[T],
        dout: &[T],
        dinputs: &mut [Option<&mut [T]>],
    ) -> std::result::Result<(), CustomError>;

    /// The derivative as recorded ops, for [`Scope::grad`] (gradients that are
    /// differentiated again). `inputs` are handles of the op's inputs, `out` of its output
    /// and `dout` of `∂L/∂out`; set `dinputs[i]` (initially `None`) to `∂L/∂inputᵢ`, of
    /// input `i`'s shape, computed from them with [`Var`] methods, for every input that
    /// needs one, and return `true`. A slot left `None` contributes nothing.
    ///
    /// The default returns `false`: the op has no recorded derivative, and `Scope::grad`
    /// through it fails with [`Error::SecondOrderUnsupported`].
    fn grad<'s>(
        &self,
        inputs: &[Var<'s, T>],
        out: Var<'s, T>,
        dout: Var<'s, T>,
        dinputs: &mut [Option<Var<'s, T>>],
    ) -> bool
    where
        T: Float,
    {
        let _ = (inputs, out, dout, dinputs);
        false
    }
}

/// The inputs of a custom op, in the order given to [`Scope::custom`]: each one's values
/// (row-major) and shape.
#[derive(Clone, Copy, Debug)]
pub struct CustomInputs<'a, T> {
    values: &'a [&'a [T]],
    shapes: &'a [Shape],
}

impl<'a, T> CustomInputs<'a, T> {
    /// Inputs from values and shapes (for calling an op's methods directly, in a test).
    /// The two lists are paired in order; a length mismatch is the caller's.
    pub fn new(values: &'a [&'a [T]], shapes: &'a [Shape]) -> CustomInputs<'a, T> {
        CustomInputs { values, shapes }
    }

    /// How many inputs.
    pub fn len(&self) -> usize {
        self.values.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Input `i`'s values. Panics if `i >= len()` (inside a callback, that panic becomes
    /// an error naming the op).
    pub fn value(&self, i: usize) -> &'a [T] {
        self.values[i]
    }

    /// Input `i`'s shape. Panics if `i >= len()`.
    pub fn shape(&self, i: usize) -> Shape {
        self.shapes[i]
    }

    /// Every input's values.
    pub fn values(&self) -> &'a [&'a [T]] {
        self.values
    }

    /// Every input's shape.
    pub fn shapes(&self) -> &'a [Shape] {
        self.shapes
    }
}

/// Why a custom op's callback failed. The engine turns it into an [`Error`] that names
/// the op and the caller's location: the shape variants into the built-in ops' shape
/// errors, [`Failed`](CustomError::Failed) into [`Error::CustomOp`].
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum CustomError {
    /// Two shapes had to be equal: [`Error::ShapeMismatch`].
    ShapeMismatch {
        /// The first shape.
        lhs: Shape,
        /// The second shape.
        rhs: Shape,
    },
    /// Two shapes had to broadcast: [`Error::Broadcast`].
    Broadcast {
        /// The first shape.
        lhs: Shape,
        /// The second shape.
        rhs: Shape,
    },
    /// Another problem with an input's shape: [`Error::InvalidShape`].
    InvalidShape {
        /// The offending input's shape.
        shape: Shape,
        /// What is wrong and what would be valid.
        detail: String,
    },
    /// Anything else: [`Error::CustomOp`].
    Failed(String),
}

impl From<String> for CustomError {
    fn from(detail: String) -> Self {
        CustomError::Failed(detail)
    }
}

impl From<&str> for CustomError {
    fn from(detail: &str) -> Self {
        CustomError::Failed(detail.to_string())
    }
}

impl CustomError {
    fn into_error(self, op: &'static str, phase: &'static str, location: Loc) -> Error {
        match self {
            CustomError::ShapeMismatch { lhs, rhs } => Error::ShapeMismatch { op, lhs, rhs, location },
            CustomError::Broadcast { lhs, rhs } => Error::Broadcast { op, lhs, rhs, location },
            CustomError::InvalidShape { shape, detail } => Error::InvalidShape { op, shape, detail, location },
            CustomError::Failed(detail) => Error::CustomOp { op, phase, detail, location },
        }
    }
}

/// One row of a scope's custom-op side table: `Copy`, so the table clears in O(1).
#[derive(Clone, Copy)]
pub(crate) struct CustomEntry<'s, T> {
    op: &'s (dyn CustomOp<T> + 's),
    saved: &'s [T],
    /// The name errors report, taken once when the op was recorded.
    pub(crate) name: &'static str,
    location: Loc,
}

impl<T> fmt::Debug for CustomEntry<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (saved {}, recorded at {})", self.name, self.saved.len(), self.location)
    }
}

/// Lists the callbacks read and write, kept with their capacity between ops and scopes
/// (see `Tape::custom_scratch`), so that calling a custom op allocates nothing.
#[derive(Debug)]
pub(crate) struct CustomScratch<'s, T> {
    values: Vec<&'s [T]>,
    shapes: Vec<Shape>,
    grads: Vec<Option<&'s mut [T]>>,
}

impl<T> Default for CustomScratch<'_, T> {
    fn default() -> Self {
        CustomScratch { values: Vec::new(), shapes: Vec::new(), grads: Vec::new() }
    }
}

impl<'s, T> CustomScratch<'s, T> {
    /// The same lists, emptied, under another scope's lifetime (see `graph::tape::recycle`).
    pub(crate) fn recycle<'b>(self) -> CustomScratch<'b, T> {
        use crate::graph::tape::recycle;
        CustomScratch { values: recycle(self.values), shapes: recycle(self.shapes), grads: recycle(self.grads) }
    }
}

/// A panic's message, as well as it can be recovered.
fn panic_detail(payload: &(dyn Any + Send)) -> String {
    let msg = payload
        .downcast_ref::<&str>()
        .copied()
        .or_else(|| payload.downcast_ref::<String>().map(String::as_str))
        .unwrap_or("a non-string payload");
    format!("panicked: {msg}")
}

/// Runs one callback of the op `op`: a panic or a [`CustomError`] becomes the [`Error`]
/// of `phase` at `location`.
fn guarded<R>(
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
    /// Records the user-defined op `op` on `inputs` (see [`CustomOp`], which shows a fused
    /// softplus and a straight-through estimator). The output requires a gradient if any
    /// input does; errors name the op by [`CustomOp::name`].
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
    // Put every slot back, whether or not the op failed, so gradients stay readable.
    for (id, g) in ctx.stored_ids(first, count).zip(scratch.grads.drain(..)) {
        if let Some(g) = g {
            match &mut ctx.grads[id] {
                Some(slot) => kernels::add_assign(slot, g), // the same input given again
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
    for id in ctx.stored_ids(first, count) {
        scratch.values.push(ctx.value(id));
        scratch.shapes.push(ctx.shape(id));
        // A slot taken by an earlier occurrence of the same input reads `None` here and
        // gets a fresh zeroed buffer, added to the first one afterwards.
        let slot = if !ctx.requires_grad(id) {
            None
        } else if let Some(g) = ctx.grads[id].take() {
            Some(g)
        } else {
            // On failure, the slots taken so far are the first ones, in order, and the
            // caller puts them back.
            Some(ctx.first_grad(id)?)
        };
        scratch.grads.push(slot);
    }
    let args = CustomInputs { values: &scratch.values, shapes: &scratch.shapes };
    let (grads, value) = (&mut scratch.grads[..], ctx.value(out));
    guarded(entry.name, "backward", entry.location, || entry.op.backward(args, value, entry.saved, dout, grads))
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
    for (x, dx) in inputs.iter().zip(dinputs) {
        if let Some(dx) = dx.filter(|_| ctx.wants(x.id)) {
            ctx.add(x.id, dx);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_and_scratch_are_plain_data() {
        // A fat reference, a slice, a name and a location: no destructor to run on reset.
        assert!(!std::mem::needs_drop::<CustomEntry<'static, f32>>());
        assert_eq!(std::mem::size_of::<CustomEntry<'static, f32>>(), 56);
    }
}
