//! The handles, [`Scope`] and [`Var`], and every type they reach that reaches them back:
//! a `Var` points at the scope's [`Core`], whose [`State`] holds the side-table rows of
//! custom ops and checkpoints, which hold the user's [`CustomOp`] and [`Checkpoint`], whose
//! methods take `Scope`s and `Var`s. Those declarations form one knot, so they share this
//! file and nothing else does: their behaviour is elsewhere (`record/core.rs` records,
//! `record/state.rs` recycles the state, `graph/` and `ops/` give the handles their public
//! methods, `engine/` runs custom ops and checkpoints).
//!
//! `Graph::scope` hands the closure a `&'s Scope<'s, 'g, T>`. `'s` is a fresh lifetime
//! for each call (the closure must accept every `'s`), and every type that mentions it is
//! invariant in it, so a [`Var<'s>`](Var) can neither leave the closure nor meet a `Var`
//! of another scope. `'g` is the borrow of the graph and of whatever the closure borrows
//! from outside (parameters, inputs): those outlive the scope (`'g: 's`), so the scope can
//! read them without copying, and the borrow checker forbids changing them meanwhile.
//! The shape is the one `std::thread::scope` uses, for the same reasons.

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::fmt;
use std::marker::PhantomData;
use std::ops::{Deref, DerefMut};

use faer::Par;

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::record::custom_op::{CustomError, CustomInputs, CustomScratch};
use crate::shape::Shape;
use crate::storage::Arena;
use crate::tape::id::{NodeId, NodeMap};
use crate::tape::in_place::InPlace;
use crate::tape::profile::Profiler;
use crate::tape::tape::Tape;

/// One iteration's recording. Made by [`Graph::scope`](crate::Graph::scope); see there for the lifetimes.
pub struct Scope<'s, 'g: 's, T: Float = f32> {
    pub(crate) core: Core<'s, T>,
    /// The blocks of this scope's checkpoints, borrowed for `'g`, by table index (the
    /// tape's entries hold them for `'s` only, which is enough to recompute them on a
    /// nested scope). A checkpoint's recorded derivative runs its block on this scope
    /// itself, a `Scope<'s, 'g>`, and [`Checkpoint::forward`] asks for the block borrowed
    /// for the scope's `'g` (see `record/checkpoint.rs`, `Replay`). Empty, and never pushed
    /// to, on a nested scope, whose checkpoints run inline.
    pub(crate) blocks: RefCell<Vec<&'g (dyn Checkpoint<T> + 'g)>>,
    /// Invariant in `'g`, so that nothing borrowed for less than the graph's borrow (the
    /// arena's values, a leaked object holding the scope) can pass for a `'g` borrow.
    pub(crate) _env: PhantomData<&'g mut &'g ()>,
}

/// A handle to a node of the scope `'s`: `Copy`, 16 bytes, usable with `+ - * /`.
///
/// Ops on handles never panic and never return `Result`: a caller's mistake (mismatched
/// shapes, a bad axis, an index out of range, the arena limit) is recorded as the scope's
/// first error, with the op, every shape and the caller's location, and every later op
/// returns a poisoned handle. The error comes out of [`Scope::backward`](crate::Scope::backward),
/// [`Var::value`], [`Var::item`] or [`Scope::check`](crate::Scope::check); see `docs/design.md` for why.
#[derive(Clone, Copy)]
pub struct Var<'s, T: Float = f32> {
    pub(crate) core: &'s Core<'s, T>,
    pub(crate) id: NodeId<'s>,
}

/// The part of a scope that handles point at.
#[derive(Debug)]
pub struct Core<'s, T> {
    pub(crate) arena: &'s Arena,
    pub(crate) tape: RefCell<State<'s, T>>,
    pub(crate) par: Par,
    pub(crate) anomaly: bool,
    /// Anomaly detection or profiling is on: the record path's one test after the kernel.
    pub(crate) checks: bool,
    /// The public method being recorded when it records several primitives (`mean_axes`,
    /// `stack`, `conv2d`, ...): errors raised meanwhile name it rather than the primitive.
    pub(crate) composite: Cell<Option<&'static str>>,
}

