//! Selection ops: `concat`, `stack`, `index_select` (embedding lookup), `where_`, and the
//! non-differentiable comparisons `gt`, `ge`, `lt`, `le`, `equal`.
//!
//! Backward moves `dout` back to where each element came from:
//! - `concat`: each input gets its block of `dout`;
//! - `index_select(axis, idx)`: `dx[.., idx[j], ..] += dout[.., j, ..]` (repeated indices add up);
//! - `where_(cond, a, b)`: `da += dout` where `cond ≠ 0`, `db += dout` elsewhere.

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::{Core, Scope, Var};

use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

impl<'s, T: Float> Var<'s, T> {
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
        where_ids(&self.core, cond.id, a.id, b.id)
    }
}

/// `where_` of three nodes, recorded on `core`.
#[track_caller]
fn where_ids<'s, T: Float>(core: &'s Core<'s, T>, cond: NodeId<'s>, a: NodeId<'s>, b: NodeId<'s>) -> Var<'s, T> {
    {
        core.record(OpKind::Where, |r| {
            let (sc, sa, sb) = (r.shape(cond), r.shape(a), r.shape(b));
            let Some(so) = sc.broadcast(&sa).and_then(|s| s.broadcast(&sb)) else {
                let (lhs, rhs) = if sc.broadcast(&sa).is_none() { (sc, sa) } else { (sa, sb) };
                return Err(Error::Broadcast { op: r.op, lhs, rhs, location: r.location });
            };
            let (c, va, vb) = (r.value(cond), r.value(a), r.value(b));
            let out = r.alloc(so.numel())?;
            let strides = [&sc.broadcast_strides(&so), &sa.broadcast_strides(&so), &sb.broadcast_strides(&so)];
            kernels::for_each_n(&so, strides, |o, [ic, ia, ib]| {
                out[o] = if c[ic] != T::ZERO { va[ia] } else { vb[ib] }
            });
            Ok((Op::Where { cond, a, b }, so, out))
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

#[inline(never)]
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

#[inline(never)]
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

#[inline(never)]
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

/// Forward rule of `concat`: the inputs' tangents (zeros where an input has none)
/// concatenated alike.
#[track_caller]
pub(crate) fn jvp_concat<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    first: u32,
    count: u32,
    axis: u8,
) -> Result<Option<Var<'s, T>>> {
    if !(0..count).any(|k| ctx.tangent(ctx.stored_id(first, k)).is_some()) {
        return Ok(None);
    }
    let location = std::panic::Location::caller();
    // The tangents' ids go to the payload list, where concat reads its inputs (as `stack`).
    let at = ctx.core.tape.borrow().extra.len();
    for k in 0..count {
        let t = ctx.tangent_or_zeros(ctx.stored_id(first, k));
        ctx.core.store_id(t.id, "concat", location);
    }
    let t = ctx.core.record(OpKind::Concat, |r| {
        let at = u32::try_from(at).map_err(|_| Error::TapeFull { op: r.op, len: at, location: r.location })?;
        concat_stored(r, at, count as usize, axis as isize)
    });
    Ok(Some(t))
}

/// Forward rule of `index_select`: the same rows of the tangent.
#[track_caller]
pub(crate) fn jvp_index_select<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
    idx: u32,
) -> Result<Option<Var<'s, T>>> {
    let k = ctx.shape(out).dim(axis as usize);
    Ok(ctx.tangent(x).map(|t| t.index_select_at(axis as usize, idx, k)))
}

/// Forward rule of `where_`: the branches' tangents chosen by the same condition (zeros
/// for a branch without one); the condition has none.
#[track_caller]
pub(crate) fn jvp_where<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    cond: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    if ctx.tangent(a).is_none() && ctx.tangent(b).is_none() {
        return Ok(None);
    }
    let (ta, tb) = (ctx.tangent_or_zeros(a), ctx.tangent_or_zeros(b));
    Ok(Some(ctx.fit(out, where_ids(ctx.core, cond, ta.id, tb.id))))
}
