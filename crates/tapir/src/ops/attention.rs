//! Multi-head scaled dot-product attention on a packed `qkv: [B, T, 3C]` (a transformer's
//! fused query/key/value projection), in two nodes:
//!
//! - `attention_weights`: `p = softmax_j(q_i · k_j / √D)` per sequence and head,
//!   `[B, H, T, T]`; causal rows see only keys `j ≤ i`, and the others get exactly `0`.
//! - `attend`: `out = concat_h(p_h · v_h)`, `[B, T, C]`.
//!
//! Head `h` (of `H`, `D = C/H` wide) reads columns `[h·D, (h+1)·D)` of the query block
//! (columns `0..C`), the key block (`C..2C`) and the value block (`2C..3C`): the layout of
//! `x · W_qkv` with `W_qkv`'s columns `[q | k | v]`, head-major inside each. The kernels
//! (`kernels/attention.rs`) read the heads in place as strided matrices, so the head
//! split, the transposes, the mask and the head merge of the composition
//! `narrow → reshape → permute → matmul → where → softmax → matmul → permute` cost no
//! copies and no nodes. The causal mask is not a large negative score: masked entries
//! never enter the softmax, so no value or gradient is infinite or NaN and anomaly
//! detection stays usable. Dropout on the weights goes between the two nodes.
//!
//! NaN: the kernels skip a term with a factor exactly `0` and the other NaN or infinite
//! (strong zeros), so a masked weight never multiplies a later position's value, and a
//! NaN at position `t` reaches only the rows `≥ t` (docs/design.md, "NaN policy"). The
//! recorded derivatives below are ordinary ops and follow IEEE arithmetic.
//!
//! Backward, with `dp = ∂L/∂p`, `s = √D`:
//! `ds = p ⊙ (dp − Σ_j dp ⊙ p) / s` (zero where `p` is), `dq_h += ds · k_h`,
//! `dk_h += dsᵀ · q_h`; and for `attend`, with `g = ∂L/∂out` split into heads,
//! `dp_h += g_h · v_hᵀ`, `dv_h += p_hᵀ · g_h`. Recorded derivatives: the same formulas in
//! recorded ops (head split by `narrow`/`reshape`/`permute`, `matmul`, and `pad_axis` back
//! into the `qkv` layout), so that both nodes can be differentiated again.

use crate::dtype::Float;
use crate::error::Result;
use crate::kernels::attention::{self as kattn, AttnDims};
use crate::record::ctx::{plus, BackwardCtx, GradCtx, JvpCtx};
use crate::record::handles::Var;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

/// The attention dimensions of a packed `qkv` shape for `heads` heads, if it is one:
/// rank 3, last dimension `3C` with `C` a positive multiple of `heads`.
fn dims_of(qkv: Shape, heads: usize) -> Option<AttnDims> {
    if qkv.rank() != 3 {
        return None;
    }
    let (b, t, c3) = (qkv.dim(0), qkv.dim(1), qkv.dim(2));
    let c = c3 / 3;
    (heads > 0 && c3 % 3 == 0 && c > 0 && c % heads == 0).then(|| AttnDims { b, t, h: heads, d: c / heads })
}