/// The mutable state of one scope. Reads and writes of the tape itself go through
/// `Deref` to [`Tape`] (`state.nodes`, `state.push(..)`), so that recording code reads as
/// it did when the tape held everything.
#[derive(Debug)]
pub(crate) struct State<'s, T> {
    /// The record: nodes, shapes, payloads, locations.
    pub tape: Tape<'s, T>,
    /// The custom-op side table: `Op::Custom { table, .. }` is row `table`.
    pub custom: Vec<CustomEntry<'s, T>>,
    /// The lists custom ops' callbacks read and write, reused from op to op.
    pub custom_scratch: CustomScratch<'s, T>,
    /// The checkpoint side table: `Op::Checkpoint { table, .. }` is row `table`.
    pub checkpoints: Vec<CheckpointEntry<'s, T>>,
    /// Where checkpointed blocks record (the graph's scratch arena); `None` on a scope
    /// nested in a checkpoint, where a checkpoint runs inline.
    pub nest: Option<Nest<'s>>,
    /// The graph's profile while profiling is on (see `tape/profile.rs`); `slow` is then set.
    pub profile: Option<&'s Profiler>,
    /// Gradients after a backward pass (`None`: none reached the node).
    pub grads: NodeMap<'s, Option<&'s [T]>>,
    /// The side table of [`Scope::grad`](crate::Scope::grad): per node, whether the walk
    /// differentiates through it and its gradient handle so far. Kept between calls and
    /// scopes, so that a warmed-up call allocates nothing.
    pub slots: NodeMap<'s, Slot<'s>>,
    /// The first error of the scope; every later op returns a poisoned handle.
    pub error: Option<Error>,
    /// Set by a backward pass that did not retain the tape.
    pub consumed: bool,
    /// Depth of nested `no_grad` regions.
    pub no_grad: u32,
    /// The graph's scope count when this scope began, and the next draw index within it
    /// (see `Scope::next_draw`).
    pub step: u64,
    pub draws: u64,
    /// While a checkpointed block is recomputed on this tape for its recorded derivative,
    /// the stored-id range `(next, end)` of the checkpoint node's parameter inputs: the
    /// block's parameter reads take these nodes in order instead of recording new ones
    /// (see `engine/checkpoint/replay.rs`).
    pub replay: Option<(u32, u32)>,
    /// The addresses of the caller's gradient buffer while `backward_into` writes
    /// parameters' gradients straight into it (empty otherwise): a gradient in this range
    /// is not the arena's (see `Scope::memory_report`).
    pub lent: std::ops::Range<usize>,
    /// `backward_into`'s list of the buffer's slots that several nodes read, by slot
    /// index, kept for its capacity.
    pub shared_grads: Vec<(usize, &'s mut [T])>,
    /// A releasing pass's gradient buffers of nodes whose backward has run, kept for its
    /// capacity between passes (see `engine::backward::run_with`).
    pub spare_grads: Vec<&'s mut [T]>,
    /// During `backward_into`'s pass: the buffer's slots lent to single parameter nodes,
    /// sorted by node (see `engine::backward::run_with`). Empty otherwise, kept for its capacity.
    pub lent_grads: Vec<Lent<'s, T>>,
    /// Bytes of gradient buffers that the last releasing pass gave up and nothing reused.
    pub released_bytes: usize,
    /// Set when the caller reads or aliases a value (`Var::value`, `detach`, ...): a
    /// checkpointed block that does so is recomputed without in-place ops.
    pub values_read: Cell<bool>,
    /// In-place ops of a checkpointed block (see [`InPlace`]).
    pub in_place: InPlace<'s, T>,
    /// Forward mode: per open level, each node's tangent (see `engine/jvp.rs`). Empty, and
    /// allocated nothing, until a level is opened.
    pub tangents: Tangents<'s, T>,
    /// Set while the scope has an error, `in_place` holds a buffer back, the profile runs
    /// or a forward-mode level is open: recording tests this one flag and takes its slow
    /// path (`Core::record_reading`).
    pub slow: bool,
}

/// The tangents of forward mode: a side table per open level, mapping a node to the node
/// holding its tangent (`None`: zero). Tangents are recorded ops like any other, so they
/// can be differentiated again, and they cost nothing while no level is open: `Node` and
/// `Op` carry no tangent, and the record path's one slow-path test covers the hook.
pub(crate) struct Tangents<'s, T> {
    /// Per level, outermost first: node → its tangent.
    pub levels: Vec<NodeMap<'s, Option<NodeId<'s>>>>,
    /// Levels at or above `cut` do not propagate: the rule of level `cut` is being
    /// recorded (its own ops have no tangent at that level or at inner ones, which see
    /// them only as constants). Equal to `levels.len()` otherwise.
    pub cut: usize,
    /// Incremented by every level opened, so a closed level's handle cannot read a later one.
    pub generation: u32,
    /// The generation of each open level.
    pub generations: Vec<u32>,
    /// Runs the forward rule of a node just recorded (`engine::jvp::propagate`), handed in
    /// when the first level opens: recording cannot import the rules it would run.
    pub hook: Option<(JvpHook<T>, &'s (dyn Replay<'s, T> + 's))>,
}

/// The function that records a node's tangents at the open levels (see [`Tangents::hook`]).
pub(crate) type JvpHook<T> = for<'s> fn(&'s Core<'s, T>, &'s (dyn Replay<'s, T> + 's), NodeId<'s>);

