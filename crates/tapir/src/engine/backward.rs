//! The backward pass: one reverse loop over the tape. Each node's own rule (`ops::backward`,
//! which hands custom ops and checkpoints back to [`Walk`]) adds its contribution to its
//! inputs' gradients.
//!
//! The tape is in creation order, so walking it backwards visits every node after all of
//! its consumers: nothing sorts, hashes or recurses, and a chain of a million ops needs no
//! more stack than a chain of two. Gradients are allocated in the arena on first use,
//! zero-filled, and every op accumulates into them, so a node used twice (`x * x`) gets
//! both contributions; a product writes its input's first contribution instead (no read of
//! the zeros, and a reused buffer is not zero-filled: `BackwardCtx::grad_pair_write`).

use faer::Par;

use crate::dtype::Float;
use crate::engine::checkpoint::replay as checkpoint;
use crate::engine::custom;
use crate::error::{Error, Loc, Result};
use crate::ops;
use crate::record::ctx::{alloc_error, BackwardCtx, EngineBackward};
use crate::record::custom_op::CustomScratch;
use crate::record::handles::{Lent, State};
use crate::record::state::{Grads, Seed};
use crate::storage::Arena;
use crate::tape::id::{NodeId, NodeMap};
use crate::tape::op::Op;
use crate::tape::tape::recycle;

/// Checks that a backward pass from `out` with `seed` can run: `op`'s errors if not.
pub(crate) fn check<'s, T: Float>(
    tape: &State<'s, T>,
    out: NodeId<'s>,
    seed: Seed<'_, T>,
    op: &'static str,
    location: Loc,
) -> Result<()> {
    let node = tape.node(out);
    match seed {
        Seed::One if node.shape.numel() != 1 => return Err(Error::NotScalar { op, shape: node.shape, location }),
        Seed::Given(g) if g.len() != node.shape.numel() => {
            return Err(Error::SeedLength { op, len: g.len(), shape: node.shape, location })
        }
        _ => {}
    }
    if !node.requires_grad {
        return Err(Error::NoGradient { op, shape: node.shape, location });
    }
    Ok(())
}

/// Runs backward from `loss` over `tape`, leaving the gradients in `tape.grads`; the
/// caller has run [`check`]. `lend` first lists some nodes' gradient buffers (zeroed
/// memory of the caller's: `backward_into`'s parameter slots) in `tape.lent_grads`, which
/// each node takes as its gradient on first use and the walk accumulates into as into its
/// own; a listed node that gets no gradient has its buffer set in the map after the pass.
/// `undo` runs on the map if the pass fails. With `release`, each node that is not a leaf
/// gives its gradient buffer up once its own backward has run, for a later first use of
/// the same length to take instead of the arena: the gradients of intermediate nodes are
/// then not kept (`Var::grad` reads `None` for them).
#[allow(clippy::too_many_arguments)] // the pass and the two hooks
pub(crate) fn run_with<'s, T: Float>(
    tape: &mut State<'s, T>,
    arena: &'s Arena,
    par: Par,
    (loss, seed): (NodeId<'s>, Seed<'_, T>),
    location: Loc,
    (anomaly, release): (bool, bool),
    lend: impl FnOnce(&State<'s, T>, &mut Vec<Lent<'s, T>>),
    undo: impl FnOnce(&State<'s, T>, &mut Grads<'s, T>),
) -> Result<()> {
    let mut grads: Grads<'s, T> = NodeMap::from_vec(recycle(std::mem::take(&mut tape.grads).into_vec()));
    grads.resize_with(tape.nodes.len(), || None);
    let mut lent = std::mem::take(&mut tape.lent_grads);
    // Empty unless a pass unwound (a panic in a checkpointed block's recomputation) and
    // the caller caught it: that pass's slots must not be lent again.
    lent.clear();
    lend(tape, &mut lent);
    lent.sort_unstable_by_key(|e| e.node.raw());
    tape.lent_grads = lent;
    let mut custom = std::mem::take(&mut tape.custom_scratch);
    let mut spare = std::mem::take(&mut tape.spare_grads);
    let pool = release.then_some(&mut spare);
    let outer_laps = tape.profile.map(|p| p.begin_laps());
    let result = walk(tape, &mut grads, &mut custom, pool, arena, par, (loss, seed), location, anomaly);
    if let (Some(p), Some(outer)) = (tape.profile, outer_laps) {
        p.end_laps(outer);
    }
    // What no later first use took stays the arena's until the scope ends (the memory
    // report counts it).
    tape.released_bytes = spare.iter().map(|g| std::mem::size_of_val(&**g)).sum();
    spare.clear();
    tape.spare_grads = spare;
    let mut lent = std::mem::take(&mut tape.lent_grads);
    if result.is_err() {
        undo(tape, &mut grads);
    } else {
        // Zeroed slots whose node got no gradient: that node reads zeros, as it did when
        // the slot was set in the map before the walk.
        for Lent { node, slot } in lent.drain(..) {
            if let Some(g) = slot.into_inner() {
                grads[node] = Some(g);
            }
        }
    }
    lent.clear();
    tape.lent_grads = lent;
    // Whether or not it failed, hand the buffers back: gradients computed so far stay readable.
    tape.grads = grads.map(|g| g.map(|g| &*g));
    tape.custom_scratch = custom.recycle();
    result
}

