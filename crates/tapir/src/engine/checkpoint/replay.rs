//! A checkpointed block run again: for backward, on a nested scope whose own backward pass
//! the engine hands in ([`NestedPass`]); for the recorded derivative, on the scope itself.

use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::dtype::Float;
use crate::engine::custom::panic_message;
use crate::engine::nest::{nested, with_slice, CollectSmall, Small};
use crate::error::{Error, Loc, Result};
use crate::kernels;
use crate::record::core::take_held;
use crate::record::ctx::BackwardCtx;
use crate::record::handles::{Checkpoint, Core, Replay, Scope, Var};
use crate::record::state::{NestedPass, Seed};
use crate::tape::id::NodeId;
use crate::tape::op::Op;

pub(super) fn nondeterministic(detail: String, location: Loc) -> Error {
    Error::InvalidArgument {
        op: "checkpoint",
        detail: format!("{detail}; a checkpointed block must record the same ops when recomputed"),
        location,
    }
}

/// Recomputes the block from its inputs on a nested scope, runs backward over it seeded
/// with `∂L/∂out` (`run`, the engine's nested pass), and adds the nested leaves' and parameters' gradients into those of
/// the checkpoint's inputs.
#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    (table, first, count): (u32, u32, u32),
    run: NestedPass<T>,
) -> Result<()> {
    let entry = ctx.tape.checkpoints[table as usize];
    let nest = ctx.tape.nest.expect("checkpoint nodes are recorded only on scopes that have a scratch arena");
    let dout = ctx.grads[out].take().expect("backward visits only nodes whose gradient exists");
    let tape = ctx.tape;
    let leaves = tape.stored_ids(first, entry.inputs).map(|id| {
        let n = tape.node(id);
        (n.requires_grad, n.shape, n.value)
    });
    let result = nested(nest, leaves, |inner, vars| {
        replay(inner, tape.step, entry.draws);
        let (at, n) = entry.in_place;
        inner.core.tape.borrow_mut().in_place.at.extend_from_slice(&tape.extra[at as usize..(at + n) as usize]);
        let y = run_block(entry.block, inner, vars, entry.part, entry.location)?;
        take_held(&mut inner.core.tape.borrow_mut(), None);
        let mut itape = inner.core.tape.borrow_mut();
        if let Some(e) = &itape.error {
            return Err(e.clone());
        }
        let (shape, expected) = (itape.shape(y.id), tape.shape(out));
        if shape != expected {
            return Err(nondeterministic(
                format!("the block's output has shape {shape} on recomputation but {expected} when recorded"),
                entry.location,
            ));
        }
        let params = || tape.stored_ids(first + entry.inputs, count - entry.inputs);
        let mut inner_params = itape.nodes.iter().filter_map(|n| match n.op {
            Op::Param(at) => Some(at),
            _ => None,
        });
        for outer in params() {
            let same = match (inner_params.next(), tape.node(outer).op) {
                (Some(a), Op::Param(b)) => {
                    itape.extra[a as usize..a as usize + 3] == tape.extra[b as usize..b as usize + 3]
                }
                _ => false,
            };
            if !same {
                return Err(nondeterministic(
                    "the block read other parameters on recomputation".into(),
                    entry.location,
                ));
            }
        }
        if inner_params.next().is_some() {
            return Err(nondeterministic("the block read more parameters on recomputation".into(), entry.location));
        }
        if !itape.node(y.id).requires_grad {
            return Ok(());
        }
        // Releasing, as `backward_into`: of the block's gradients only its leaves' (the
        // inputs and parameters, read below) are needed, so each other buffer is reused.
        let (arena, seed) = (inner.core.arena, (y.id, Seed::Given(dout)));
        run(&mut itape, arena, nest.par, seed, entry.location, nest.anomaly)?;
        let param_ids = itape.ids().filter(|&id| matches!(itape.node(id).op, Op::Param(_)));
        let pairs = vars.iter().map(|v| v.id).zip(tape.stored_ids(first, entry.inputs)).chain(param_ids.zip(params()));
        for (inner_id, outer_id) in pairs {
            if let (Some(Some(g)), true) = (itape.grads.get(inner_id), tape.node(outer_id).requires_grad) {
                add_grad(ctx, outer_id, g)?;
            }
        }
        Ok(())
    });
    ctx.grads[out] = Some(dout);
    result
}