impl<T> Default for Tangents<'_, T> {
    fn default() -> Self {
        Tangents { levels: Vec::new(), cut: 0, generation: 0, generations: Vec::new(), hook: None }
    }
}

impl<T> fmt::Debug for Tangents<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tangents").field("levels", &self.levels.len()).field("cut", &self.cut).finish_non_exhaustive()
    }
}

impl<'s, T> Tangents<'s, T> {
    /// Whether a node recorded now gets tangents: some level propagates.
    #[inline]
    pub(crate) fn active(&self) -> bool {
        self.cut > 0
    }

    /// The tangent of `id` at `level`, if it has one.
    pub(crate) fn get(&self, level: usize, id: NodeId<'s>) -> Option<NodeId<'s>> {
        self.levels.get(level).and_then(|m| m.get(id).copied().flatten())
    }

    /// Sets the tangent of `id` at `level`.
    pub(crate) fn set(&mut self, level: usize, id: NodeId<'s>, t: NodeId<'s>) {
        let map = &mut self.levels[level];
        if map.get(id).is_none() {
            map.resize_with(id.index() + 1, || None);
        }
        map[id] = Some(t);
    }
}

impl<'s, T> Deref for State<'s, T> {
    type Target = Tape<'s, T>;
    #[inline(always)]
    fn deref(&self) -> &Tape<'s, T> {
        &self.tape
    }
}

impl<'s, T> DerefMut for State<'s, T> {
    #[inline(always)]
    fn deref_mut(&mut self) -> &mut Tape<'s, T> {
        &mut self.tape
    }
}

/// One node's entry in the side table of a recorded gradient (see `engine/grad.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slot<'s> {
    /// Whether the node requires a gradient and depends on one of the inputs asked for.
    pub needed: bool,
    /// The gradient handle accumulated so far (`None`: no contribution yet).
    pub grad: Option<NodeId<'s>>,
    /// Whether `grad` is still to be broadcast to the node's shape: the derivative of a
    /// sum, kept small until something needs it at full size (see `GradCtx::add_broadcast`).
    pub bcast: bool,
}

/// A slot of `backward_into`'s buffer lent to the one parameter node that reads it: the
/// node's first gradient takes it (`None` after). A `Cell`, as the walk reads the tape
/// through a shared borrow.
pub(crate) struct Lent<'s, T> {
    pub node: NodeId<'s>,
    pub slot: Cell<Option<&'s mut [T]>>,
}

impl<T> fmt::Debug for Lent<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Lent").field("node", &self.node.index()).finish_non_exhaustive()
    }
}

/// One row of a scope's custom-op side table: `Copy`, so the table clears in O(1).
#[derive(Clone, Copy)]
pub(crate) struct CustomEntry<'s, T> {
    pub(crate) op: &'s (dyn CustomOp<T> + 's),
    pub(crate) saved: &'s [T],
    /// The name errors report, taken once when the op was recorded.
    pub(crate) name: &'static str,
    pub(crate) location: Loc,
}

impl<T> fmt::Debug for CustomEntry<'_, T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (saved {}, recorded at {})", self.name, self.saved.len(), self.location)
    }
}

/// One row of a scope's checkpoint side table: `Copy`, so the table clears in O(1).
#[derive(Clone, Copy)]
pub(crate) struct CheckpointEntry<'s, T> {
    pub(crate) block: &'s (dyn Checkpoint<T> + 's),
    pub(crate) part: u32,
    /// How many of the node's stored inputs are the block's own; the rest are parameters.
    pub(crate) inputs: u32,
    /// The scope's draw count when the block began (see [`Scope::next_draw`]), replayed by
    /// the recomputation.
    pub(crate) draws: u64,
    /// Where the tape's payload list holds the positions of the block's nodes that the
    /// recomputation overwrites in place, and how many (see `engine/checkpoint/in_place.rs`).
    pub(crate) in_place: (u32, u32),
    pub(crate) location: Loc,
}

/// What a scope needs to record a checkpointed block: the graph's scratch arena and the
/// scope's settings.
///
/// The scratch is held as `dyn Any` (a [`Scratch<T>`]) because
/// the tape's type has no `T: 'static` bound to name it with; every use downcasts it back
/// (see [`Nest::scratch`]), which cannot fail, since only `Graph<T>::scope` makes one.
#[derive(Clone, Copy)]
pub(crate) struct Nest<'s> {
    pub(crate) scratch: &'s dyn Any,
    pub(crate) par: Par,
    pub(crate) anomaly: bool,
    pub(crate) profile: Option<&'s Profiler>,
}

