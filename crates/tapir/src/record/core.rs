//! [`Core`]: the part of a scope that handles point at, and the one place ops are recorded.

use std::cell::{Cell, RefCell};
use std::panic::Location;

use faer::Par;

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::record::ctx::Rec;
use crate::record::handles::{Core, State, Var};
use crate::shape::Shape;
use crate::storage::Arena;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};
use crate::tape::profile::Profiler;
use crate::tape::tape::NodeView;

/// Restores the composite name on drop (see [`Core::composite`]).
pub(crate) struct CompositeGuard<'a> {
    cell: &'a Cell<Option<&'static str>>,
    previous: Option<&'static str>,
}

impl Drop for CompositeGuard<'_> {
    fn drop(&mut self) {
        self.cell.set(self.previous);
    }
}

impl<'s, T: Float> Core<'s, T> {
    /// A scope's core over `tape`, profiled if `profile` is given.
    pub(crate) fn new(
        arena: &'s Arena,
        mut tape: State<'s, T>,
        par: Par,
        anomaly: bool,
        profile: Option<&'s Profiler>,
    ) -> Core<'s, T> {
        tape.profile = profile;
        // Profiling takes the record path's slow branch, where the timer starts.
        tape.slow = profile.is_some();
        let checks = anomaly || profile.is_some();
        Core { arena, tape: RefCell::new(tape), par, anomaly, checks, composite: Cell::new(None) }
    }

    pub(crate) fn poison(&'s self) -> Var<'s, T> {
        Var { core: self, id: NodeId::POISON }
    }

    /// Names the public method `name` for every error raised until the guard drops, unless
    /// an enclosing method already named itself (the caller called that one). Composite
    /// methods call their primitives directly, not through closures, so `#[track_caller]`
    /// still carries the caller's line down to them.
    pub(crate) fn composite(&self, name: &'static str) -> CompositeGuard<'_> {
        let previous = self.composite.get();
        if previous.is_none() {
            self.composite.set(Some(name));
        }
        CompositeGuard { cell: &self.composite, previous }
    }

    /// The name errors report now: the enclosing composite's, else `op`.
    #[inline]
    pub(crate) fn op_name(&self, op: &'static str) -> &'static str {
        self.composite.get().unwrap_or(op)
    }

    /// Records one primitive op of kind `kind` (see [`record_as`](Core::record_as)).
    /// Always inlined, so that the kind (and an elementwise op's function) is a constant
    /// at each op's call site: the name folds away and the function's `match` with it.
    #[track_caller]
    #[inline(always)]
    pub(crate) fn record(
        &'s self,
        kind: OpKind,
        f: impl FnOnce(&mut Rec<'_, 's, T>) -> Result<(Op<'s, T>, Shape, &'s [T])>,
    ) -> Var<'s, T> {
        self.record_as(kind.name(), f)
    }

    /// Records one node: `f` checks the arguments, computes the value in the arena and
    /// returns the node's op, shape and value. Errors name `op` (or the enclosing
    /// composite) and poison the scope. Leaf-making methods (`tensor`, `full`, `gt`, ...)
    /// call this with their own name; primitives go through [`record`](Core::record).
    #[track_caller]
    #[inline(always)]
    pub(crate) fn record_as(
        &'s self,
        op: &'static str,
        f: impl FnOnce(&mut Rec<'_, 's, T>) -> Result<(Op<'s, T>, Shape, &'s [T])>,
    ) -> Var<'s, T> {
        self.record_at(op, Location::caller(), f)
    }

    /// [`record_as`](Core::record_as) with the caller's location given, for recording
    /// from inside a closure (which `#[track_caller]` does not pass through).
    #[inline(always)]
    pub(crate) fn record_at(
        &'s self,
        op: &'static str,
        location: Loc,
        f: impl FnOnce(&mut Rec<'_, 's, T>) -> Result<(Op<'s, T>, Shape, &'s [T])>,
    ) -> Var<'s, T> {
        self.record_reading(op, location, None, |r, _| f(r))
    }

    /// [`record_at`](Core::record_at) for an op that can overwrite its input `x` in
    /// place: `f` is also handed `x`'s output buffer if a checkpoint's recomputation held
    /// it back for this op (see [`InPlace`](crate::tape::in_place::InPlace)); then `f` must
    /// make it `x`'s value again.
    #[inline(always)]
    pub(crate) fn record_reading(
        &'s self,
        op: &'static str,
        location: Loc,
        x: Option<NodeId<'s>>,
        f: impl FnOnce(&mut Rec<'_, 's, T>, Option<&'s mut [T]>) -> Result<(Op<'s, T>, Shape, &'s [T])>,
    ) -> Var<'s, T> {
        let mut tape = self.tape.borrow_mut();
        // One test on the hot path for the three rare cases.
        let (held, timer) = if tape.slow {
            if tape.error.is_some() {
                return self.poison();
            }
            let held = take_held(&mut tape, x);
            (held, tape.profile.map(|p| (p, p.start())))
        } else {
            (None, None)
        };
        let op = self.op_name(op);
        let result = f(&mut Rec { tape: &mut tape, arena: self.arena, op, location }, held);
        let pushed = result.and_then(
            #[inline(always)]
            |(kind, shape, value)| {
                // Gradient-requesting leaves ask for one themselves (even under `no_grad`, as
                // the caller said so explicitly); every other node inherits it from its inputs.
                let mut requires_grad = matches!(kind, Op::Variable | Op::Param(_));
                if tape.no_grad == 0 {
                    tape.for_each_input(&kind, |i| requires_grad |= tape.node(i).requires_grad);
                }
                if self.checks {
                    if self.anomaly {
                        if !value.iter().all(|v| v.is_finite()) {
                            return Err(Error::NonFinite { op, phase: "forward", shape, location });
                        }
                        tape.locs.push(location);
                    }
                    if let Some((p, t)) = timer {
                        p.stop(kind.kind(), false, t);
                    }
                }
                tape.push(NodeView { value, op: kind, shape, requires_grad }, op, location)
            },
        );
        match pushed {
            Ok(id) => {
                // Open forward-mode levels keep `slow` set; the test is then out of line.
                if tape.slow {
                    drop(tape);
                    self.propagate(id);
                }
                Var { core: self, id }
            }
            Err(e) => {
                tape.error = Some(e);
                tape.slow = true;
                self.poison()
            }
        }
    }

    /// Records the tangents of node `id`, just recorded, at the open forward-mode levels
    /// (the hook `engine::jvp::propagate`, handed in when the first level opened), if a
    /// level propagates and `no_grad` is off.
    #[cold]
    #[inline(never)]
    fn propagate(&'s self, id: NodeId<'s>) {
        let hook = {
            let tape = self.tape.borrow();
            (tape.tangents.active() && tape.no_grad == 0).then_some(tape.tangents.hook).flatten()
        };
        if let Some((propagate, scope)) = hook {
            propagate(self, scope, id);
        }
    }

    /// A constant of `shape` (no gradient, no tangent) whose elements `fill` computes from
    /// the tape (values, stored indices) into a zeroed slice: the masks, one-hot rows and
    /// routing tables of piecewise ops' derivatives, recorded under the name `op`.
    #[track_caller]
    pub(crate) fn constant(
        &'s self,
        op: &'static str,
        shape: Shape,
        fill: impl FnOnce(&crate::tape::tape::Tape<'s, T>, &mut [T]),
    ) -> Var<'s, T> {
        self.record_as(op, |r| {
            let out = r.alloc(shape.numel())?;
            fill(r.tape, out);
            Ok((Op::Leaf, shape, &*out))
        })
    }

    /// Records a leaf whose value is already in place.
    #[track_caller]
    pub(crate) fn leaf(&'s self, kind: Op<'s, T>, shape: Shape, value: &'s [T]) -> Var<'s, T> {
        self.record(kind.kind(), |_| Ok((kind, shape, value)))
    }

    /// Appends `id` to the tape's payload list (charged to the arena like every payload),
    /// for a composite that builds an input list one node at a time; failures poison the
    /// scope under `op` (or the enclosing composite).
    pub(crate) fn store_id(&'s self, id: NodeId<'s>, op: &'static str, location: Loc) {
        let mut tape = self.tape.borrow_mut();
        if tape.error.is_some() {
            return;
        }
        let op = self.op_name(op);
        let stored = Rec { tape: &mut tape, arena: self.arena, op, location }.store_ids([id]);
        if let Err(e) = stored {
            tape.error = Some(e);
            tape.slow = true;
        }
    }

    /// Records the error `e` unless the scope already holds one, and returns a poisoned handle.
    pub(crate) fn fail(&'s self, e: Error) -> Var<'s, T> {
        let mut tape = self.tape.borrow_mut();
        if tape.error.is_none() {
            tape.error = Some(e);
            tape.slow = true;
        }
        self.poison()
    }

    /// [`fail`](Core::fail) with an error built for the name errors report now.
    pub(crate) fn fail_as(&'s self, op: &'static str, e: impl FnOnce(&'static str) -> Error) -> Var<'s, T> {
        self.fail(e(self.op_name(op)))
    }
}

/// The buffer held back for an in-place op if `x` is its producer; else the buffer
/// becomes its producer's value again (the op reads it) and in-place work ends for the
/// block (see [`InPlace`](crate::tape::in_place::InPlace)).
#[cold]
#[inline(never)]
pub(crate) fn take_held<'s, T>(tape: &mut State<'s, T>, x: Option<NodeId<'s>>) -> Option<&'s mut [T]> {
    let taken = x.and_then(|x| tape.in_place.take(x.raw()));
    if taken.is_none() {
        if let Some((pos, buf)) = tape.in_place.give_back() {
            tape.nodes[pos as usize].value = buf;
        }
    }
    tape.slow = tape.error.is_some() || tape.profile.is_some() || !tape.tangents.levels.is_empty();
    taken
}