/// The walk's answers for the ops the engine owns (see [`EngineBackward`]).
pub(crate) struct Walk;

impl<T: Float> EngineBackward<T> for Walk {
    fn custom<'s>(
        ctx: &mut BackwardCtx<'_, 's, T>,
        out: NodeId<'s>,
        (table, first, count): (u32, u32, u32),
    ) -> Result<()> {
        custom::backward(ctx, out, table, first, count)
    }
    fn checkpoint<'s>(ctx: &mut BackwardCtx<'_, 's, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<()> {
        checkpoint::backward(ctx, out, op, nested_pass::<T>)
    }
}

/// The `record::state::NestedPass` handed to `checkpoint::backward`: a releasing pass seeded at `start`,
/// with nothing lent.
fn nested_pass<'c, T: Float>(
    state: &mut State<'c, T>,
    arena: &'c Arena,
    par: Par,
    start: (NodeId<'c>, Seed<'_, T>),
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    run_with(state, arena, par, start, location, (anomaly, true), |_, _| {}, |_, _| {})
}

#[allow(clippy::too_many_arguments)] // the walk's whole state, passed once
fn walk<'s, T: Float>(
    tape: &State<'s, T>,
    grads: &mut Grads<'s, T>,
    custom: &mut CustomScratch<'s, T>,
    spare: Option<&mut Vec<&'s mut [T]>>,
    arena: &'s Arena,
    par: Par,
    (loss, seed): (NodeId<'s>, Seed<'_, T>),
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    let first = match seed {
        Seed::One => arena.alloc_fill(1, T::ONE),
        Seed::Given(g) => arena.alloc_iter(g.iter().copied()),
    };
    grads[loss] = Some(first.map_err(|e| alloc_error(e, "backward", location))?);
    let mut ctx = BackwardCtx { tape, grads, arena, custom, par, location, spare };
    // Profiling shares the anomaly check's test, and one value holds both flags, so the
    // loop keeps no more live than it did without profiling.
    let checks = Checks { anomaly, profile: tape.profile.is_some() };
    for id in tape.ids_through(loss).rev() {
        let node = tape.nodes[id.index()];
        if !node.requires_grad || ctx.grads[id].is_none() {
            continue;
        }
        ops::backward::<T, Walk>(node.op, &mut ctx, id)?;
        if checks != Checks::NONE {
            after_rule(&ctx, id, checks)?;
        }
        if let Some(spare) = ctx.spare.as_deref_mut() {
            if !matches!(node.op, Op::Leaf | Op::Variable | Op::Param(_)) {
                spare.extend(ctx.grads[id].take());
            }
        }
    }
    Ok(())
}

/// After node `id`'s backward rule, with anomaly detection or profiling on: the check of
/// its inputs' gradients, and the rule's time. The profile's lap timer stops here and the
/// next one starts, so the walk's own steps between two rules are charged to the later
/// rule (see `run_with`, which starts and ends the laps).
#[inline(never)]
fn after_rule<'s, T: Float>(ctx: &BackwardCtx<'_, 's, T>, id: NodeId<'s>, checks: Checks) -> Result<()> {
    if checks.anomaly {
        check_finite(ctx, id)?;
    }
    if let (true, Some(p)) = (checks.profile, ctx.tape.profile) {
        p.lap(ctx.tape.node(id).op.kind());
    }
    Ok(())
}

/// What runs after each backward rule: anomaly detection, profiling.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Checks {
    anomaly: bool,
    profile: bool,
}

impl Checks {
    const NONE: Checks = Checks { anomaly: false, profile: false };
}

/// After node `id`'s backward: the first input whose gradient holds a NaN or an infinity
/// is an error naming `id`'s op.
fn check_finite<'s, T: Float>(ctx: &BackwardCtx<'_, 's, T>, id: NodeId<'s>) -> Result<()> {
    let (tape, op) = (ctx.tape, ctx.tape.node(id).op);
    let mut bad = None;
    tape.for_each_input(&op, |x| {
        if let Some(g) = ctx.grads[x].as_deref() {
            if bad.is_none() && !g.iter().all(|v| v.is_finite()) {
                bad = Some(x);
            }
        }
    });
    match bad {
        None => Ok(()),
        Some(x) => Err(Error::NonFinite {
            op: tape.name_of(&op),
            phase: "backward",
            shape: tape.shape(x),
            location: tape.locs[id.index()],
        }),
    }
}
