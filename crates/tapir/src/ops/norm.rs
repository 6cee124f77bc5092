//! `layer_norm`: normalisation over the last axis with a per-feature scale and shift, in
//! one node.
//!
//! For `x: [..., C]`, `w: [C]`, `b: [C]` and each row of `C` elements:
//! `μ = Σ x / C`, `σ² = Σ (x − μ)² / C` (two passes, no cancellation), `r = 1/√(σ² + ε)`,
//! `x̂ = (x − μ)·r`, `out = x̂ ⊙ w + b`.
//!
//! Backward, with `g = ∂L/∂out` and `ĝ = g ⊙ w` per row:
//! `dx += r·(ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂))`, `dw += Σ_rows g ⊙ x̂`, `db += Σ_rows g`.
//! The row statistics are recomputed from `x` (a row is in cache) rather than kept, so the
//! node holds only its output (kernels in `kernels/norm.rs`).
//!
//! The composition `(x − mean)·rsqrt(var + ε)·w + b` records ten nodes, each with a value
//! and a gradient and most with a broadcasting backward; this is one node with the same
//! values up to rounding. Recorded derivative: the formulas above in recorded ops, with
//! `x̂` and `r` recomputed from `x` by that composition, so that it can be differentiated
//! again.

use crate::dtype::Float;
use crate::error::Result;
use crate::kernels::norm;
use crate::record::ctx::{plus, BackwardCtx, GradCtx, JvpCtx};
use crate::record::handles::Var;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

impl<'s, T: Float> Var<'s, T> {
    /// Layer normalisation over the last axis: `(self − μ)/√(σ² + eps) ⊙ w + b`, with `μ`
    /// and `σ²` the mean and the biased variance of each row, as PyTorch's
    /// `nn.functional.layer_norm(x, [C], w, b, eps)`. `self: [..., C]` (rank ≥ 1), `w` and
    /// `b`: `[C]`. One node: the value and gradients of the composition, with one node's
    /// memory instead of ten.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded), naming the
    /// three shapes and `eps`, unless `self` has rank ≥ 1, `w` and `b` are `[C]` with `C`
    /// `self`'s last dimension, and `eps` is finite and `≥ 0`.
    #[track_caller]
    pub fn layer_norm(self, w: Var<'s, T>, b: Var<'s, T>, eps: f64) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::LayerNorm, |r| {
            let (sx, sw, sb) = (r.shape(self.id), r.shape(w.id), r.shape(b.id));
            let c = sx.dims().last().copied();
            let fits = c.is_some_and(|c| sw.dims() == [c] && sb.dims() == [c]);
            if !(fits && eps.is_finite() && eps >= 0.0) {
                return Err(r.invalid(format!(
                    "x {sx}, w {sw}, b {sb}, eps {eps}: needs x [..., C] of rank >= 1, w and b [C], and a finite eps >= 0"
                )));
            }
            let out = r.alloc_written(sx.numel())?;
            let eps = T::from_f64(eps);
            norm::forward(par, r.value(self.id), r.value(w.id), r.value(b.id), eps, out);
            let first = r.store_ids([self.id, w.id, b.id])?;
            Ok((Op::LayerNorm { first, eps }, sx, &*out))
        })
    }
}

/// The three inputs stored at `first`.
fn inputs<'s>(ids: impl Iterator<Item = NodeId<'s>>) -> [NodeId<'s>; 3] {
    let mut it = ids;
    let mut next = || it.next().expect("layer_norm stores three ids");
    [next(), next(), next()]
}

/// Out of line: the walk's dispatcher inlines `Op::backward`, and every shape-`[1]` op's
/// backward pays for the size of what is inlined into it (W3, callgrind).
#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    first: u32,
    eps: T,
) -> Result<()> {
    let [x, w, b] = inputs(ctx.stored_ids(first, 3));
    let (vx, vw, par) = (ctx.value(x), ctx.value(w), ctx.par);
    let c = vw.len();
    if vx.is_empty() || c == 0 {
        // No rows, or rows of nothing: every sum is empty. The slots are still made.
        for id in [x, w, b] {
            ctx.grad_pair(out, id)?;
        }
        return Ok(());
    }
    // Mean and 1/σ of every row, once for the three gradients.
    let stats = ctx.fresh_grad(2 * (vx.len() / c))?;
    norm::row_stats(par, vx, c, eps, stats);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        norm::backward_x(par, dout, vx, vw, stats, dx);
    }
    if let Some((dout, dw)) = ctx.grad_pair(out, w)? {
        norm::backward_w(dout, vx, stats, dw);
    }
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        norm::backward_b(dout, db);
    }
    Ok(())
}

/// Recorded derivative: `dx = r·(ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂))` with `ĝ = g ⊙ w`,
/// `dw = Σ_rows g ⊙ x̂`, `db = Σ_rows g`; `x̂` and `r` recorded from `x`.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(ctx: &mut GradCtx<'_, 's, T>, g: Var<'s, T>, first: u32, eps: T) -> Result<()> {
    let [x, w, b] = inputs((0..3).map(|k| ctx.stored_id(first, k)));
    if ctx.wants(x) || ctx.wants(w) {
        let xv = ctx.var(x);
        let last = [-1isize];
        let centred = xv - xv.mean_axes(&last, true);
        let rstd = centred.square().mean_axes(&last, true).add_scalar(eps).rsqrt();
        let xhat = centred * rstd;
        if ctx.wants(x) {
            let gw = g * ctx.var(w);
            let dx = rstd * (gw - gw.mean_axes(&last, true) - xhat * (gw * xhat).mean_axes(&last, true));
            ctx.add(x, dx);
        }
        if ctx.wants(w) {
            ctx.add_reduced(w, g * xhat);
        }
    }
    if ctx.wants(b) {
        ctx.add_reduced(b, g);
    }
    Ok(())
}

/// Forward rule: `t = t_x̂ ⊙ w + x̂ ⊙ tw + tb`, with `t_x̂ = rstd ⊙ (tc − x̂ ⊙ mean(x̂ ⊙ tc))`
/// and `tc = tx − mean(tx)` over the last axis.
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    first: u32,
    eps: T,
) -> Result<Option<Var<'s, T>>> {
    let [x, w, b] = inputs((0..3).map(|k| ctx.stored_id(first, k)));
    let (tx, tw) = (ctx.tangent(x), ctx.tangent(w));
    let scaled = if tx.is_some() || tw.is_some() {
        let xv = ctx.var(x);
        let last = [-1isize];
        let centred = xv - xv.mean_axes(&last, true);
        let rstd = centred.square().mean_axes(&last, true).add_scalar(eps).rsqrt();
        let xhat = centred * rstd;
        let from_x = tx.map(|t| {
            let tc = t - t.mean_axes(&last, true);
            rstd * (tc - xhat * (xhat * tc).mean_axes(&last, true)) * ctx.var(w)
        });
        plus(from_x, tw.map(|t| xhat * t))
    } else {
        None
    };
    Ok(plus(scaled, ctx.tangent(b)).map(|t| ctx.fit(out, t)))
}
