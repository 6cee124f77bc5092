//! The toolkit rules are written against: [`Rec`], what an op's recording closure sees,
//! [`BackwardCtx`], what its backward function sees, and [`GradCtx`], what its recorded
//! derivative sees (its accumulation helpers, which record ops, are `ops/accumulate.rs`;
//! the walks that hand these out are `engine/`).

use faer::Par;

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::record::custom_op::CustomScratch;
use crate::record::handles::{Core, CustomEntry, Lent, Replay, Slot, State, Var};
use crate::shape::{resolve_axis, Shape};
use crate::storage::{AllocFail, Arena};
use crate::tape::id::{NodeId, NodeMap};
use crate::tape::tape::{NodeView, Tape};

/// What an op's recording closure sees: the tape so far, the arena, and the name and
/// location that errors report (the method the caller called, and the caller's line).
pub(crate) struct Rec<'a, 's, T> {
    pub(crate) tape: &'a mut State<'s, T>,
    pub(crate) arena: &'s Arena,
    pub op: &'static str,
    pub location: Loc,
}

impl<'s, T: Float> Rec<'_, 's, T> {
    pub fn node(&self, id: NodeId<'s>) -> NodeView<'s, T> {
        self.tape.node(id)
    }

    #[inline]
    pub fn value(&self, id: NodeId<'s>) -> &'s [T] {
        self.tape.value(id)
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.tape.shape(id)
    }

    fn alloc_err(&self, e: AllocFail) -> Error {
        alloc_error(e, self.op, self.location)
    }

    /// A zeroed slice of `n` elements in the arena.
    pub fn alloc(&self, n: usize) -> Result<&'s mut [T]> {
        self.arena.alloc_zeroed(n).map_err(|e| self.alloc_err(e))
    }

    /// A slice of `n` elements that the op writes whole before anything reads it: its
    /// values are unspecified until then (an earlier scope's, in a warmed-up arena; see
    /// [`Arena::alloc_stale`]), so no zero fill precedes the kernel's own pass.
    pub fn alloc_written(&self, n: usize) -> Result<&'s mut [T]> {
        self.arena.alloc_stale(n).map_err(|e| self.alloc_err(e))
    }

    /// A slice filled from an exact-size iterator, in one pass.
    #[inline]
    pub fn alloc_iter<I>(&self, iter: I) -> Result<&'s mut [T]>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        self.arena.alloc_iter(iter).map_err(|e| self.alloc_err(e))
    }

    /// The value of the node being recorded, `out`, as the node keeps it: `out` itself,
    /// or, where a checkpoint's recomputation showed that the next node overwrites it in
    /// place, an empty value while `out` is held back for that node (see
    /// [`InPlace`](crate::tape::in_place::InPlace)).
    #[inline]
    pub fn hold_for_reader(&mut self, out: &'s mut [T]) -> &'s [T] {
        let pos = self.tape.nodes.len();
        match u32::try_from(pos) {
            Ok(pos) if self.tape.in_place.listed(pos) => {
                self.tape.in_place.pending = Some((pos, out));
                self.tape.slow = true;
                &[]
            }
            _ => out,
        }
    }

    /// Makes `buf`, handed to an in-place op by
    /// [`Core::record_reading`](crate::record::core::Core::record_reading) and now holding
    /// that op's output, the value of its producer `x` too, and returns it.
    pub fn overwrite(&mut self, x: NodeId<'s>, buf: &'s mut [T]) -> &'s [T] {
        let buf: &'s [T] = buf;
        self.tape.nodes[x.index()].value = buf;
        buf
    }

    /// Appends `items` to the tape's payload list and returns their offset. The payload
    /// counts against the arena's limit, and growing the list is fallible.
    pub fn extra<I>(&mut self, items: I) -> Result<u32>
    where
        I: IntoIterator<Item = u32>,
        I::IntoIter: ExactSizeIterator,
    {
        let items = items.into_iter();
        let at = self.make_room(items.len())?;
        self.tape.extra.extend(items);
        Ok(at)
    }

    /// Stores node ids in the payload list and returns their offset (see [`extra`](Rec::extra)).
    pub fn store_ids<I>(&mut self, ids: I) -> Result<u32>
    where
        I: IntoIterator<Item = NodeId<'s>>,
        I::IntoIter: ExactSizeIterator,
    {
        let ids = ids.into_iter();
        self.make_room(ids.len())?;
        self.tape.store_ids(ids).map_err(|len| Error::TapeFull { op: self.op, len, location: self.location })
    }

    /// Charges `n` payload entries to the arena and reserves them; the offset they go at.
    fn make_room(&mut self, n: usize) -> Result<u32> {
        let at = self.tape.extra.len();
        let at = u32::try_from(at).map_err(|_| Error::TapeFull { op: self.op, len: at, location: self.location })?;
        let bytes = n.saturating_mul(4);
        self.arena.charge(bytes).map_err(|e| self.alloc_err(e))?;
        self.tape.extra.try_reserve(n).map_err(|_| Error::OutOfMemory {
            op: self.op,
            requested: bytes,
            location: self.location,
        })?;
        Ok(at)
    }

    /// The `count` ids stored at `at`.
    pub fn stored_ids(&self, at: u32, count: u32) -> impl Iterator<Item = NodeId<'s>> + '_ {
        self.tape.stored_ids(at, count)
    }

    /// The custom-op scratch lists, taken out of the tape while a custom op runs (give
    /// them back with [`restore_custom_scratch`](Rec::restore_custom_scratch)).
    pub fn take_custom_scratch(&mut self) -> CustomScratch<'s, T> {
        std::mem::take(&mut self.tape.custom_scratch)
    }

    pub fn restore_custom_scratch(&mut self, scratch: CustomScratch<'s, T>) {
        self.tape.custom_scratch = scratch;
    }

    /// Files a custom op in the side table and returns its row.
    pub fn push_custom(&mut self, entry: CustomEntry<'s, T>) -> Result<u32> {
        let at = self.tape.custom.len();
        let at = u32::try_from(at).map_err(|_| Error::TapeFull { op: self.op, len: at, location: self.location })?;
        self.tape.custom.push(entry);
        Ok(at)
    }

    /// Resolves a possibly negative axis against `shape`.
    pub fn axis(&self, shape: Shape, axis: isize) -> Result<usize> {
        resolve_axis(shape.rank(), axis).ok_or(Error::BadAxis { op: self.op, axis, shape, location: self.location })
    }

    /// A shape from dimensions, or the `InvalidShape` error naming this op and `input`.
    pub fn shape_of(&self, input: Shape, dims: &[usize]) -> Result<Shape> {
        crate::error::shape_at(self.op, input, dims, self.location)
    }

    pub fn invalid(&self, detail: String) -> Error {
        Error::InvalidArgument { op: self.op, detail, location: self.location }
    }
}