/// A block of ops to checkpoint: its intermediate values are not kept for backward but
/// recomputed from its inputs, trading compute for memory (PyTorch's
/// `torch.utils.checkpoint`, JAX's `jax.checkpoint`).
///
/// `forward` records the block on the scope it is given, from `inputs`, and returns its
/// one output. It runs once in the forward pass and once more during backward, so it
/// must be deterministic: the same ops on the same shapes, reading the same parameters in
/// the same order (random draws keyed by something other than a generator it advances;
/// see `tapir_nn::Dropout`). The scope is nested: its handles (`'c`) cannot leave it, and
/// what it borrows must live for `'e`, the block's own borrow, so a block that reads
/// parameters holds a reference to their store.
///
/// A plain function `fn(&Scope, &[Var]) -> Var` is a block (the `part` is ignored):
///
/// ```
/// use tapir::{Graph, Scope, Tensor, Var};
/// # fn main() -> Result<(), tapir::Error> {
/// fn block<'c>(s: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
///     (x[0] * x[0]).exp() + s.scalar(1.0) // y = exp(x²) + 1
/// }
/// let x = Tensor::from_vec(vec![0.5, -1.0], &[2])?;
/// let mut g = Graph::<f64>::new();
/// let dx = g.scope(|s| {
///     let x = s.leaf(&x);
///     let y = s.checkpoint(&block, &[x]);
///     s.backward(y.sum())?; // dL/dx = 2x·exp(x²)
///     Ok::<_, tapir::Error>(x.grad().unwrap().to_vec())
/// })?;
/// assert!((dx[0] - 1.0 * 0.25f64.exp()).abs() < 1e-12);
/// assert!((dx[1] + 2.0 * 1.0f64.exp()).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub trait Checkpoint<T: Float> {
    /// Records the block on `s` from `inputs`. `part` is the number given to
    /// [`Scope::checkpoint_part`] (0 for [`Scope::checkpoint`]), so that one object can
    /// stand for several blocks (the chunks of a layer stack, say).
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, T>, inputs: &[Var<'c, T>], part: u32) -> Var<'c, T>;
}

impl<T: Float, F> Checkpoint<T> for F
where
    F: for<'c, 'e> Fn(&'c Scope<'c, 'e, T>, &[Var<'c, T>]) -> Var<'c, T>,
{
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, T>, inputs: &[Var<'c, T>], _part: u32) -> Var<'c, T> {
        self(s, inputs)
    }
}

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
/// Two worked examples, a fused softplus and a straight-through estimator, are in
/// [`Scope::custom`].
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

    /// The forward-mode derivative as recorded ops, for [`Scope::forward`] (tangents):
    /// `inputs` are handles of the op's inputs, `out` of its output, and `tangents[i]` the
    /// tangent of input `i` (`None`: zero). Set `tangent` (initially `None`, meaning zero)
    /// to the output's tangent, `Σᵢ ∂out/∂inputᵢ · tangents[i]`, of the output's shape,
    /// computed with [`Var`] methods, and return `true`.
    ///
    /// The default returns `false`: the op has no forward rule, and a tangent reaching it
    /// fails with [`Error::ForwardUnsupported`] naming the op.
    fn jvp<'s>(
        &self,
        inputs: &[Var<'s, T>],
        out: Var<'s, T>,
        tangents: &[Option<Var<'s, T>>],
        tangent: &mut Option<Var<'s, T>>,
    ) -> bool
    where
        T: Float,
    {
        let _ = (inputs, out, tangents, tangent);
        false
    }
}

/// A scope as the recorded derivative of a checkpoint, or its tangent, sees it: something that runs the
/// block of checkpoint `table` on itself. Implemented by `Scope<'s, 'g, T>`, which holds
/// its blocks borrowed for `'g` ([`Checkpoint::forward`] needs the block borrowed for the
/// scope's `'g`); the derivative ops see a `&'s dyn Replay<'s, T>`, with no `'g` to name,
/// so the scope stays invariant in `'g`.
pub(crate) trait Replay<'s, T: Float> {
    /// Runs checkpoint `table`'s block on this scope from `inputs`: its output, or the
    /// error of a block that panicked.
    fn replay(&'s self, table: u32, inputs: &[Var<'s, T>], part: u32) -> Result<Var<'s, T>>;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_plain_data() {
        assert!(!std::mem::needs_drop::<CheckpointEntry<'static, f32>>());
        assert_eq!(std::mem::size_of::<crate::tape::op::Op<'static, f32>>(), 16);
    }

    #[test]
    fn entries_and_scratch_are_plain_data() {
        // A fat reference, a slice, a name and a location: no destructor to run on reset.
        assert!(!std::mem::needs_drop::<CustomEntry<'static, f32>>());
        assert_eq!(std::mem::size_of::<CustomEntry<'static, f32>>(), 56);
    }
}
