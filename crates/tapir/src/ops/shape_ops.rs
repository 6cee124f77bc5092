//! Shape ops: `reshape`, `squeeze`, `unsqueeze`, `permute`, `transpose`, `t`,
//! `broadcast_to`, `narrow`, `concat`, `stack`, `index_select` (embedding lookup),
//! `where_`, and the non-differentiable comparisons `gt`, `ge`, `lt`, `le`, `equal`.
//!
//! Backward moves `dout` back to where each element came from:
//! - `reshape`/`squeeze`/`unsqueeze`: `dx += dout` (the forward value aliases the input's,
//!   so these cost no copy);
//! - `permute`: `dx[perm p] += dout[p]`;
//! - `broadcast_to`: `dx += dout` summed over the broadcast dimensions;
//! - `narrow(axis, start, len)`: `dx[.., start + l, ..] += dout[.., l, ..]`;
//! - `concat`: each input gets its block of `dout`;
//! - `index_select(axis, idx)`: `dx[.., idx[j], ..] += dout[.., j, ..]` (repeated indices add up);
//! - `where_(cond, a, b)`: `da += dout` where `cond ≠ 0`, `db += dout` elsewhere.

use std::panic::Location;

use crate::error::{Error, Result};
use crate::graph::{NodeId, Scope, Var};
use crate::kernels;
use crate::ops::{Op, OpKind};
use crate::record::{BackwardCtx, GradCtx, Rec};
use crate::shape::{resolve_axis, MAX_RANK};
use crate::Float;

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
    #[track_caller]
    pub fn squeeze(self, axis: isize) -> Var<'s, T> {
        let _name = self.core.composite("squeeze");
        let shape = self.shape();
        match resolve_axis(shape.rank(), axis) {
            Some(ax) if shape.dim(ax) == 1 => {
                let kept = shape.without(ax);
                self.reshape(&kept.to_array()[..kept.rank()])
            }
            _ => {
                let location = Location::caller();
                self.core.fail_as("squeeze", |op| Error::BadAxis { op, axis, shape, location })
            }
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
            kernels::permute(r.value(self.id), &sx, axes, &so, out);
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

    /// Rows (or slices along `axis`) picked by `indices`, in order, repeats allowed:
    /// `out[.., j, ..] = x[.., indices[j], ..]`. With `axis = 0` this is an embedding lookup.
    ///
    /// # Errors
    /// [`Error::BadAxis`] or [`Error::IndexOutOfRange`] (recorded).
    #[track_caller]
    pub fn index_select(self, axis: isize, indices: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::IndexSelect, |r| {
            let sx = r.shape(self.id);
            let ax = r.axis(sx, axis)?;
            let len = sx.dim(ax);
            if let Some(&bad) = indices.iter().find(|&&i| i >= len) {
                return Err(Error::IndexOutOfRange { op: r.op, index: bad, len, shape: sx, location: r.location });
            }
            let so = r.shape_of(
                sx,
                &{
                    let mut d = sx.to_array();
                    d[ax] = indices.len();
                    d
                }[..sx.rank()],
            )?;
            let at = r.extra(indices.iter().map(|&i| i as u32))?;
            let (outer, _, inner) = sx.split_at_axis(ax);
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            let k = indices.len();
            for o in 0..outer {
                for (j, &i) in indices.iter().enumerate() {
                    let src = (o * len + i) * inner;
                    out[(o * k + j) * inner..(o * k + j + 1) * inner].copy_from_slice(&x[src..src + inner]);
                }
            }
            Ok((Op::IndexSelect { x: self.id, axis: ax as u8, idx: at }, so, out))
        })
    }

    #[track_caller]
    fn compare(self, other: Var<'s, T>, name: &'static str, f: impl Fn(T, T) -> bool) -> Var<'s, T> {
        self.core.record_as(name, |r| {
            let (sa, sb) = (r.shape(self.id), r.shape(other.id));
            let so = sa.broadcast(&sb).ok_or(Error::Broadcast { op: r.op, lhs: sa, rhs: sb, location: r.location })?;
            let out = r.alloc(so.numel())?;
            let one = |x, y| if f(x, y) { T::ONE } else { T::ZERO };
            kernels::binary((r.value(self.id), &sa), (r.value(other.id), &sb), (out, &so), one);
            Ok((Op::Leaf, so, out))
        })
    }

    /// `1` where `self > other`, else `0` (broadcasting; no gradient).
    #[track_caller]
    pub fn gt(self, other: Var<'s, T>) -> Var<'s, T> {
        self.compare(other, "gt", |x, y| x > y)
    }

    /// `1` where `self >= other`, else `0`.
    #[track_caller]
    pub fn ge(self, other: Var<'s, T>) -> Var<'s, T> {
        self.compare(other, "ge", |x, y| x >= y)
    }

    /// `1` where `self < other`, else `0`.
    #[track_caller]
    pub fn lt(self, other: Var<'s, T>) -> Var<'s, T> {
        self.compare(other, "lt", |x, y| x < y)
    }

    /// `1` where `self <= other`, else `0`.
    #[track_caller]
    pub fn le(self, other: Var<'s, T>) -> Var<'s, T> {
        self.compare(other, "le", |x, y| x <= y)
    }

    /// `1` where `self == other`, else `0`.
    #[track_caller]
    pub fn equal(self, other: Var<'s, T>) -> Var<'s, T> {
        self.compare(other, "equal", |x, y| x == y)
    }
}

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Joins `xs` along `axis`; all other dimensions must agree.
    ///
    /// # Errors
    /// [`Error::ShapeList`], [`Error::BadAxis`] or [`Error::InvalidArgument`] for an empty list (recorded).
    #[track_caller]
    pub fn concat(&'s self, xs: &[Var<'s, T>], axis: isize) -> Var<'s, T> {
        self.core.record(OpKind::Concat, |r| {
            let first = r.store_ids(xs.iter().map(|x| x.id))?;
            concat_stored(r, first, xs.len(), axis)
        })
    }

    /// Stacks equal-shaped `xs` along a new axis `axis`.
    #[track_caller]
    pub fn stack(&'s self, xs: &[Var<'s, T>], axis: isize) -> Var<'s, T> {
        let _name = self.core.composite("stack");
        // Each unsqueezed copy's id goes straight to the tape's payload list, where concat
        // reads its inputs: no list of handles is built on the heap.
        let first = self.core.tape.borrow().extra.len();
        for &x in xs {
            let u = x.unsqueeze(axis);
            self.core.store_id(u.id, "stack", std::panic::Location::caller());
        }
        self.core.record(OpKind::Concat, |r| {
            let first =
                u32::try_from(first).map_err(|_| Error::TapeFull { op: r.op, len: first, location: r.location })?;
            concat_stored(r, first, xs.len(), axis)
        })
    }

    /// `a` where `cond ≠ 0`, else `b`, all three broadcast together. `cond` gets no gradient.
    #[track_caller]
    pub fn where_(&'s self, cond: Var<'s, T>, a: Var<'s, T>, b: Var<'s, T>) -> Var<'s, T> {
        self.core.record(OpKind::Where, |r| {
            let (sc, sa, sb) = (r.shape(cond.id), r.shape(a.id), r.shape(b.id));
            let Some(so) = sc.broadcast(&sa).and_then(|s| s.broadcast(&sb)) else {
                let (lhs, rhs) = if sc.broadcast(&sa).is_none() { (sc, sa) } else { (sa, sb) };
                return Err(Error::Broadcast { op: r.op, lhs, rhs, location: r.location });
            };
            let (c, va, vb) = (r.value(cond.id), r.value(a.id), r.value(b.id));
            let out = r.alloc(so.numel())?;
            let strides = [&sc.broadcast_strides(&so), &sa.broadcast_strides(&so), &sb.broadcast_strides(&so)];
            kernels::for_each_n(&so, strides, |o, [ic, ia, ib]| {
                out[o] = if c[ic] != T::ZERO { va[ia] } else { vb[ib] }
            });
            Ok((Op::Where { cond: cond.id, a: a.id, b: b.id }, so, out))
        })
    }
}

