//! Forward mode: the hook that records a node's tangents as it is recorded, and the
//! forward rules of the ops the engine owns (custom ops and checkpoints).
//!
//! Each open level (`Scope::forward`) is a side table mapping nodes to the nodes holding
//! their tangents (`record::handles::Tangents`). When a node is recorded while a level is
//! open, [`propagate`] runs its rule (`ops::jvp`) at every propagating level where one of
//! its inputs has a tangent. The rule records the tangent with the ordinary op methods, so
//! tangents are nodes of the same tape: they can be combined, differentiated in reverse
//! (`Scope::grad` over a tangent is `grad∘jvp`) or carried by an outer level (`jvp∘jvp`).
//! While level `l`'s rule records, levels `l` and above are suspended: its ops get
//! tangents at the outer levels only, which is what nesting means (an inner level's
//! computations are functions the outer ones differentiate, never the reverse).

use crate::dtype::Float;
use crate::engine::checkpoint::replay as checkpoint;
use crate::engine::custom;
use crate::error::Result;
use crate::ops;
use crate::record::ctx::{EngineJvp, JvpCtx};
use crate::record::handles::{Core, Replay, Var};
use crate::tape::id::NodeId;

/// Records the tangents of node `id`, just recorded, at every propagating level where an
/// input has one (the hook of `Tangents`). A rule's error becomes the scope's.
pub(crate) fn propagate<'s, T: Float>(core: &'s Core<'s, T>, scope: &'s (dyn Replay<'s, T> + 's), id: NodeId<'s>) {
    let (op, levels) = {
        let tape = core.tape.borrow();
        (tape.node(id).op, tape.tangents.cut)
    };
    for level in 0..levels {
        let any = {
            let tape = core.tape.borrow();
            let mut any = false;
            tape.for_each_input(&op, |i| any |= tape.tangents.get(level, i).is_some());
            any
        };
        if !any {
            continue;
        }
        let cut = std::mem::replace(&mut core.tape.borrow_mut().tangents.cut, level);
        let ctx = JvpCtx { core, scope, level };
        let result = ops::jvp::<T, Rules>(op, &ctx, id);
        let mut tape = core.tape.borrow_mut();
        tape.tangents.cut = cut;
        match result {
            Ok(Some(t)) if tape.error.is_none() => {
                debug_assert_eq!(tape.shape(t.id), tape.shape(id), "{}'s tangent has another shape", op.name());
                tape.tangents.set(level, id, t.id);
            }
            Ok(_) => {}
            Err(e) => {
                if tape.error.is_none() {
                    tape.error = Some(e);
                    tape.slow = true;
                }
            }
        }
    }
}

/// The forward rules of the ops the engine owns (see [`EngineJvp`]).
struct Rules;

impl<T: Float> EngineJvp<T> for Rules {
    fn custom<'s>(
        ctx: &JvpCtx<'s, T>,
        out: NodeId<'s>,
        (table, first, count): (u32, u32, u32),
    ) -> Result<Option<Var<'s, T>>> {
        custom::jvp(ctx, out, table, first, count)
    }

    /// The block runs again on the scope with this level propagating, from the
    /// checkpoint's inputs (which carry their tangents); the recomputed output's tangent
    /// is the checkpoint's. The block's intermediates are then kept, as for `Scope::grad`.
    fn checkpoint<'s>(ctx: &JvpCtx<'s, T>, out: NodeId<'s>, op: (u32, u32, u32)) -> Result<Option<Var<'s, T>>> {
        let cut = std::mem::replace(&mut ctx.core.tape.borrow_mut().tangents.cut, ctx.level + 1);
        let recomputed = checkpoint::recompute(ctx.scope, ctx.core, out, op);
        ctx.core.tape.borrow_mut().tangents.cut = cut;
        let Some((_, y)) = recomputed? else { return Ok(None) };
        Ok(ctx.tangent(y))
    }
}
