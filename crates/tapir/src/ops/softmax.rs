//! `softmax` and `log_softmax` along one axis, computed stably (shifted by the maximum).
//!
//! Forward: `y = exp(x − lse(x))`, and `log_softmax`: `y = x − lse(x)`, where
//! `lse(x) = m + ln Σ exp(x − m)`, `m = max x`.
//! Backward, along the axis: softmax `dx += y ⊙ (dy − Σ dy ⊙ y)`;
//! log-softmax `dx += dy − exp(y) Σ dy`. Both are primitives rather than compositions
//! of `exp`, `sum` and `div`, which would overflow for large inputs.

use crate::dtype::Float;
use crate::error::Result;
use crate::kernels::par;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx};
use crate::record::handles::Var;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

impl<'s, T: Float> Var<'s, T> {
    #[track_caller]
    fn softmax_impl(self, axis: isize, log: bool) -> Var<'s, T> {
        let kind = if log { OpKind::LogSoftmax } else { OpKind::Softmax };
        self.core.record(kind, |r| {
            let shape = r.shape(self.id);
            let ax = r.axis(shape, axis)?;
            let out = r.alloc_written(shape.numel())?;
            par::softmax_axis(self.core.par, r.value(self.id), shape.split_at_axis(ax), out, log);
            let op = if log {
                Op::LogSoftmax { x: self.id, axis: ax as u8 }
            } else {
                Op::Softmax { x: self.id, axis: ax as u8 }
            };
            Ok((op, shape, out))
        })
    }

    /// Softmax along `axis` (negative counts from the end).
    #[track_caller]
    pub fn softmax(self, axis: isize) -> Var<'s, T> {
        self.softmax_impl(axis, false)
    }

    /// Log-softmax along `axis`.
    #[track_caller]
    pub fn log_softmax(self, axis: isize) -> Var<'s, T> {
        self.softmax_impl(axis, true)
    }
}

#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    log: bool,
) -> Result<()> {
    let dims = ctx.shape(x).split_at_axis(axis as usize);
    let (y, threads) = (ctx.value(out), ctx.par);
    if let Some((dy, dx)) = ctx.grad_pair(out, x)? {
        par::softmax_axis_grad(threads, dy, y, dims, dx, log);
    }
    Ok(())
}

/// Recorded derivative: softmax `dx = y ⊙ (g − Σ g ⊙ y)`, log-softmax `dx = g − exp(y) Σ g`,
/// sums along the axis (kept as size 1 and broadcast back).
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
    log: bool,
) -> Result<()> {
    if ctx.wants(x) {
        let y = ctx.var(out);
        let ax = [axis as isize];
        let dx = if log { g - y.exp() * g.sum_axes(&ax, true) } else { y * (g - (g * y).sum_axes(&ax, true)) };
        ctx.add(x, dx);
    }
    Ok(())
}

/// Forward rule: `t_y = y ⊙ (t − Σ y ⊙ t)` for softmax, `t − Σ softmax ⊙ t` for log-softmax.
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    log: bool,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(x) else { return Ok(None) };
    let (y, ax) = (ctx.var(out), [axis as isize]);
    Ok(Some(if log { t - (y.exp() * t).sum_axes(&ax, true) } else { y * (t - (y * t).sum_axes(&ax, true)) }))
}