/// The arena's failure as the typed error of `op` at `location`.
pub(crate) fn alloc_error(e: AllocFail, op: &'static str, location: Loc) -> Error {
    match e {
        AllocFail::Limit { requested, in_use, limit } => Error::ArenaLimit { op, requested, in_use, limit, location },
        AllocFail::Oom { requested } => Error::OutOfMemory { op, requested, location },
    }
}

/// What an op's backward function sees.
pub(crate) struct BackwardCtx<'a, 's, T> {
    pub(crate) tape: &'a State<'s, T>,
    pub(crate) grads: &'a mut NodeMap<'s, Option<&'s mut [T]>>,
    pub(crate) arena: &'s Arena,
    /// The custom-op scratch lists, out of the tape for the pass (the walk reads the
    /// tape through a shared borrow).
    pub(crate) custom: &'a mut CustomScratch<'s, T>,
    pub par: Par,
    pub(crate) location: Loc,
    /// In a pass that releases intermediate gradients (`backward_into`): the buffers of
    /// nodes whose backward has run, which later first uses take before the arena (their
    /// elements are stale). `backward_into`'s lent slots are the tape's `lent_grads`.
    pub(crate) spare: Option<&'a mut Vec<&'s mut [T]>>,
}

/// [`BackwardCtx::grad_pair_write`]'s answer: `∂L/∂out`, the input's gradient buffer, and
/// whether this is its first gradient (the buffer's elements are then unspecified).
pub(crate) type WritePair<'b, T> = (&'b [T], &'b mut [T], bool);

