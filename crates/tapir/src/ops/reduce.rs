//! Reductions: `sum`, `mean`, `max`, `min`, `logsumexp`, `var`, over everything or over
//! given axes, with `keepdim`.
//!
//! Primitives (with `dout` broadcast back along the reduced axis):
//! - `sum`: `out = Σ x`; `dx += dout`.
//! - `max`/`min` along an axis: `dx += dout` at the first selected element, 0 elsewhere.
//! - `logsumexp` along an axis: `out = m + ln Σ exp(x − m)`; `dx += dout ⊙ exp(x − out)`.
//!
//! Composites (gradients from the primitives): multi-axis reductions are one primitive
//! per axis; `mean = sum / n`; `var = Σ (x − mean)² / (n − correction)`.

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels::{self, par};
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx};
use crate::record::handles::{Core, Var};
use crate::shape::{resolve_axis, Shape, MAX_RANK};
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

impl<'s, T: Float> Var<'s, T> {
    /// Sum of all elements (shape `[]`).
    #[track_caller]
    pub fn sum(self) -> Var<'s, T> {
        self.core.record(OpKind::Sum, |r| {
            let out = r.alloc_iter(std::iter::once(par::sum(self.core.par, r.value(self.id))))?;
            Ok((Op::Sum { x: self.id }, Shape::scalar(), out))
        })
    }

    /// Mean of all elements (shape `[]`; NaN for an empty tensor, as in PyTorch).
    #[track_caller]
    pub fn mean(self) -> Var<'s, T> {
        let _name = self.core.composite("mean");
        let n = self.shape().numel();
        self.sum().mul_scalar(T::ONE / T::from_usize(n))
    }

    /// One primitive reduction of axis `ax` (already resolved), kept as size 1.
    #[track_caller]
    fn axis_op(self, kind: OpKind, ax: usize, op: fn(NodeId<'s>, u8) -> Op<'s, T>) -> Var<'s, T> {
        self.core.record(kind, |r| {
            let shape = r.shape(self.id);
            let dims = shape.split_at_axis(ax);
            let kind = op(self.id, ax as u8);
            if dims.1 == 0 && !matches!(kind, Op::SumAxis { .. }) {
                return Err(Error::InvalidShape {
                    op: r.op,
                    shape,
                    detail: format!("cannot reduce over axis {ax}, which has size 0"),
                    location: r.location,
                });
            }
            // Checked: a size-0 axis of a tensor whose other dimensions are huge becomes
            // size 1, and the product of the rest may not fit.
            let out_shape = r.shape_of(
                shape,
                &{
                    let mut d = shape.to_array();
                    d[ax] = 1;
                    d
                }[..shape.rank()],
            )?;
            let out = r.alloc(out_shape.numel())?;
            if out_shape.numel() > 0 && dims.1 > 0 {
                let x = r.value(self.id);
                match kind {
                    Op::SumAxis { .. } => par::sum_axis(self.core.par, x, dims, out),
                    Op::MaxAxis { .. } => kernels::reduce::select_axis(x, dims, out, |v, best| v > best || v.is_nan()),
                    Op::MinAxis { .. } => kernels::reduce::select_axis(x, dims, out, |v, best| v < best || v.is_nan()),
                    _ => kernels::reduce::logsumexp_axis(x, dims, out),
                }
            }
            Ok((kind, out_shape, out))
        })
    }

    /// Resolves `axes` against `shape`: a mask of the axes, or the error naming `op` (a bad
    /// axis, or one given twice: PyTorch's "dim appears multiple times").
    #[track_caller]
    fn resolve_axes(self, op: &'static str, axes: &[isize]) -> std::result::Result<[bool; MAX_RANK], Error> {
        let shape = self.shape();
        let location = std::panic::Location::caller();
        let op = self.core.op_name(op);
        let mut mask = [false; MAX_RANK];
        for &a in axes {
            let ax = resolve_axis(shape.rank(), a).ok_or(Error::BadAxis { op, axis: a, shape, location })?;
            if std::mem::replace(&mut mask[ax], true) {
                return Err(Error::InvalidArgument {
                    op,
                    detail: format!("axis {a} appears more than once in {axes:?} (input shape {shape})"),
                    location,
                });
            }
        }
        Ok(mask)
    }

    /// Applies a one-axis reduction to each of `axes`, then drops them unless `keepdim`.
    #[track_caller]
    fn reduce_axes(
        self,
        kind: OpKind,
        axes: &[isize],
        keepdim: bool,
        op: fn(NodeId<'s>, u8) -> Op<'s, T>,
    ) -> Var<'s, T> {
        let shape = self.shape();
        let mask = match self.resolve_axes(kind.name(), axes) {
            Ok(mask) => mask,
            Err(e) => return self.core.fail(e),
        };
        // Axes of nonzero size first: reducing a zero-size axis of an empty tensor to size 1
        // while huge axes remain could make an intermediate shape too large, although the
        // result (with those axes reduced too) is valid. For a nonempty tensor this is the
        // plain ascending order.
        let mut v = self;
        let nonzero_first = (0..shape.rank())
            .filter(|&ax| shape.dim(ax) != 0)
            .chain((0..shape.rank()).filter(|&ax| shape.dim(ax) == 0));
        for ax in nonzero_first.filter(|&ax| mask[ax]) {
            v = v.axis_op(kind, ax, op);
        }
        if keepdim {
            return v;
        }
        let mut dims = [0usize; MAX_RANK];
        let mut kept = 0;
        for ax in (0..shape.rank()).filter(|&ax| !mask[ax]) {
            dims[kept] = shape.dim(ax);
            kept += 1;
        }
        v.reshape(&dims[..kept])
    }

    /// The number of elements reduced over `axes` (1 if the axes are invalid: the
    /// reduction itself reports that).
    fn count_over(self, axes: &[isize]) -> usize {
        let shape = self.shape();
        let mut mask = [false; MAX_RANK];
        for &a in axes {
            if let Some(ax) = resolve_axis(shape.rank(), a) {
                mask[ax] = true;
            }
        }
        // Saturating: reduced axes of a shape with a zero elsewhere may multiply past
        // `usize` (the result is empty then, and the scale never meets an element).
        (0..shape.rank()).filter(|&ax| mask[ax]).fold(1usize, |n, ax| n.saturating_mul(shape.dim(ax)))
    }

    /// Sum over `axes` (negative counts from the end); keeps them as size 1 if `keepdim`.
    ///
    /// # Errors
    /// [`Error::BadAxis`] for an axis out of range, [`Error::InvalidArgument`] for an axis
    /// given twice (both recorded).
    #[track_caller]
    pub fn sum_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes(OpKind::SumAxis, axes, keepdim, |x, axis| Op::SumAxis { x, axis })
    }

    /// Mean over `axes`. Errors as for [`sum_axes`](Var::sum_axes).
    #[track_caller]
    pub fn mean_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        let _name = self.core.composite("mean_axes");
        let n = self.count_over(axes);
        self.sum_axes(axes, keepdim).mul_scalar(T::ONE / T::from_usize(n))
    }

    /// Maximum over `axes`; the gradient goes to the first maximal element (a NaN counts
    /// as maximal and propagates).
    #[track_caller]
    pub fn max_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes(OpKind::MaxAxis, axes, keepdim, |x, axis| Op::MaxAxis { x, axis })
    }

    /// Minimum over `axes`; the gradient goes to the first minimal element (a NaN counts
    /// as minimal and propagates).
    #[track_caller]
    pub fn min_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes(OpKind::MinAxis, axes, keepdim, |x, axis| Op::MinAxis { x, axis })
    }

    /// Maximum of all elements (shape `[]`).
    #[track_caller]
    pub fn max(self) -> Var<'s, T> {
        let _name = self.core.composite("max");
        let n = self.shape().numel();
        self.reshape(&[n]).max_axes(&[0], false)
    }

    /// Minimum of all elements (shape `[]`).
    #[track_caller]
    pub fn min(self) -> Var<'s, T> {
        let _name = self.core.composite("min");
        let n = self.shape().numel();
        self.reshape(&[n]).min_axes(&[0], false)
    }

    /// `ln Σ exp(x)` along `axis`, computed stably.
    #[track_caller]
    pub fn logsumexp(self, axis: isize, keepdim: bool) -> Var<'s, T> {
        self.reduce_axes(OpKind::LogSumExp, &[axis], keepdim, |x, axis| Op::LogSumExp { x, axis })
    }

    /// Variance over `axes` with Bessel's `correction` (1 gives PyTorch's default, the
    /// unbiased estimate; 0 the population variance). Errors as for [`sum_axes`](Var::sum_axes).
    #[track_caller]
    pub fn var(self, axes: &[isize], keepdim: bool, correction: usize) -> Var<'s, T> {
        let _name = self.core.composite("var");
        let n = self.count_over(axes);
        let centered = self - self.mean_axes(axes, true);
        let denom = T::from_usize(n.saturating_sub(correction));
        centered.square().sum_axes(axes, keepdim).mul_scalar(T::ONE / denom)
    }
}

