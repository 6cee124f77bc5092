//! The adjoints of the slicing ops, which their recorded derivatives need
//! ([`Scope::grad`](crate::Scope::grad)): `pad_axis` (of `narrow`) and `scatter_add` (of
//! `index_select`). Each is also the other's derivative: the derivative of a pad is a
//! narrow, of a scatter-add an index-select, so derivatives of any order stay in this set.
//!
//! - `pad_axis(axis, before, after)`: `out[.., before + l, ..] = x[.., l, ..]`, zeros
//!   elsewhere. Backward: `dx += dout[.., before .. before + len, ..]`.
//! - `scatter_add(axis, idx, len)`: zeros of length `len` along `axis`, then
//!   `out[.., idx[j], ..] += x[.., j, ..]` (repeated indices add up). Backward:
//!   `dx[.., j, ..] += dout[.., idx[j], ..]`.

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::Var;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

/// `shape` with dimension `ax` set to `len`, or the error naming `r`'s op.
fn with_len<T: Float>(r: &Rec<'_, '_, T>, shape: Shape, ax: usize, len: usize) -> Result<Shape> {
    let mut d = shape.to_array();
    d[ax] = len;
    r.shape_of(shape, &d[..shape.rank()])
}

impl<'s, T: Float> Var<'s, T> {
    /// Pads with `before` zeros in front and `after` zeros behind along `axis`, the
    /// adjoint of [`narrow`](Var::narrow): `x.pad_axis(a, s, n − s − len)` puts back what
    /// `narrow(a, s, len)` took out of a length-`n` axis.
    ///
    /// Gradient: `dx = dout.narrow(axis, before, len)`.
    ///
    /// # Errors
    /// [`Error::BadAxis`] or [`Error::InvalidShape`] if the padded length overflows (recorded).
    #[track_caller]
    pub fn pad_axis(self, axis: isize, before: usize, after: usize) -> Var<'s, T> {
        self.core.record(OpKind::Pad, |r| {
            let sx = r.shape(self.id);
            let ax = r.axis(sx, axis)?;
            let Some(total) = sx.dim(ax).checked_add(before).and_then(|t| t.checked_add(after)) else {
                return Err(r.invalid(format!("padding {before} + {after} overflows axis {ax} of {sx}")));
            };
            if u32::try_from(before).is_err() {
                return Err(r.invalid(format!("padding {before} before axis {ax} of {sx} must be below 2^32")));
            }
            pad_record(r, self.id, ax, before, total)
        })
    }

    /// `pad_axis` for an axis already resolved, placing `self` at `start` in a length-`len`
    /// axis (the recorded derivative of `narrow`, whose arguments were checked).
    #[track_caller]
    pub(crate) fn pad_at(self, ax: usize, start: usize, len: usize) -> Var<'s, T> {
        self.core.record(OpKind::Pad, |r| pad_record(r, self.id, ax, start, len))
    }

    /// Adds slices of `self` into zeros of length `len` along `axis`, at `indices`:
    /// `out[.., indices[j], ..] += x[.., j, ..]`. The adjoint of
    /// [`index_select`](Var::index_select) (an embedding's gradient); repeated indices add up.
    ///
    /// Gradient: `dx = dout.index_select(axis, indices)`.
    ///
    /// # Errors
    /// [`Error::BadAxis`], [`Error::InvalidShape`] unless `indices.len()` equals the size
    /// of `axis`, [`Error::IndexOutOfRange`] for an index `≥ len` (recorded).
    #[track_caller]
    pub fn scatter_add(self, axis: isize, indices: &[usize], len: usize) -> Var<'s, T> {
        self.core.record(OpKind::ScatterAdd, |r| {
            let sx = r.shape(self.id);
            let ax = r.axis(sx, axis)?;
            if indices.len() != sx.dim(ax) {
                return Err(Error::InvalidShape {
                    op: r.op,
                    shape: sx,
                    detail: format!("{} indices for axis {ax} of size {}", indices.len(), sx.dim(ax)),
                    location: r.location,
                });
            }
            if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
                let shape = with_len(r, sx, ax, len)?;
                return Err(Error::IndexOutOfRange { op: r.op, index: bad, len, shape, location: r.location });
            }
            let at = r.extra(indices.iter().map(|&i| i as u32))?;
            scatter_record(r, self.id, ax, at, len)
        })
    }

    /// `scatter_add` with the indices the tape stored at `idx` (the recorded derivative of
    /// `index_select`, whose indices were checked).
    #[track_caller]
    pub(crate) fn scatter_add_at(self, ax: usize, idx: u32, len: usize) -> Var<'s, T> {
        self.core.record(OpKind::ScatterAdd, |r| scatter_record(r, self.id, ax, idx, len))
    }

    /// `index_select` with the indices the tape stored at `idx` (`k` of them): the
    /// recorded derivative of `scatter_add`.
    #[track_caller]
    pub(crate) fn index_select_at(self, ax: usize, idx: u32, k: usize) -> Var<'s, T> {
        self.core.record(OpKind::IndexSelect, |r| {
            let sx = r.shape(self.id);
            let so = with_len(r, sx, ax, k)?;
            let (outer, len, inner) = sx.split_at_axis(ax);
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            let indices = &r.tape.extra[idx as usize..idx as usize + k];
            for o in 0..outer {
                for (j, &i) in indices.iter().enumerate() {
                    let src = (o * len + i as usize) * inner;
                    out[(o * k + j) * inner..(o * k + j + 1) * inner].copy_from_slice(&x[src..src + inner]);
                }
            }
            Ok((Op::IndexSelect { x: self.id, axis: ax as u8, idx }, so, &*out))
        })
    }
}

