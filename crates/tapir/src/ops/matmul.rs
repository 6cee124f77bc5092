//! Matrix product `out = a · b` for `a: [..., m, k]`, `b: [..., k, n]`, batch dimensions
//! broadcast (NumPy `matmul` rules; both operands need rank ≥ 2).
//!
//! Backward, with `dout = ∂L/∂out` (`[..., m, n]`):
//! `da += dout · bᵀ` and `db += aᵀ · dout`, summed over broadcast batch dimensions.
//! Both products run through faer with transposed views (no transpose is materialised)
//! and `Accum::Add` into the existing gradient buffers, so `x · x` gets both terms.

use crate::error::Result;
use crate::graph::{NodeId, Var};
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
