//! Differentiable gradients: [`Scope::grad`] and [`Scope::vjp`], PyTorch's
//! `torch.autograd.grad(..., create_graph=True)`.
//!
//! The walk is the backward pass's reverse loop, but each node's derivative is *recorded*
//! with the ordinary op methods (`ops::grad`, one function beside each op's fast
//! backward; custom ops and checkpoints are dispatched here) instead of computed into buffers. The gradients are therefore nodes on
//! the same tape, after everything they depend on, so they can be combined with other ops
//! and differentiated again, to any order, and the scope still frees them in O(1).
//!
//! The tape's `RefCell` is never held across a recording: the walk copies each node's
//! `Op` (16 bytes, `Copy`) out under a short borrow, then records its derivative. Nodes
//! appended meanwhile come after `y`, so the reverse loop over `0..=y` never visits them.
//! Gradient handles accumulate per node in a side table kept by the tape between calls and
//! scopes (`State::slots`), so a warmed-up call allocates nothing on the heap.

use std::panic::Location;

use crate::dtype::Float;
use crate::engine::checkpoint::replay as checkpoint;
use crate::engine::custom;
use crate::error::{Error, Loc, Result};
use crate::ops;
use crate::record::ctx::{EngineGrad, GradCtx};
use crate::record::handles::{Scope, Slot, Var};
use crate::shape::Shape;
use crate::tape::id::{NodeId, NodeMap};
use crate::tape::op::Op;

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// The gradients `∂y/∂xᵢ` of a one-element `y`, as handles recorded on this tape, so
    /// that they can be used in further ops and differentiated again (PyTorch's
    /// `torch.autograd.grad(y, xs, create_graph=True)`).
    ///
    /// - It does not consume the tape: [`backward`](Scope::backward) and further `grad`
    ///   calls still work, and gradients read with [`Var::grad`] are not touched.
    /// - Gradients flow through nodes that require one ([`leaf`](Scope::leaf),
    ///   [`param`](Scope::param), [`Var::with_grad`] and what is computed from them outside
    ///   [`no_grad`](Scope::no_grad)). An input that `y` does not reach, or that requires
    ///   no gradient, gets a zero handle of its shape (a constant): its own gradient is 0.
    /// - An input listed twice gets its gradient twice; inputs may depend on one another
    ///   (each gets the total derivative, through every path).
    /// - Piecewise ops (`relu`, `abs`, `clamp`, `maximum`, `max_axes`, `max_pool2d`, ...)
    ///   have second derivative 0 almost everywhere, as in PyTorch.
    /// - Called inside [`no_grad`](Scope::no_grad), the gradients are recorded as values
    ///   that require no gradient (PyTorch's `create_graph=False`).
    /// - The gradients may also be differentiated by the fast [`backward`](Scope::backward)
    ///   or [`backward_into`](Scope::backward_into) (a gradient penalty, a PINN residual, a
    ///   meta-learning step), or a Hessian-vector product taken as
    ///   `backward_into(Σ ⟨∂y/∂p, v⟩, buffer)`.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::from_vec(vec![2.0f64], &[1])?;
    /// let mut g = tapir::Graph::<f64>::new();
    /// let (d1, d2, d3) = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     let y = x.powf(4.0).sum(); // y = x⁴
    ///     let [d1] = s.grad(y, [x])?; // 4x³
    ///     let [d2] = s.grad(d1.sum(), [x])?; // 12x²
    ///     let [d3] = s.grad(d2.sum(), [x])?; // 24x
    ///     Ok::<_, tapir::Error>((d1.item()?, d2.item()?, d3.item()?))
    /// })?;
    /// assert_eq!((d1, d2, d3), (32.0, 48.0, 48.0));
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// The scope's first recording error; [`Error::NotScalar`] if `y` has more than one
    /// element; [`Error::BackwardTwice`] after a consuming `backward`;
    /// [`Error::SecondOrderUnsupported`] through a custom op without a recorded
    /// derivative; [`Error::ArenaLimit`] if the gradient nodes do not fit.
    #[track_caller]
    pub fn grad<const N: usize>(&'s self, y: Var<'s, T>, xs: [Var<'s, T>; N]) -> Result<[Var<'s, T>; N]> {
        let mut out = [self.core.poison(); N];
        self.walk("grad", y, None, &xs, &mut out, Location::caller())?;
        Ok(out)
    }

    /// [`grad`](Scope::grad) for a list of inputs of any length: the gradients go to
    /// `out` (as long as `xs`), so that no list is allocated per call.
    ///
    /// # Errors
    /// As for `grad`; [`Error::InvalidArgument`] if `out` and `xs` differ in length.
    #[track_caller]
    pub fn grad_into(&'s self, y: Var<'s, T>, xs: &[Var<'s, T>], out: &mut [Var<'s, T>]) -> Result<()> {
        self.walk("grad_into", y, None, xs, out, Location::caller())
    }

    /// A vector-Jacobian product with a recorded result: `vᵀ ∂y/∂xᵢ` for `y` of any shape
    /// and a handle `v` of `y`'s shape, as a differentiable handle per input (PyTorch's
    /// `torch.autograd.grad(y, xs, grad_outputs=v, create_graph=True)`). `v` may itself
    /// depend on the inputs, or be a leaf the caller differentiates with respect to later
    /// (the double-vjp trick for forward mode: see [`func::jvp`](crate::func::jvp)).
    /// Semantics as for [`grad`](Scope::grad).
    ///
    /// # Errors
    /// As for `grad`, with [`Error::ShapeMismatch`] instead of `NotScalar` if `v`'s shape
    /// is not `y`'s.
    #[track_caller]
    pub fn vjp<const N: usize>(&'s self, y: Var<'s, T>, v: Var<'s, T>, xs: [Var<'s, T>; N]) -> Result<[Var<'s, T>; N]> {
        let mut out = [self.core.poison(); N];
        self.walk("vjp", y, Some(v), &xs, &mut out, Location::caller())?;
        Ok(out)
    }

    /// [`vjp`](Scope::vjp) into a caller-provided slice (as [`grad_into`](Scope::grad_into)).
    ///
    /// # Errors
    /// As for `vjp` and `grad_into`.
    #[track_caller]
    pub fn vjp_into(&'s self, y: Var<'s, T>, v: Var<'s, T>, xs: &[Var<'s, T>], out: &mut [Var<'s, T>]) -> Result<()> {
        self.walk("vjp_into", y, Some(v), xs, out, Location::caller())
    }

    /// Checks the arguments, then runs the recording walk with the side table out of the
    /// tape, and puts it back whether or not the walk failed.
    #[track_caller]
    fn walk(
        &'s self,
        op: &'static str,
        y: Var<'s, T>,
        seed: Option<Var<'s, T>>,
        xs: &[Var<'s, T>],
        out: &mut [Var<'s, T>],
        location: Loc,
    ) -> Result<()> {
        let core = &self.core;
        {
            let tape = core.tape.borrow();
            if let Some(e) = &tape.error {
                return Err(e.clone());
            }
            if tape.consumed {
                return Err(Error::BackwardTwice { location });
            }
            if out.len() != xs.len() {
                return Err(Error::InvalidArgument {
                    op,
                    detail: format!("{} inputs but room for {} gradients", xs.len(), out.len()),
                    location,
                });
            }
            let sy = tape.shape(y.id);
            match seed {
                None if sy.numel() != 1 => return Err(Error::NotScalar { op, shape: sy, location }),
                Some(v) if tape.shape(v.id) != sy => {
                    return Err(Error::ShapeMismatch { op, lhs: sy, rhs: tape.shape(v.id), location })
                }
                _ => {}
            }
        }
        let _name = core.composite(op);
        let mut slots = std::mem::take(&mut core.tape.borrow_mut().slots);
        let result = self.walk_with(&mut slots, y, seed, xs, out);
        core.tape.borrow_mut().slots = slots;
        result?;
        // A derivative that failed to record (the arena limit) poisoned the scope.
        match &core.tape.borrow().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    #[track_caller]
    fn walk_with(
        &'s self,
        slots: &mut NodeMap<'s, Slot<'s>>,
        y: Var<'s, T>,
        seed: Option<Var<'s, T>>,
        xs: &[Var<'s, T>],
        out: &mut [Var<'s, T>],
    ) -> Result<()> {
        let core = &self.core;
        let last = y.id;
        slots.resize_with(0, Slot::default);
        slots.resize_with(last.index() + 1, Slot::default);
        for x in xs.iter().filter(|x| x.id.index() <= last.index()) {
            slots[x.id].needed = true;
        }
        // Forward pass: a node is on a path from some input to `y` if it requires a
        // gradient and is an input or reads one that is.
        let mut ctx = GradCtx { scope: self, core, slots };
        ctx.mark(core.tape.borrow().ids_through(last));
        if ctx.slots[last].needed {
            let seed = match seed {
                Some(v) => v,
                None => self.filled(y.shape(), T::ONE),
            };
            ctx.slots[last].grad = Some(seed.id);
            // Collected first: the walk must not hold the tape's borrow.
            let ids = core.tape.borrow().ids_through(last);
            ctx.walk_back(ids)?;
        }
        let slots = ctx.slots;
        for (o, x) in out.iter_mut().zip(xs) {
            let slot = slots.get(x.id).copied().filter(|s| s.needed).unwrap_or_default();
            *o = match slot.grad {
                // A sum's derivative kept small (`GradCtx::add_broadcast`) is handed out
                // at the input's shape.
                Some(id) if slot.bcast => Var { core, id }.broadcast_to(&x.shape().to_array()[..x.shape().rank()]),
                Some(id) => Var { core, id },
                None => self.filled(x.shape(), T::ZERO),
            };
        }
        Ok(())
    }

    /// A constant of `shape` filled with `v`.
    #[track_caller]
    fn filled(&'s self, shape: Shape, v: T) -> Var<'s, T> {
        self.core.record_as("grad", |r| {
            let out = r.alloc(shape.numel())?;
            out.fill(v);
            Ok((Op::Leaf, shape, &*out))
        })
    }
}

impl<'s, T: Float> GradCtx<'_, 's, T> {
    /// Marks the nodes of `ids` (in tape order) that the walk differentiates through:
    /// those that require a gradient and are marked already (the inputs asked for) or read
    /// a marked node.
    pub(crate) fn mark(&mut self, ids: impl Iterator<Item = NodeId<'s>>) {
        let tape = self.core.tape.borrow();
        for id in ids {
            let node = &tape.nodes[id.index()];
            if !node.requires_grad {
                self.slots[id].needed = false;
                continue;
            }
            if !self.slots[id].needed {
                let mut any = false;
                tape.for_each_input(&node.op, |i| any |= self.slots[i].needed);
                self.slots[id].needed = any;
            }
        }
    }

    /// The reverse walk over `ids` (given in tape order): each marked node with a gradient
    /// records its derivative, adding its inputs' contributions to their slots. Stops at
    /// the first recording error, which the scope keeps.
    #[track_caller]
    pub(crate) fn walk_back(&mut self, ids: impl DoubleEndedIterator<Item = NodeId<'s>>) -> Result<()> {
        for id in ids.rev() {
            let (op, slot) = (self.core.tape.borrow().nodes[id.index()].op, self.slots[id]);
            let Some(g) = slot.grad.filter(|_| slot.needed) else { continue };
            if matches!(op, Op::Leaf | Op::Variable | Op::Param(_)) {
                // No inputs: nothing to record (and a pending broadcast stays small).
                continue;
            }
            let g = Var { core: self.core, id: g };
            let g = if slot.bcast { self.expand(op, id, g) } else { g };
            ops::grad::<T, RecordedWalk>(op, self, id, g)?;
            if self.core.tape.borrow().error.is_some() {
                return Ok(());
            }
        }
        Ok(())
    }
}

/// The recorded walk's answers for the ops the engine owns (see [`EngineGrad`]).
struct RecordedWalk;

impl<T: Float> EngineGrad<T> for RecordedWalk {
    #[track_caller]
    fn custom<'s>(
        ctx: &mut GradCtx<'_, 's, T>,
        out: NodeId<'s>,
        g: Var<'s, T>,
        (table, first, count): (u32, u32, u32),
    ) -> Result<()> {
        custom::grad(ctx, out, g, table, first, count)
    }

    /// The block runs again on this tape; the walk goes on through what it recorded,
    /// seeded with `g` at the recomputed output.
    #[track_caller]
    fn checkpoint<'s>(ctx: &mut GradCtx<'_, 's, T>, out: NodeId<'s>, g: Var<'s, T>, op: (u32, u32, u32)) -> Result<()> {
        let Some((before, last)) = checkpoint::recompute(ctx.scope, ctx.core, out, op)? else { return Ok(()) };
        ctx.slots.resize_with(last.index() + 1, Default::default);
        ctx.mark(ctx.core.tape.borrow().ids_after(before, last));
        if ctx.slots[last].needed {
            ctx.slots[last].grad = Some(g.id);
            let ids = ctx.core.tape.borrow().ids_after(before, last);
            ctx.walk_back(ids)?;
        }
        Ok(())
    }
}
