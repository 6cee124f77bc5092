//! View ops: `reshape`, `squeeze`, `unsqueeze`, `permute`, `transpose`, `t`,
//! `broadcast_to`, `narrow`: every element of the output is one element of the input.
//!
//! Backward moves `dout` back to where each element came from:
//! - `reshape`/`squeeze`/`unsqueeze`: `dx += dout` (the forward value aliases the input's,
//!   so these cost no copy);
//! - `permute`: `dx[perm p] += dout[p]`;
//! - `broadcast_to`: `dx += dout` summed over the broadcast dimensions;
//! - `narrow(axis, start, len)`: `dx[.., start + l, ..] += dout[.., l, ..]`.

use std::panic::Location;

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx};
use crate::record::handles::Var;
use crate::shape::{resolve_axis, MAX_RANK};
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

impl<'s, T: Float> Var<'s, T> {
    /// The same elements with shape `dims` (same count). Costs no copy.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) if the element counts differ.
    #[track_caller]
    pub fn reshape(self, dims: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::Reshape, |r| {
            let n = r.node(self.id);
            let shape = r.shape_of(n.shape, dims)?;
            if shape.numel() != n.shape.numel() {
                return Err(Error::InvalidShape {
                    op: r.op,
                    shape: n.shape,
                    detail: format!(
                        "cannot view {} elements as {dims:?} ({} elements)",
                        n.shape.numel(),
                        shape.numel()
                    ),
                    location: r.location,
                });
            }
            Ok((Op::Reshape { x: self.id }, shape, n.value))
        })
    }

    /// Removes `axis`, which must have size 1.
    ///
    /// # Errors
    /// [`Error::BadAxis`] (recorded) if `axis` is out of range; [`Error::InvalidShape`]
    /// naming the axis and its size if that dimension is not 1.
    #[track_caller]
    pub fn squeeze(self, axis: isize) -> Var<'s, T> {
        let _name = self.core.composite("squeeze");
        let shape = self.shape();
        let location = Location::caller();
        match resolve_axis(shape.rank(), axis) {
            Some(ax) if shape.dim(ax) == 1 => {
                let kept = shape.without(ax);
                self.reshape(&kept.to_array()[..kept.rank()])
            }
            Some(ax) => {
                // A negative axis also names the dimension it resolved to.
                let named = if axis < 0 { format!("axis {axis} (dimension {ax})") } else { format!("axis {axis}") };
                let detail =
                    format!("{named} has size {}, not 1; only a dimension of size 1 can be squeezed", shape.dim(ax));
                self.core.fail_as("squeeze", |op| Error::InvalidShape { op, shape, detail, location })
            }
            None => self.core.fail_as("squeeze", |op| Error::BadAxis { op, axis, shape, location }),
        }
    }

    /// Inserts a dimension of size 1 before `axis` (`-1` appends one at the end).
    #[track_caller]
    pub fn unsqueeze(self, axis: isize) -> Var<'s, T> {
        let _name = self.core.composite("unsqueeze");
        let shape = self.shape();
        match resolve_axis(shape.rank() + 1, axis) {
            Some(ax) => {
                // Room for rank + 1 dimensions; a rank above 6 is reported by reshape.
                let mut dims = [1usize; MAX_RANK + 1];
                for (i, &d) in shape.dims().iter().enumerate() {
                    dims[if i < ax { i } else { i + 1 }] = d as usize;
                }
                self.reshape(&dims[..shape.rank() + 1])
            }
            None => {
                let location = Location::caller();
                self.core.fail_as("unsqueeze", |op| Error::BadAxis { op, axis, shape, location })
            }
        }
    }

    /// Reorders the axes: output axis `i` is input axis `axes[i]`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) unless `axes` is a permutation of `0..rank`.
    #[track_caller]
    pub fn permute(self, axes: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::Permute, |r| {
            let sx = r.shape(self.id);
            let mut seen = [false; MAX_RANK];
            let valid = axes.len() == sx.rank()
                && axes.iter().all(|&a| a < sx.rank() && !std::mem::replace(&mut seen[a], true));
            if !valid {
                return Err(Error::InvalidShape {
                    op: r.op,
                    shape: sx,
                    detail: format!("axes {axes:?} are not a permutation of 0..{}", sx.rank()),
                    location: r.location,
                });
            }
            let mut dims = [0usize; MAX_RANK];
            for (d, &a) in dims.iter_mut().zip(axes) {
                *d = sx.dim(a);
            }
            let so = r.shape_of(sx, &dims[..axes.len()])?;
            let out = r.alloc(so.numel())?;
            kernels::layout::permute(r.value(self.id), &sx, axes, &so, out);
            let mut packed = [0u8; MAX_RANK];
            for (p, &a) in packed.iter_mut().zip(axes) {
                *p = a as u8;
            }
            Ok((Op::Permute { x: self.id, axes: packed }, so, out))
        })
    }

    /// Swaps two axes.
    #[track_caller]
    pub fn transpose(self, a0: isize, a1: isize) -> Var<'s, T> {
        let _name = self.core.composite("transpose");
        let shape = self.shape();
        match (resolve_axis(shape.rank(), a0), resolve_axis(shape.rank(), a1)) {
            (Some(x), Some(y)) => {
                let mut axes: [usize; MAX_RANK] = std::array::from_fn(|i| i);
                axes.swap(x, y);
                self.permute(&axes[..shape.rank()])
            }
            (None, _) => {
                let location = Location::caller();
                self.core.fail_as("transpose", |op| Error::BadAxis { op, axis: a0, shape, location })
            }
            (_, None) => {
                let location = Location::caller();
                self.core.fail_as("transpose", |op| Error::BadAxis { op, axis: a1, shape, location })
            }
        }
    }

    /// Swaps the last two axes (the matrix transpose of each batch element).
    #[track_caller]
    pub fn t(self) -> Var<'s, T> {
        let _name = self.core.composite("t");
        self.transpose(-2, -1)
    }

    /// Broadcasts to `dims` by NumPy rules (copying).
    #[track_caller]
    pub fn broadcast_to(self, dims: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::BroadcastTo, |r| {
            let sx = r.shape(self.id);
            let target = r.shape_of(sx, dims)?;
            if sx.rank() > target.rank() || sx.broadcast(&target) != Some(target) {
                return Err(Error::Broadcast { op: r.op, lhs: sx, rhs: target, location: r.location });
            }
            let out = r.alloc(target.numel())?;
            let x = r.value(self.id);
            kernels::for_each2(&target, &sx.broadcast_strides(&target), &[0; MAX_RANK], |o, ix, _| out[o] = x[ix]);
            Ok((Op::BroadcastTo { x: self.id }, target, out))
        })
    }

    /// `len` elements along `axis` starting at `start` (PyTorch's `narrow`).
    ///
    /// # Errors
    /// [`Error::BadAxis`] or [`Error::IndexOutOfRange`] (recorded).
    #[track_caller]
    pub fn narrow(self, axis: isize, start: usize, len: usize) -> Var<'s, T> {
        self.core.record(OpKind::Narrow, |r| {
            let sx = r.shape(self.id);
            let ax = r.axis(sx, axis)?;
            let end = start.checked_add(len).filter(|&e| e <= sx.dim(ax));
            if end.is_none() {
                return Err(Error::IndexOutOfRange {
                    op: r.op,
                    index: start.saturating_add(len),
                    len: sx.dim(ax),
                    shape: sx,
                    location: r.location,
                });
            }
            let so = sx.with_dim(ax, len).expect("a narrower dimension cannot overflow");
            let (outer, lx, inner) = sx.split_at_axis(ax);
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            for o in 0..outer {
                let src = (o * lx + start) * inner;
                out[o * len * inner..(o + 1) * len * inner].copy_from_slice(&x[src..src + len * inner]);
            }
            Ok((Op::Narrow { x: self.id, axis: ax as u8, start: start as u32 }, so, out))
        })
    }
}