#[inline(never)]
pub(crate) fn backward_sum<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
) -> Result<()> {
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        let d = dout[0];
        for g in dx.iter_mut() {
            *g += d;
        }
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_sum_axis<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    let (dims, threads) = (ctx.shape(x).split_at_axis(axis as usize), ctx.par);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        par::sum_axis_grad(threads, dout, dims, dx);
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_select_axis<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    let dims = ctx.shape(x).split_at_axis(axis as usize);
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::reduce::select_axis_grad(dout, xv, yv, dims, dx);
    }
    Ok(())
}

// Out of line: its `exp` is the inlined polynomial, and the walk's dispatcher must stay
// small (shape-[1] backward of every op pays for its size).
#[inline(never)]
pub(crate) fn backward_logsumexp<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    let (outer, len, inner) = ctx.shape(x).split_at_axis(axis as usize);
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        for o in 0..outer {
            for i in 0..inner {
                let (d, lse) = (dout[o * inner + i], yv[o * inner + i]);
                if !lse.is_finite() {
                    continue;
                }
                for l in 0..len {
                    let at = (o * len + l) * inner + i;
                    dx[at] += d * (xv[at] - lse).exp();
                }
            }
        }
    }
    Ok(())
}

/// Recorded derivative of `sum` and `sum_axes` (whose axis is kept as size 1): `g`
/// broadcast back to `x`'s shape, lazily (`GradCtx::add_broadcast`).
#[track_caller]
pub(crate) fn grad_sum<'s, T: Float>(ctx: &mut GradCtx<'_, 's, T>, g: Var<'s, T>, x: NodeId<'s>) -> Result<()> {
    if ctx.wants(x) {
        ctx.add_broadcast(x, g);
    }
    Ok(())
}