/// Up to this many elements a rule zeroes a first gradient and adds into it rather than
/// take [`BackwardCtx::first_grad_slot`]: a short buffer is cheaper to zero than to fill
/// from an iterator (shape-`[1]` backward took 30–45 more instructions per op that way,
/// callgrind).
pub(crate) const FIRST_MIN: usize = 16;

/// An input's empty gradient slot, for its first gradient.
pub(crate) struct First<'b, 's, T> {
    slot: &'b mut Option<&'s mut [T]>,
    arena: &'s Arena,
    location: Loc,
}

impl<'s, T: Float> First<'_, 's, T> {
    /// Makes the input's gradient buffer from `values`, one per element, in one pass. The
    /// values are added to zero, as the accumulating path does, so that both give the
    /// same bits (`0 + (−0) = +0`) whichever runs.
    #[inline]
    pub(crate) fn set(self, values: impl ExactSizeIterator<Item = T>) -> Result<()> {
        let g = self
            .arena
            .alloc_iter(values.map(|v| T::ZERO + v))
            .map_err(|e| alloc_error(e, "backward", self.location))?;
        *self.slot = Some(g);
        Ok(())
    }
}

/// How many of the most recently released buffers a fresh gradient looks through for one
/// of its length: bounded, so that a pass over many distinct sizes stays linear.
const SPARE_LOOKUP: usize = 8;

/// The buffer of `input`'s first gradient, `n` elements, in a releasing pass: the slot
/// lent to `input` (zeroed; see `State::lent_grads`), or else a released buffer of exactly
/// `n` elements among the last few, zeroed over `zero`'s threads if `zero` is given (else
/// stale). Out of line: a plain backward pass reuses nothing and must not pay for it.
#[inline(never)]
fn reuse<'s, T: Float>(
    released: &mut Vec<&'s mut [T]>,
    lent: &[Lent<'s, T>],
    input: NodeId<'s>,
    n: usize,
    zero: Option<Par>,
) -> Option<&'s mut [T]> {
    if let Ok(k) = lent.binary_search_by_key(&input.raw(), |e| e.node.raw()) {
        if let Some(g) = lent[k].slot.take() {
            return Some(g);
        }
    }
    take_released(released, n, zero)
}

/// [`reuse`] with the stale elements zeroed over `par`'s threads, if the pass reuses.
#[inline]
fn take_spare<'s, T: Float>(
    spare: &mut Option<&mut Vec<&'s mut [T]>>,
    tape: &State<'s, T>,
    input: NodeId<'s>,
    n: usize,
    par: Par,
) -> Option<&'s mut [T]> {
    let spare = spare.as_deref_mut()?;
    reuse(spare, &tape.lent_grads, input, n, Some(par))
}

/// A zeroed slice of `n` elements in the arena, for a gradient.
#[inline(always)]
fn zeroed<T: Float>(arena: &Arena, n: usize, location: Loc) -> Result<&mut [T]> {
    arena.alloc_zeroed(n).map_err(|e| alloc_error(e, "backward", location))
}

/// A released buffer of exactly `n` elements among the last few, zeroed over `zero`'s
/// threads if it is given (else stale).
#[inline]
fn take_released<'s, T: Float>(released: &mut Vec<&'s mut [T]>, n: usize, zero: Option<Par>) -> Option<&'s mut [T]> {
    let from = released.len().saturating_sub(SPARE_LOOKUP);
    let k = (from..released.len()).rev().find(|&k| released[k].len() == n)?;
    let g = released.swap_remove(k);
    if let Some(par) = zero {
        crate::kernels::par::fill(par, g, T::ZERO);
    }
    Some(g)
}