/// Concatenates the `n` nodes whose ids are stored at `first` along `axis`.
fn concat_stored<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    first: u32,
    n: usize,
    axis: isize,
) -> Result<(Op<'s, T>, crate::shape::Shape, &'s [T])> {
    if n == 0 {
        return Err(r.invalid("needs at least one tensor, got an empty list".into()));
    }
    let count = u32::try_from(n).map_err(|_| r.invalid(format!("{n} inputs exceed the u32 limit")))?;
    let x0 = r.stored_ids(first, count).next().expect("n > 0 ids were stored");
    let s0 = r.shape(x0);
    let ax = r.axis(s0, axis)?;
    let mut total = 0usize;
    for x in r.stored_ids(first, count) {
        let s = r.shape(x);
        if s.rank() != s0.rank() || (0..s0.rank()).any(|d| d != ax && s.dim(d) != s0.dim(d)) {
            let shapes = r.stored_ids(first, count).map(|x| r.shape(x)).collect();
            return Err(Error::ShapeList { op: r.op, shapes, axis: ax, location: r.location });
        }
        total = total.saturating_add(s.dim(ax));
    }
    let so = r.shape_of(
        s0,
        &{
            let mut d = s0.to_array();
            d[ax] = total;
            d
        }[..s0.rank()],
    )?;
    let out = r.alloc(so.numel())?;
    let (outer, _, inner) = so.split_at_axis(ax);
    let mut offset = 0;
    for x in r.stored_ids(first, count) {
        let len = r.shape(x).dim(ax);
        let v = r.value(x);
        for o in 0..outer {
            let dst = (o * total + offset) * inner;
            out[dst..dst + len * inner].copy_from_slice(&v[o * len * inner..(o + 1) * len * inner]);
        }
        offset += len;
    }
    Ok((Op::Concat { first, count, axis: ax as u8 }, so, out))
}