/// Recorded derivative of `max_axes`/`min_axes`: `g` broadcast back, times a constant
/// one-hot mask of the first selected element (second derivative 0 almost everywhere).
#[track_caller]
pub(crate) fn grad_select_axis<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    if ctx.wants(x) {
        let mask = selected(ctx.core, "grad", out, x, axis);
        ctx.add(x, g * mask);
    }
    Ok(())
}

/// A constant of `x`'s shape, 1 at the element `max_axes`/`min_axes` selected along
/// `axis` (the first, as the fast backward picks) and 0 elsewhere; recorded under `name`.
#[track_caller]
fn selected<'s, T: Float>(
    core: &'s Core<'s, T>,
    name: &'static str,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Var<'s, T> {
    {
        let sx = core.tape.borrow().shape(x);
        let dims = sx.split_at_axis(axis as usize);
        core.constant(name, sx, |tape, m| {
            let (xv, yv) = (tape.value(x), tape.value(out));
            let (outer, len, inner) = dims;
            for o in 0..outer {
                for i in 0..inner {
                    let target = yv[o * inner + i];
                    // The element the fast backward picks (`kernels::select_axis_grad`).
                    if let Some(l) = (0..len).find(|&l| {
                        let v = xv[(o * len + l) * inner + i];
                        v == target || (target.is_nan() && v.is_nan())
                    }) {
                        m[(o * len + l) * inner + i] = T::ONE;
                    }
                }
            }
        })
    }
}

/// Recorded derivative of `logsumexp`: `g ⊙ exp(x − out)` (the softmax), broadcast along the axis.
#[track_caller]
pub(crate) fn grad_logsumexp<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    x: NodeId<'s>,
) -> Result<()> {
    if ctx.wants(x) {
        let (xv, y) = (ctx.var(x), ctx.var(out));
        ctx.add(x, g * (xv - y).exp());
    }
    Ok(())
}

/// Forward rule of `sum` and `sum_axes` (one axis, kept): the tangent summed alike.
#[track_caller]
pub(crate) fn jvp_sum<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    x: NodeId<'s>,
    axis: Option<u8>,
) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).map(|t| match axis {
        None => t.sum(),
        Some(a) => t.sum_axes(&[a as isize], true),
    }))
}

/// Forward rule of `max_axes`/`min_axes`: the tangent at the element the op selected
/// (the first, as the backward picks), through the same constant mask.
#[track_caller]
pub(crate) fn jvp_select_axis<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).map(|t| (t * selected(ctx.core, "jvp", out, x, axis)).sum_axes(&[axis as isize], true)))
}

/// Forward rule of `logsumexp`: `Σ softmax(x) ⊙ t` along the axis.
#[track_caller]
pub(crate) fn jvp_logsumexp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).map(|t| (t * (ctx.var(x) - ctx.var(out)).exp()).sum_axes(&[axis as isize], true)))
}