fn pad_record<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    x: NodeId<'s>,
    ax: usize,
    start: usize,
    total: usize,
) -> Result<(Op<'s, T>, Shape, &'s [T])> {
    let sx = r.shape(x);
    let so = with_len(r, sx, ax, total)?;
    let (outer, len, inner) = sx.split_at_axis(ax);
    let xv = r.value(x);
    let out = r.alloc(so.numel())?;
    for o in 0..outer {
        let dst = (o * total + start) * inner;
        out[dst..dst + len * inner].copy_from_slice(&xv[o * len * inner..(o + 1) * len * inner]);
    }
    Ok((Op::Pad { x, axis: ax as u8, start: start as u32 }, so, out))
}

fn scatter_record<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    x: NodeId<'s>,
    ax: usize,
    idx: u32,
    len: usize,
) -> Result<(Op<'s, T>, Shape, &'s [T])> {
    let sx = r.shape(x);
    let so = with_len(r, sx, ax, len)?;
    let (outer, k, inner) = sx.split_at_axis(ax);
    let xv = r.value(x);
    let out = r.alloc(so.numel())?;
    let indices = &r.tape.extra[idx as usize..idx as usize + k];
    for o in 0..outer {
        for (j, &i) in indices.iter().enumerate() {
            let dst = (o * len + i as usize) * inner;
            kernels::add_assign(&mut out[dst..dst + inner], &xv[(o * k + j) * inner..(o * k + j + 1) * inner]);
        }
    }
    Ok((Op::ScatterAdd { x, axis: ax as u8, idx }, so, out))
}

/// `dx += dout[.., start .. start + len, ..]`.
#[inline(never)]
pub(crate) fn backward_pad<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    let (outer, len, inner) = sx.split_at_axis(axis as usize);
    let total = so.dim(axis as usize);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        for o in 0..outer {
            let src = (o * total + start as usize) * inner;
            kernels::add_assign(&mut dx[o * len * inner..(o + 1) * len * inner], &dout[src..src + len * inner]);
        }
    }
    Ok(())
}

/// `dx[.., j, ..] += dout[.., idx[j], ..]`.
#[inline(never)]
pub(crate) fn backward_scatter_add<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    let (outer, k, inner) = sx.split_at_axis(axis as usize);
    let len = so.dim(axis as usize);
    let indices = ctx.extra(idx, k);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        for o in 0..outer {
            for (j, &i) in indices.iter().enumerate() {
                let src = (o * len + i as usize) * inner;
                kernels::add_assign(&mut dx[(o * k + j) * inner..(o * k + j + 1) * inner], &dout[src..src + inner]);
            }
        }
    }
    Ok(())
}

/// Recorded derivative of `pad_axis`: `g.narrow(axis, start, len)`.
#[track_caller]
pub(crate) fn grad_pad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let len = ctx.shape(x).dim(axis as usize);
        ctx.add(x, g.narrow(axis as isize, start as usize, len));
    }
    Ok(())
}

/// Recorded derivative of `scatter_add`: `g.index_select(axis, idx)` with the stored indices.
#[track_caller]
pub(crate) fn grad_scatter_add<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let k = ctx.shape(x).dim(axis as usize);
        ctx.add(x, g.index_select_at(axis as usize, idx, k));
    }
    Ok(())
}

/// Forward rule of `pad_axis`: the tangent padded alike (the op is linear).
#[track_caller]
pub(crate) fn jvp_pad<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    start: u32,
) -> Result<Option<Var<'s, T>>> {
    let len = ctx.shape(out).dim(axis as usize);
    Ok(ctx.tangent(x).map(|t| t.pad_at(axis as usize, start as usize, len)))
}

/// Forward rule of `scatter_add`: the tangent scattered with the stored indices.
#[track_caller]
pub(crate) fn jvp_scatter_add<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<Option<Var<'s, T>>> {
    let len = ctx.shape(out).dim(axis as usize);
    Ok(ctx.tangent(x).map(|t| t.scatter_add_at(axis as usize, idx, len)))
}