/// `dx += dout`: the value is the input's, reshaped.
#[inline(never)]
pub(crate) fn backward_reshape<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<()> {
    let par = ctx.par;
    if let Some((dout, dx, first)) = ctx.grad_pair_write(out, x)? {
        if first {
            // `0 + g`, as the accumulating path computes it (a `-0` becomes `+0`).
            kernels::par::map(par, dout, dx, |g| T::ZERO + g);
        } else {
            kernels::par::add_assign(par, dx, dout);
        }
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_permute<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axes: [u8; 6],
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    let mut ax = [0usize; MAX_RANK];
    for (a, &p) in ax.iter_mut().zip(&axes) {
        *a = p as usize;
    }
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::layout::permute_grad(dout, &sx, &ax[..sx.rank()], &so, dx);
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_broadcast<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::for_each2(&so, &sx.broadcast_strides(&so), &[0; MAX_RANK], |o, ix, _| dx[ix] += dout[o]);
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_narrow<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    let (outer, lx, inner) = sx.split_at_axis(axis as usize);
    let len = so.dim(axis as usize);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        for o in 0..outer {
            let dst = (o * lx + start as usize) * inner;
            kernels::add_assign(&mut dx[dst..dst + len * inner], &dout[o * len * inner..(o + 1) * len * inner]);
        }
    }
    Ok(())
}