impl<'s, T: Float> Var<'s, T> {
    /// Attention weights of a packed `self = qkv: [B, T, 3C]` with `heads` heads:
    /// `softmax_j(q_i · k_j / √D)` for each sequence, head and query position `i`,
    /// `[B, H, T, T]`. With `causal`, position `i` sees keys `j ≤ i` only and the weights
    /// of later keys are exactly `0` (no `−∞` or stand-in score is involved). Query, key
    /// and value are the column blocks `[0, C)`, `[C, 2C)`, `[2C, 3C)`, head `h` taking
    /// columns `[h·D, (h+1)·D)` of each (`D = C/H`). The same values as the composition
    /// of `narrow`, `permute`, `matmul` and a masked `softmax`, in one node and no copies;
    /// [`attend`](Var::attend) mixes the values with them.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded), naming the
    /// shape and `heads`, unless `self` is `[B, T, 3C]` with `C` a positive multiple of
    /// `heads`; [`Error::InvalidShape`](crate::Error::InvalidShape) if `[B, H, T, T]` would
    /// not fit in memory.
    #[track_caller]
    pub fn attention_weights(self, heads: usize, causal: bool) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::AttentionWeights, |r| {
            let sx = r.shape(self.id);
            let Some(dims) = dims_of(sx, heads).filter(|_| u32::try_from(heads).is_ok()) else {
                return Err(r.invalid(format!(
                    "qkv {sx}, heads {heads}: needs qkv [B, T, 3C] with C a positive multiple of heads"
                )));
            };
            let so = r.shape_of(sx, &[dims.b, heads, dims.t, dims.t])?;
            let out = r.alloc_written(so.numel())?;
            kattn::weights(par, dims, r.value(self.id), causal, out);
            Ok((Op::AttentionWeights { qkv: self.id, heads: heads as u32 }, so, &*out))
        })
    }

    /// `self = p: [B, H, T, T]` (attention weights, as from
    /// [`attention_weights`](Var::attention_weights), perhaps with dropout) applied to the
    /// value block of the packed `qkv: [B, T, 3C]`: `out[b, i, h·D..(h+1)·D] = Σ_j p[b, h,
    /// i, j] · v_h[b, j]`, `[B, T, C]`, the heads side by side in head order (the layout
    /// an output projection reads).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded), naming both
    /// shapes, unless `p` is `[B, H, T, T]` and `qkv` is `[B, T, 3C]` with `C` a positive
    /// multiple of `H`.
    #[track_caller]
    pub fn attend(self, qkv: Var<'s, T>) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::Attend, |r| {
            let (sp, sx) = (r.shape(self.id), r.shape(qkv.id));
            let dims = if sp.rank() == 4 { dims_of(sx, sp.dim(1)) } else { None };
            let fits = |d: &AttnDims| (0..4).map(|i| sp.dim(i)).eq([d.b, d.h, d.t, d.t]);
            let Some(dims) = dims.filter(fits) else {
                return Err(r.invalid(format!(
                    "p {sp}, qkv {sx}: needs p [B, H, T, T] and qkv [B, T, 3C] with C a positive multiple of H"
                )));
            };
            let so = r.shape_of(sx, &[dims.b, dims.t, dims.h * dims.d])?;
            let out = r.alloc_written(so.numel())?;
            kattn::attend(par, dims, r.value(self.id), r.value(qkv.id), out);
            Ok((Op::Attend { p: self.id, qkv: qkv.id }, so, &*out))
        })
    }
}

/// Out of line, as `layer_norm`'s: the walk's dispatcher stays small.
#[inline(never)]
pub(crate) fn backward_weights<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    qkv: NodeId<'s>,
    heads: u32,
) -> Result<()> {
    let dims = dims_of(ctx.shape(qkv), heads as usize).expect("checked when attention_weights was recorded");
    if !ctx.requires_grad(qkv) {
        return Ok(());
    }
    let (x, p, par) = (ctx.value(qkv), ctx.value(out), ctx.par);
    let ds = ctx.fresh_grad(p.len())?;
    if let Some((dp, dx)) = ctx.grad_pair(out, qkv)? {
        kattn::weights_backward(par, dims, x, p, dp, dx, ds);
    }
    ctx.release(ds);
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_attend<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    p: NodeId<'s>,
    qkv: NodeId<'s>,
) -> Result<()> {
    let heads = ctx.shape(p).dim(1);
    let dims = dims_of(ctx.shape(qkv), heads).expect("checked when attend was recorded");
    let (vp, x, par) = (ctx.value(p), ctx.value(qkv), ctx.par);
    if let Some((dout, dp)) = ctx.grad_pair(out, p)? {
        kattn::attend_backward_p(par, dims, dout, x, dp);
    }
    if let Some((dout, dx)) = ctx.grad_pair(out, qkv)? {
        kattn::attend_backward_v(par, dims, dout, vp, dx);
    }
    Ok(())
}

/// The head split of block `part` (0: query, 1: key, 2: value) of `qkv`, `[B, H, T, D]`.
#[track_caller]
fn split<'s, T: Float>(qkv: Var<'s, T>, d: AttnDims, part: usize) -> Var<'s, T> {
    let c = d.h * d.d;
    qkv.narrow(-1, part * c, c).reshape(&[d.b, d.t, d.h, d.d]).permute(&[0, 2, 1, 3])
}

