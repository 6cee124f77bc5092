//! Matrix product `out = a · b` for `a: [..., m, k]`, `b: [..., k, n]`, batch dimensions
//! broadcast (NumPy `matmul` rules; both operands need rank ≥ 2).
//!
//! Backward, with `dout = ∂L/∂out` (`[..., m, n]`):
//! `da += dout · bᵀ` and `db += aᵀ · dout`, summed over broadcast batch dimensions.
//! Both products run through faer with transposed views (no transpose is materialised)
//! and `Accum::Add` into the existing gradient buffers, so `x · x` gets both terms.
//!
//! `linear`: `out = x · w + b` for `x: [..., k]` (rank ≥ 2), `w: [k, n]`, `b: [n]`, one
//! node where `matmul` then `+` make two: the output starts as `b` in every row and faer
//! adds the product into it (`Accum::Add`), so there is no separate product value, no
//! second pass and no second gradient. With `x` seen as `[M, k]` (`M` its leading
//! elements) and `dout: [M, n]`: `dx += dout · wᵀ`, `dw += xᵀ · dout`,
//! `db += Σ_rows dout`, the bias sum by the same kernel as `+`'s broadcast gradient.
//! Recorded derivative: `matmul`'s, plus `g` summed to `[n]` for `b`.

use crate::error::Result;
use crate::graph::{NodeId, Var};
use crate::kernels;
use crate::kernels::matmul::{self as kmatmul, MatMulDims};
use crate::ops::{Op, OpKind};
use crate::record::{BackwardCtx, GradCtx};
use crate::Float;

impl<'s, T: Float> Var<'s, T> {
    /// Matrix product (batched, with broadcast batch dimensions).
    ///
    /// # Errors
    /// [`Error::MatMulShape`](crate::Error::MatMulShape) (recorded) unless both ranks are ≥ 2, `a`'s last dimension
    /// equals `b`'s second-to-last, and the batch dimensions broadcast;
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) if the output would not fit in memory.
    #[track_caller]
    pub fn matmul(self, b: Var<'s, T>) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::MatMul, |r| {
            let (sa, sb) = (r.shape(self.id), r.shape(b.id));
            let (dims, so) = MatMulDims::new(&sa, &sb).map_err(|p| MatMulDims::error(r.op, sa, sb, p, r.location))?;
            let out = r.alloc(so.numel())?;
            kmatmul::forward(&dims, r.value(self.id), r.value(b.id), out, par);
            Ok((Op::MatMul { a: self.id, b: b.id }, so, out))
        })
    }

    /// `self · w + b`, a fully connected layer in one node: `self: [..., k]` (rank ≥ 2),
    /// `w: [k, n]`, `b: [n]`, output `[..., n]`. The value and gradients are those of
    /// `self.matmul(w) + b` up to rounding, with one node's memory instead of two.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded), naming the
    /// three shapes, unless `self` has rank ≥ 2, `w` is `[k, n]` with `k` `self`'s last
    /// dimension, and `b` is `[n]`; [`Error::InvalidShape`](crate::Error::InvalidShape) if
    /// the output would not fit in memory.
    #[track_caller]
    pub fn linear(self, w: Var<'s, T>, b: Var<'s, T>) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::Linear, |r| {
            let (sx, sw, sb) = (r.shape(self.id), r.shape(w.id), r.shape(b.id));
            let r_x = sx.rank();
            let fits = r_x >= 2 && sw.rank() == 2 && sx.dim(r_x - 1) == sw.dim(0) && sb.dims() == &sw.dims()[1..];
            if !fits {
                return Err(
                    r.invalid(format!("x {sx}, w {sw}, b {sb}: needs x [..., k] of rank >= 2, w [k, n] and b [n]"))
                );
            }
            let (k, n) = (sw.dim(0), sw.dim(1));
            let mut dims = sx.to_array();
            dims[r_x - 1] = n;
            let so = r.shape_of(sx, &dims[..r_x])?;
            let out = r.alloc(so.numel())?;
            // Empty outputs skip both passes (a leading dimension may be huge beside a 0).
            if !out.is_empty() {
                let bias = r.value(b.id);
                out.chunks_exact_mut(n).for_each(|row| row.copy_from_slice(bias));
                if k > 0 {
                    let m = so.numel() / n;
                    T::gemm(out, r.value(self.id), false, r.value(w.id), false, (m, k, n), true, par);
                }
            }
            Ok((Op::Linear { x: self.id, w: w.id, b: b.id }, so, &*out))
        })
    }
}

pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let dims = MatMulDims::new(&ctx.shape(a), &ctx.shape(b)).expect("shapes were checked when matmul was recorded").0;
    let (va, vb, par) = (ctx.value(a), ctx.value(b), ctx.par);
    if let Some((dout, da)) = ctx.grad_pair(out, a)? {
        kmatmul::backward_a(&dims, dout, vb, da, par);
    }
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        kmatmul::backward_b(&dims, dout, va, db, par);
    }
    Ok(())
}

pub(crate) fn backward_linear<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    w: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let (sw, sb, so) = (ctx.shape(w), ctx.shape(b), ctx.shape(out));
    // An empty output or inner dimension contributes empty sums: the slots are made (as
    // zeros) but no product runs (a leading dimension may be huge beside a 0).
    let (k, n) = (sw.dim(0), sw.dim(1));
    let products = so.numel() > 0 && k > 0;
    let m = if so.numel() > 0 { so.numel() / n } else { 0 };
    let (vx, vw, vb, par) = (ctx.value(x), ctx.value(w), ctx.value(b), ctx.par);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        if products {
            T::gemm(dx, dout, false, vw, true, (m, n, k), true, par);
        }
    }
    if let Some((dout, dw)) = ctx.grad_pair(out, w)? {
        if products {
            T::gemm(dw, vx, true, dout, false, (k, m, n), true, par);
        }
    }
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        if so.numel() > 0 {
            // `+`'s gradient for a bias broadcast over rows: column blocks, rows in order.
            let rows = crate::shape::Shape::new(&[m, n]).expect("no larger than the output's shape");
            kernels::par::binary_grad(par, (dout, &rows), (vb, &sb), (dout, &rows), db, |g, _, _| g);
        }
    }
    Ok(())
}

/// Recorded derivative of `linear`: `matmul`'s for `x` and `w`, and `g` summed over the
/// rows for `b`.
#[track_caller]
pub(crate) fn grad_linear<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    w: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    grad(ctx, g, x, w)?;
    if ctx.wants(b) {
        ctx.add_reduced(b, g);
    }
    Ok(())
}

/// Recorded derivative: `da = g · bᵀ`, `db = aᵀ · g`, each summed over broadcast batch
/// dimensions.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    if ctx.wants(a) {
        let bt = transposed(ctx, b);
        ctx.add_reduced(a, g.matmul(bt));
    }
    if ctx.wants(b) {
        let at = transposed(ctx, a);
        ctx.add_reduced(b, at.matmul(g));
    }
    Ok(())
}

/// `x.t()`, or the node `x` transposed if `x` is itself a transpose (the recorded
/// derivative's own `bᵀ`, met again when that derivative is differentiated): the same
/// value without a copy.
#[track_caller]
fn transposed<'s, T: Float>(ctx: &GradCtx<'_, 's, T>, x: NodeId<'s>) -> Var<'s, T> {
    let op = ctx.core.tape.borrow().nodes[x.index()].op;
    if let Op::Permute { x: inner, axes } = op {
        let r = ctx.shape(x).rank();
        let swap = r >= 2
            && axes[r - 2] as usize == r - 1
            && axes[r - 1] as usize == r - 2
            && axes[..r - 2].iter().enumerate().all(|(i, &a)| a as usize == i);
        if swap {
            return ctx.var(inner);
        }
    }
    ctx.var(x).t()
}
