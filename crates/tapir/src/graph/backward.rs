//! The backward pass: one reverse loop over the tape. Each node's own
//! [`Op::backward`](crate::ops) adds its contribution to its inputs' gradients.
//!
//! The tape is in creation order, so walking it backwards visits every node after all of
//! its consumers: nothing sorts, hashes or recurses, and a chain of a million ops needs no
//! more stack than a chain of two. Gradients are allocated in the arena on first use,
//! zero-filled, and every op accumulates into them, so a node used twice (`x * x`) gets
//! both contributions.

use faer::Par;

use crate::error::{Error, Loc, Result};
use crate::graph::id::NodeMap;
use crate::graph::tape::{recycle, Tape};
use crate::graph::NodeId;
use crate::record::{alloc_error, BackwardCtx};
use crate::storage::Arena;
use crate::Float;

/// Runs backward from `loss` over `tape`, leaving the gradients in `tape.grads`.
pub(crate) fn run<'s, T: Float>(
    tape: &mut Tape<'s, T>,
    arena: &'s Arena,
    par: Par,
    loss: NodeId<'s>,
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    let node = tape.node(loss);
    if node.shape.numel() != 1 {
        return Err(Error::NotScalar { op: "backward", shape: node.shape, location });
    }
    let mut grads: NodeMap<'s, Option<&'s mut [T]>> =
        NodeMap::from_vec(recycle(std::mem::take(&mut tape.grads).into_vec()));
    grads.resize_with(tape.nodes.len(), || None);
    let result = walk(tape, &mut grads, arena, par, loss, location, anomaly);
    // Whether or not it failed, hand the buffer back: gradients computed so far stay readable.
    tape.grads = grads.map(|g| g.map(|g| &*g));
    result
}

fn walk<'s, T: Float>(
    tape: &Tape<'s, T>,
    grads: &mut NodeMap<'s, Option<&'s mut [T]>>,
    arena: &'s Arena,
    par: Par,
    loss: NodeId<'s>,
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    if !tape.node(loss).requires_grad {
        return Ok(());
    }
    grads[loss] = Some(arena.alloc_fill(1, T::ONE).map_err(|e| alloc_error(e, "backward", location))?);
    let mut ctx = BackwardCtx { tape, grads, arena, par, location };
    for id in tape.ids_through(loss).rev() {
        let node = tape.nodes[id.index()];
        if !node.requires_grad || ctx.grads[id].is_none() {
            continue;
        }
        node.op.backward(&mut ctx, id)?;
        if anomaly {
            check_finite(&ctx, id)?;
        }
    }
    Ok(())
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
            op: op.name(),
            phase: "backward",
            shape: tape.shape(x),
            location: tape.locs[id.index()],
        }),
    }
}