/// `[B, H, T, D]` back to `[B, T, C]`, placed as block `part` of a `[B, T, 3C]` gradient.
#[track_caller]
fn merge<'s, T: Float>(y: Var<'s, T>, d: AttnDims, part: usize) -> Var<'s, T> {
    let c = d.h * d.d;
    y.permute(&[0, 2, 1, 3]).reshape(&[d.b, d.t, c]).pad_axis(-1, part * c, (2 - part) * c)
}

/// Recorded derivative of `attention_weights`: `ds = p ⊙ (g − Σ_j g ⊙ p)/√D`,
/// `dq = ds · k`, `dk = dsᵀ · q`.
#[track_caller]
pub(crate) fn grad_weights<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    qkv: NodeId<'s>,
    heads: u32,
) -> Result<()> {
    if !ctx.wants(qkv) {
        return Ok(());
    }
    let d = dims_of(ctx.shape(qkv), heads as usize).expect("checked when attention_weights was recorded");
    let (x, p) = (ctx.var(qkv), ctx.var(out));
    let ds = (p * (g - (g * p).sum_axes(&[-1], true))).mul_scalar(d.scale::<T>());
    let (q, k) = (split(x, d, 0), split(x, d, 1));
    let dx = merge(ds.matmul(k), d, 0) + merge(ds.t().matmul(q), d, 1);
    ctx.add(qkv, dx);
    Ok(())
}

/// Recorded derivative of `attend`: `dp_h = g_h · v_hᵀ`, `dv_h = p_hᵀ · g_h`.
#[track_caller]
pub(crate) fn grad_attend<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    p: NodeId<'s>,
    qkv: NodeId<'s>,
) -> Result<()> {
    let heads = ctx.shape(p).dim(1);
    let d = dims_of(ctx.shape(qkv), heads).expect("checked when attend was recorded");
    let gh = g.reshape(&[d.b, d.t, d.h, d.d]).permute(&[0, 2, 1, 3]);
    if ctx.wants(p) {
        let v = split(ctx.var(qkv), d, 2);
        ctx.add(p, gh.matmul(v.t()));
    }
    if ctx.wants(qkv) {
        ctx.add(qkv, merge(ctx.var(p).t().matmul(gh), d, 2));
    }
    Ok(())
}

/// Forward rule of `attention_weights`: `ts = (tq·kᵀ + q·tkᵀ)/√D` per head, then the
/// softmax's `tp = p ⊙ (ts − Σ_j p ⊙ ts)` (masked weights are 0, so their tangent is too).
#[track_caller]
pub(crate) fn jvp_weights<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    qkv: NodeId<'s>,
    heads: u32,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(qkv) else { return Ok(None) };
    let d = dims_of(ctx.shape(qkv), heads as usize).expect("checked when attention_weights was recorded");
    let (x, p) = (ctx.var(qkv), ctx.var(out));
    let (q, k, tq, tk) = (split(x, d, 0), split(x, d, 1), split(t, d, 0), split(t, d, 1));
    let ts = (tq.matmul(k.t()) + q.matmul(tk.t())).mul_scalar(d.scale::<T>());
    Ok(Some(p * (ts - (p * ts).sum_axes(&[-1], true))))
}

/// Forward rule of `attend`: `tp_h·v_h + p_h·tv_h`, laid out as the output.
#[track_caller]
pub(crate) fn jvp_attend<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    p: NodeId<'s>,
    qkv: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    let heads = ctx.shape(p).dim(1);
    let d = dims_of(ctx.shape(qkv), heads).expect("checked when attend was recorded");
    let (vp, v) = (ctx.var(p), split(ctx.var(qkv), d, 2));
    let per_head = plus(ctx.tangent(p).map(|t| t.matmul(v)), ctx.tangent(qkv).map(|t| vp.matmul(split(t, d, 2))));
    let so = ctx.shape(out);
    Ok(per_head.map(|t| t.permute(&[0, 2, 1, 3]).reshape(&so.to_array()[..so.rank()])))
}