impl<'a, 's, T: Float> BackwardCtx<'a, 's, T> {
    /// A zeroed gradient buffer of `n` elements: a released one (see `spare`) or the arena's.
    pub fn fresh_grad(&mut self, n: usize) -> Result<&'s mut [T]> {
        match self.spare.as_deref_mut().and_then(|s| take_released(s, n, Some(self.par))) {
            Some(g) => Ok(g),
            None => zeroed(self.arena, n, self.location),
        }
    }

    /// Whether `g` is a slot of `backward_into`'s buffer, lent to the pass.
    pub fn is_lent(&self, g: &[T]) -> bool {
        self.tape.lent.contains(&(g.as_ptr() as usize))
    }

    /// A zeroed buffer for node `id`'s first gradient, for an op that sets the gradient
    /// map itself (a checkpoint, a custom op): the slot lent to `id`, a released buffer or
    /// the arena's.
    pub fn first_grad(&mut self, id: NodeId<'s>) -> Result<&'s mut [T]> {
        let n = self.tape.node(id).shape.numel();
        match take_spare(&mut self.spare, self.tape, id, n, self.par) {
            Some(g) => Ok(g),
            None => zeroed(self.arena, n, self.location),
        }
    }

    /// Hands a scratch buffer from [`fresh_grad`](Self::fresh_grad) back, for a later
    /// buffer of the same size, when the walk reuses released gradients (else it stays
    /// in the arena until the scope ends).
    pub fn release(&mut self, scratch: &'s mut [T]) {
        if let Some(spare) = self.spare.as_deref_mut() {
            spare.push(scratch);
        }
    }

    #[inline]
    pub fn value(&self, id: NodeId<'s>) -> &'s [T] {
        self.tape.value(id)
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.tape.shape(id)
    }

    /// Whether node `id` gets a gradient.
    pub fn requires_grad(&self, id: NodeId<'s>) -> bool {
        self.tape.node(id).requires_grad
    }

    /// `n` zeroed elements of the arena for a rule's own use until the scope ends.
    pub fn scratch(&self, n: usize) -> Result<&'s mut [T]> {
        zeroed(self.arena, n, self.location)
    }

    /// Row `table` of the custom-op side table.
    pub fn custom_entry(&self, table: u32) -> CustomEntry<'s, T> {
        self.tape.custom[table as usize]
    }

    pub fn extra(&self, at: u32, len: usize) -> &'a [u32] {
        &self.tape.extra[at as usize..at as usize + len]
    }

    /// The `count` ids stored at `at`.
    pub fn stored_ids(&self, at: u32, count: u32) -> impl Iterator<Item = NodeId<'s>> + 'a {
        self.tape.stored_ids(at, count)
    }

    /// `∂L/∂out` and the (zero-initialised on first use) gradient buffer of `input`, or
    /// `None` if `input` requires no gradient. Always inlined: it runs once per op in the
    /// walk, and shape-`[1]` backward spends a tenth of its time here when it is a call.
    #[inline(always)]
    pub fn grad_pair(&mut self, out: NodeId<'s>, input: NodeId<'s>) -> Result<Option<(&[T], &mut [T])>> {
        let node = self.tape.node(input);
        if !node.requires_grad {
            return Ok(None);
        }
        // `out` comes after `input` on the tape, so its gradient never aliases input's.
        let (dout, slot) = self.grads.pair_mut(out, input);
        let dout = dout.as_deref().expect("backward visits only nodes whose gradient exists");
        if slot.is_none() {
            let n = node.shape.numel();
            let g = match take_spare(&mut self.spare, self.tape, input, n, self.par) {
                Some(g) => g,
                // Spelled out, not `zeroed(..)`: that form cost shape-`[1]` backward 5
                // instructions per op (callgrind, 2026-12-03).
                None => self.arena.alloc_zeroed(n).map_err(|e| alloc_error(e, "backward", self.location))?,
            };
            *slot = Some(g);
        }
        Ok(slot.as_deref_mut().map(|g| (dout, g)))
    }

    /// `∂L/∂out` and `input`'s empty gradient slot, for an elementwise rule that can build
    /// `input`'s first gradient in the pass that computes it; `None` if `input` wants no
    /// gradient or has one already, in a pass that reuses buffers, or where the rule would
    /// run on several threads (then [`grad_pair`](Self::grad_pair) zeroes a buffer and the
    /// rule adds into it). Building the buffer from the rule's values spares zeroing it
    /// first: on W3 `tanh` over 1,024 elements the fill was 2,300 of backward's 5,230
    /// instructions per op.
    pub fn first_grad_slot(&mut self, out: NodeId<'s>, input: NodeId<'s>) -> Option<(&[T], First<'_, 's, T>)> {
        let node = self.tape.node(input);
        if !node.requires_grad || self.spare.is_some() {
            return None;
        }
        if node.shape.numel() >= crate::kernels::par::MIN_PARALLEL && self.par.degree() > 1 {
            return None;
        }
        let (dout, slot) = self.grads.pair_mut(out, input);
        if slot.is_some() {
            return None;
        }
        let dout = dout.as_deref().expect("backward visits only nodes whose gradient exists");
        Some((dout, First { slot, arena: self.arena, location: self.location }))
    }

    /// As [`grad_pair`](Self::grad_pair), for an op that can write its contribution
    /// instead of adding it: the flag is `true` when this is `input`'s first gradient, and
    /// then the buffer's elements are unspecified (a released buffer is not zeroed), so the
    /// op must write every one of them. A product then runs with `Accum::Replace`, which
    /// spares faer reading the destination. (Not one body with `grad_pair`: sharing it
    /// cost shape-`[1]` backward 5 instructions per op.)
    pub fn grad_pair_write(&mut self, out: NodeId<'s>, input: NodeId<'s>) -> Result<Option<WritePair<'_, T>>> {
        let node = self.tape.node(input);
        if !node.requires_grad {
            return Ok(None);
        }
        let (dout, slot) = self.grads.pair_mut(out, input);
        let dout = dout.as_deref().expect("backward visits only nodes whose gradient exists");
        let first = slot.is_none();
        if first {
            let n = node.shape.numel();
            let g = match self.spare.as_deref_mut().and_then(|r| reuse(r, &self.tape.lent_grads, input, n, None)) {
                Some(g) => g,
                None => self.arena.alloc_stale(n).map_err(|e| alloc_error(e, "backward", self.location))?,
            };
            *slot = Some(g);
        }
        Ok(slot.as_deref_mut().map(|g| (dout, g, first)))
    }
}