/// Recorded derivative ([`Scope::grad`]): the block runs
/// again, this time on the scope itself, from the checkpoint's own input nodes, so its ops
/// are recorded on this tape (in the main arena) like any others; then the walk goes on
/// through them (the walk's part: this returns the span of recomputed nodes, after the
/// last node before them), seeded with `∂y/∂out` at the recomputed output, and their derivatives reach
/// the checkpoint's inputs. Everything recorded is differentiable again, to any order.
///
/// During the recomputation the block's random draws replay from where its forward began
/// them, gradient recording is on even under `no_grad` (the walk needs the block's
/// graph; `no_grad` still applies to the derivative ops recorded afterwards), and the
/// block's parameter reads return the checkpoint's own parameter nodes in order instead
/// of new ones (see [`replayed_param`]), so that a later `grad` or `backward_into` with
/// respect to those parameters sees every path through them.
///
/// The recomputed values stay in the main arena until the scope ends: a second
/// derivative keeps the block's graph, as PyTorch's `create_graph=True` does.
///
/// A checkpoint's tangent (forward mode, `engine/jvp.rs`) is recorded the same way: the
/// block runs again on the scope with the level propagating, from inputs that carry
/// their tangents, and the tangent of the recomputed output is the checkpoint's.
#[track_caller]
pub(crate) fn recompute<'s, T: Float>(
    scope: &'s (dyn Replay<'s, T> + 's),
    core: &'s Core<'s, T>,
    out: NodeId<'s>,
    (table, first, count): (u32, u32, u32),
) -> Result<Option<(NodeId<'s>, NodeId<'s>)>> {
    let (entry, before) = {
        let tape = core.tape.borrow();
        (tape.checkpoints[table as usize], tape.ids().next_back().expect("the checkpoint node is on the tape"))
    };
    let ids: Small<NodeId<'s>> = core.tape.borrow().stored_ids(first, entry.inputs).collect_small();
    let saved = {
        let mut tape = core.tape.borrow_mut();
        let saved = (tape.draws, tape.no_grad);
        tape.draws = entry.draws;
        tape.no_grad = 0;
        tape.replay = Some((first + entry.inputs, first + count));
        saved
    };
    let y = with_slice(core.poison(), ids.iter().map(|&id| Var { core, id }), |inputs| {
        scope.replay(table, inputs, entry.part)
    });
    let replay = {
        let mut tape = core.tape.borrow_mut();
        (tape.draws, tape.no_grad) = saved;
        tape.replay.take()
    };
    let y = y?;
    if core.tape.borrow().error.is_some() {
        return Ok(None);
    }
    if let Some((next, end)) = replay.filter(|(next, end)| next != end) {
        let read = next - (first + entry.inputs);
        return Err(nondeterministic(
            format!("the block read {read} of its {} parameters on recomputation", end - (first + entry.inputs)),
            entry.location,
        ));
    }
    let (shape, expected) = (y.shape(), core.tape.borrow().shape(out));
    if shape != expected {
        return Err(nondeterministic(
            format!("the block's output has shape {shape} on recomputation but {expected} when recorded"),
            entry.location,
        ));
    }
    // The walk goes on over the recomputed nodes: they come after everything the main
    // walk visits, and read the checkpoint's inputs, which it visits later.
    Ok(Some((before, y.id)))
}

impl<'s, 'g: 's, T: Float> Replay<'s, T> for Scope<'s, 'g, T> {
    fn replay(&'s self, table: u32, inputs: &[Var<'s, T>], part: u32) -> Result<Var<'s, T>> {
        // Copied out, so the list is not borrowed while the block runs (it may record a
        // checkpoint of its own, which pushes to it).
        let block = self.blocks.borrow()[table as usize];
        let location = self.core.tape.borrow().checkpoints[table as usize].location;
        run_block(block, self, inputs, part, location)
    }
}

/// Runs a block's forward, user code: a panic in it becomes the [`Error::Callback`] that
/// names the block and where its checkpoint was recorded (as a custom op's callbacks do).
/// What the block recorded before it panicked stays on the tape, unread.
pub(crate) fn run_block<'c, 'e, T: Float>(
    block: &'e (dyn Checkpoint<T> + 'e),
    s: &'c Scope<'c, 'e, T>,
    inputs: &[Var<'c, T>],
    part: u32,
    location: Loc,
) -> Result<Var<'c, T>> {
    catch_unwind(AssertUnwindSafe(|| block.forward(s, inputs, part))).map_err(|payload| Error::Callback {
        op: "checkpoint",
        callback: format!("the checkpointed block (part {part})"),
        detail: panic_message(&*payload),
        location,
    })
}

/// While a checkpointed block is recomputed for its recorded derivative (the tape's
/// `replay` is set), a parameter read takes the checkpoint's next parameter node instead
/// of recording a new one: `Some` of that node if it is the parameter `payload` names,
/// `Some` of a poisoned handle (the scope's error) if it is not, `None` outside a
/// recomputation.
///
/// The checkpoint's parameter nodes were recorded with an empty value (nothing read them
/// until now); `value`, the parameter's data when the read comes from
/// [`Scope::param`], becomes the node's value, so the recomputed ops can read it. A read
/// by a checkpoint nested in the block passes `None`: that checkpoint only lists the node,
/// and its own recomputation reads the value through `Scope::param` in turn.
#[track_caller]
pub(crate) fn replayed_param<'s, T: Float>(
    core: &'s Core<'s, T>,
    payload: [u32; 3],
    value: Option<&'s [T]>,
    location: Loc,
) -> Option<Var<'s, T>> {
    let mut tape = core.tape.borrow_mut();
    let (next, end) = tape.replay?;
    let id = (next < end).then(|| tape.stored_ids(next, 1).next()).flatten();
    let same =
        id.map(|id| matches!(tape.node(id).op, Op::Param(at) if tape.extra[at as usize..at as usize + 3] == payload));
    match id {
        Some(id) if same == Some(true) => {
            tape.replay = Some((next + 1, end));
            if let Some(value) = value {
                tape.nodes[id.index()].value = value;
            }
            Some(Var { core, id })
        }
        _ => {
            drop(tape);
            Some(core.fail(nondeterministic("the block read other parameters on recomputation".into(), location)))
        }
    }
}

/// Starts the nested scope's random draws where the block's forward started them.
pub(super) fn replay<T: Float>(inner: &Scope<'_, '_, T>, step: u64, draws: u64) {
    let mut tape = inner.core.tape.borrow_mut();
    tape.step = step;
    tape.draws = draws;
}

/// `grad[id] += g`, allocating the gradient (zeroed) on first use.
fn add_grad<'s, T: Float>(ctx: &mut BackwardCtx<'_, 's, T>, id: NodeId<'s>, g: &[T]) -> Result<()> {
    match &mut ctx.grads[id] {
        Some(slot) => kernels::add_assign(slot, g),
        None => {
            let fresh = ctx.first_grad(id)?;
            fresh.copy_from_slice(g);
            ctx.grads[id] = Some(fresh);
        }
    }
    Ok(())
}