/// Recorded derivative of `reshape`: `g` reshaped back.
#[track_caller]
pub(crate) fn grad_reshape<'s, T: Float>(ctx: &mut GradCtx<'_, 's, T>, g: Var<'s, T>, x: NodeId<'s>) -> Result<()> {
    if ctx.wants(x) {
        let sx = ctx.shape(x);
        ctx.add(x, g.reshape(&sx.to_array()[..sx.rank()]));
    }
    Ok(())
}

/// Recorded derivative of `permute`: `g` under the inverse permutation.
#[track_caller]
pub(crate) fn grad_permute<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axes: [u8; 6],
) -> Result<()> {
    if ctx.wants(x) {
        let rank = ctx.shape(x).rank();
        let mut inverse = [0usize; MAX_RANK];
        for (i, &a) in axes[..rank].iter().enumerate() {
            inverse[a as usize] = i;
        }
        ctx.add(x, g.permute(&inverse[..rank]));
    }
    Ok(())
}

/// Recorded derivative of `broadcast_to`: `g` summed over the broadcast dimensions.
#[track_caller]
pub(crate) fn grad_broadcast<'s, T: Float>(ctx: &mut GradCtx<'_, 's, T>, g: Var<'s, T>, x: NodeId<'s>) -> Result<()> {
    if ctx.wants(x) {
        ctx.add_reduced(x, g);
    }
    Ok(())
}

/// Recorded derivative of `narrow`: `g` padded with zeros back to `x`'s length ([`Op::Pad`]).
#[track_caller]
pub(crate) fn grad_narrow<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let len = ctx.shape(x).dim(axis as usize);
        ctx.add(x, g.pad_at(axis as usize, start as usize, len));
    }
    Ok(())
}

/// Forward rule of `reshape`: the tangent reshaped.
#[track_caller]
pub(crate) fn jvp_reshape<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    let so = ctx.shape(out);
    Ok(ctx.tangent(x).map(|t| t.reshape(&so.to_array()[..so.rank()])))
}

/// Forward rule of `permute`: the tangent permuted alike.
#[track_caller]
pub(crate) fn jvp_permute<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    x: NodeId<'s>,
    axes: [u8; 6],
) -> Result<Option<Var<'s, T>>> {
    let rank = ctx.shape(x).rank();
    let mut a = [0usize; MAX_RANK];
    for (d, &s) in a.iter_mut().zip(&axes[..rank]) {
        *d = s as usize;
    }
    Ok(ctx.tangent(x).map(|t| t.permute(&a[..rank])))
}

/// Forward rule of `broadcast_to`: the tangent broadcast alike.
#[track_caller]
pub(crate) fn jvp_broadcast<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).map(|t| ctx.fit(out, t)))
}

/// Forward rule of `narrow`: the same range of the tangent.
#[track_caller]
pub(crate) fn jvp_narrow<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<Option<Var<'s, T>>> {
    let len = ctx.shape(out).dim(axis as usize);
    Ok(ctx.tangent(x).map(|t| t.narrow(axis as isize, start as usize, len)))
}