/// What an op's recorded derivative sees (see `engine/grad.rs`): the scope's core, through
/// which it records the derivative with the ordinary op methods, and the side table of
/// gradient handles it adds its inputs' contributions to.
///
/// It holds no borrow of the tape: every read is a short borrow, so recording in between
/// never meets a live borrow. `scope` is the scope itself (`core` is its core), seen only
/// through [`Replay`], for the one derivative that runs user code on it: a checkpointed
/// block's recomputation.
pub(crate) struct GradCtx<'a, 's, T: Float> {
    pub(crate) scope: &'s (dyn Replay<'s, T> + 's),
    pub(crate) core: &'s Core<'s, T>,
    pub(crate) slots: &'a mut NodeMap<'s, Slot<'s>>,
}

impl<'s, T: Float> GradCtx<'_, 's, T> {
    /// A handle to node `id`.
    #[inline]
    pub fn var(&self, id: NodeId<'s>) -> Var<'s, T> {
        Var { core: self.core, id }
    }

    /// Whether input `id` gets a gradient from this walk.
    #[inline]
    pub fn wants(&self, id: NodeId<'s>) -> bool {
        self.slots[id].needed
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.core.tape.borrow().shape(id)
    }

    /// `count` ids stored at `at + k`: the `k`-th of them.
    pub fn stored_id(&self, at: u32, k: u32) -> NodeId<'s> {
        self.core.tape.borrow().stored_ids(at + k, 1).next().expect("the op stored its inputs")
    }

    /// A constant of `shape` (no gradient) whose elements `fill` computes from the tape
    /// (values, stored indices) into a zeroed slice: the masks, one-hot rows and routing
    /// tables of piecewise ops, whose second derivative is zero almost everywhere.
    #[track_caller]
    pub fn constant(&self, shape: Shape, fill: impl FnOnce(&Tape<'s, T>, &mut [T])) -> Var<'s, T> {
        self.core.constant("grad", shape, fill)
    }
}

/// The backward of the two ops the engine owns, custom ops and checkpoints, which run user
/// code and nested passes. [`ops::backward`](crate::ops::backward) takes an implementation
/// as a type parameter, so that its match stays one exhaustive match over every variant
/// (one jump table in the walk) while the rules never import the engine, which implements
/// it (`engine/backward.rs`).
pub(crate) trait EngineBackward<T: Float> {
    /// `Op::Custom { table, first, count }`'s backward.
    fn custom<'s>(ctx: &mut BackwardCtx<'_, 's, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<()>;
    /// `Op::Checkpoint { table, first, count }`'s backward.
    fn checkpoint<'s>(ctx: &mut BackwardCtx<'_, 's, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<()>;
}

/// The recorded derivatives of the ops the engine owns, as [`EngineBackward`] for
/// [`ops::grad`](crate::ops::grad) (implemented in `engine/grad.rs`).
pub(crate) trait EngineGrad<T: Float> {
    /// `Op::Custom`'s recorded derivative, `g` being the node's gradient.
    fn custom<'s>(ctx: &mut GradCtx<'_, 's, T>, out: NodeId<'s>, g: Var<'s, T>, op: (u32, u32, u32)) -> Result<()>;
    /// `Op::Checkpoint`'s recorded derivative.
    fn checkpoint<'s>(ctx: &mut GradCtx<'_, 's, T>, out: NodeId<'s>, g: Var<'s, T>, op: (u32, u32, u32)) -> Result<()>;
}

/// What a node's forward-mode rule sees: handles to the tape's nodes and their tangents at
/// the level being propagated (`ops::jvp`). The rule records the node's tangent with the
/// ordinary op methods; while it does, this level and the inner ones are suspended, so its
/// ops get tangents only at outer levels (the derivative of a tangent, for `jvp∘jvp`).
pub(crate) struct JvpCtx<'s, T: Float> {
    pub(crate) core: &'s Core<'s, T>,
    /// The scope, for the one rule that runs user code on it: a checkpointed block's.
    pub(crate) scope: &'s (dyn Replay<'s, T> + 's),
    pub(crate) level: usize,
}