/// `dx += dout`: the value is the input's, reshaped.
pub(crate) fn backward_reshape<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<()> {
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::add_assign(dx, dout);
    }
    Ok(())
}

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
        kernels::permute_grad(dout, &sx, &ax[..sx.rank()], &so, dx);
    }
    Ok(())
}

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

pub(crate) fn backward_concat<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    first: u32,
    count: u32,
    axis: u8,
) -> Result<()> {
    let so = ctx.shape(out);
    let (outer, total, inner) = so.split_at_axis(axis as usize);
    let mut offset = 0;
    for x in ctx.stored_ids(first, count) {
        let len = ctx.shape(x).dim(axis as usize);
        if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
            for o in 0..outer {
                let src = (o * total + offset) * inner;
                kernels::add_assign(&mut dx[o * len * inner..(o + 1) * len * inner], &dout[src..src + len * inner]);
            }
        }
        offset += len;
    }
    Ok(())
}

pub(crate) fn backward_index_select<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<()> {
    let (sx, so) = (ctx.shape(x), ctx.shape(out));
    let (outer, len, inner) = sx.split_at_axis(axis as usize);
    let k = so.dim(axis as usize);
    let indices = ctx.extra(idx, k);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        for o in 0..outer {
            for (j, &i) in indices.iter().enumerate() {
                let dst = (o * len + i as usize) * inner;
                kernels::add_assign(&mut dx[dst..dst + inner], &dout[(o * k + j) * inner..(o * k + j + 1) * inner]);
            }
        }
    }
    Ok(())
}

pub(crate) fn backward_where<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    cond: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let (so, sc) = (ctx.shape(out), ctx.shape(cond));
    let c = ctx.value(cond);
    for (input, take_if) in [(a, true), (b, false)] {
        let si = ctx.shape(input);
        if let Some((dout, dx)) = ctx.grad_pair(out, input)? {
            kernels::for_each2(&so, &sc.broadcast_strides(&so), &si.broadcast_strides(&so), |o, ic, ix| {
                if (c[ic] != T::ZERO) == take_if {
                    dx[ix] += dout[o];
                }
            });
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

/// Recorded derivative of `concat`: each input's block of `g`, by `narrow`.
#[track_caller]
pub(crate) fn grad_concat<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    first: u32,
    count: u32,
    axis: u8,
) -> Result<()> {
    let mut offset = 0;
    for k in 0..count {
        let x = ctx.stored_id(first, k);
        let len = ctx.shape(x).dim(axis as usize);
        if ctx.wants(x) {
            ctx.add(x, g.narrow(axis as isize, offset, len));
        }
        offset += len;
    }
    Ok(())
}

/// Recorded derivative of `index_select`: `g` scattered back and added up ([`Op::ScatterAdd`]),
/// reading the indices the op stored.
#[track_caller]
pub(crate) fn grad_index_select<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let len = ctx.shape(x).dim(axis as usize);
        ctx.add(x, g.scatter_add_at(axis as usize, idx, len));
    }
    Ok(())
}

/// Recorded derivative of `where_`: `g` times the condition (for `a`) or its complement (for
/// `b`) as constants, summed to each input's shape.
#[track_caller]
pub(crate) fn grad_where<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    cond: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let sc = ctx.shape(cond);
    for (input, take_if) in [(a, true), (b, false)] {
        if ctx.wants(input) {
            let m = ctx.constant(sc, |tape, out| {
                for (o, &c) in out.iter_mut().zip(tape.value(cond)) {
                    *o = if (c != T::ZERO) == take_if { T::ONE } else { T::ZERO };
                }
            });
            // `g` has the broadcast shape; the mask broadcasts to it.
            ctx.add_reduced(input, g * m);
        }
    }
    Ok(())
}