impl<'s, T: Float> JvpCtx<'s, T> {
    /// A handle to node `id`.
    #[inline]
    pub fn var(&self, id: NodeId<'s>) -> Var<'s, T> {
        Var { core: self.core, id }
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.core.tape.borrow().shape(id)
    }

    /// The tangent of node `id` at this level, if it has one (`None`: zero).
    pub fn tangent(&self, id: NodeId<'s>) -> Option<Var<'s, T>> {
        self.core.tape.borrow().tangents.get(self.level, id).map(|id| self.var(id))
    }

    /// The tangent of node `id`, or zeros of its shape.
    #[track_caller]
    pub fn tangent_or_zeros(&self, id: NodeId<'s>) -> Var<'s, T> {
        match self.tangent(id) {
            Some(t) => t,
            None => self.constant(self.shape(id), |_, _| {}),
        }
    }

    /// `count` ids stored at `at + k`: the `k`-th of them.
    pub fn stored_id(&self, at: u32, k: u32) -> NodeId<'s> {
        self.core.tape.borrow().stored_ids(at + k, 1).next().expect("the op stored its inputs")
    }

    /// A constant of `shape` computed from the tape, as [`GradCtx::constant`].
    #[track_caller]
    pub fn constant(&self, shape: Shape, fill: impl FnOnce(&Tape<'s, T>, &mut [T])) -> Var<'s, T> {
        self.core.constant("jvp", shape, fill)
    }

    /// `t` broadcast to the shape of node `out`, if it is smaller (a bias's tangent).
    #[track_caller]
    pub fn fit(&self, out: NodeId<'s>, t: Var<'s, T>) -> Var<'s, T> {
        let so = self.shape(out);
        if t.shape() == so {
            t
        } else {
            t.broadcast_to(&so.to_array()[..so.rank()])
        }
    }
}

/// The sum of two tangents, either of which may be zero (`None`).
#[track_caller]
pub(crate) fn plus<'s, T: Float>(a: Option<Var<'s, T>>, b: Option<Var<'s, T>>) -> Option<Var<'s, T>> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, None) => a,
        (None, b) => b,
    }
}

/// The forward rules of the ops the engine owns, as [`EngineBackward`] for
/// [`ops::jvp`](crate::ops::jvp) (implemented in `engine/jvp.rs`): each returns the node's
/// tangent, or `None` if it is zero.
pub(crate) trait EngineJvp<T: Float> {
    /// `Op::Custom`'s tangent.
    fn custom<'s>(ctx: &JvpCtx<'s, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<Option<Var<'s, T>>>;
    /// `Op::Checkpoint`'s tangent.
    fn checkpoint<'s>(ctx: &JvpCtx<'s, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<Option<Var<'s, T>>>;
}
