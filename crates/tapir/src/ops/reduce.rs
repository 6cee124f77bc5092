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

use crate::error::{Error, Result};
use crate::graph::backward::BackwardCtx;
use crate::graph::scope::resolve_axis;
use crate::graph::{NodeId, Var};
use crate::kernels;
use crate::ops::Op;
use crate::shape::Shape;
use crate::Float;

impl<'s, T: Float> Var<'s, T> {
    /// Sum of all elements (shape `[]`).
    #[track_caller]
    pub fn sum(self) -> Var<'s, T> {
        self.core.record("sum", |r| {
            let out = r.alloc_iter(std::iter::once(kernels::sum(r.value(self.id))))?;
            Ok((Op::Sum { x: self.id }, Shape::scalar(), out))
        })
    }

    /// Mean of all elements (shape `[]`; NaN for an empty tensor, as in PyTorch).
    #[track_caller]
    pub fn mean(self) -> Var<'s, T> {
        let n = self.shape().numel();
        self.sum().mul_scalar(T::ONE / T::from_usize(n))
    }

    #[track_caller]
    fn axis_op(self, name: &'static str, axis: isize, op: fn(NodeId<'s>, u8) -> Op<'s, T>) -> Var<'s, T> {
        self.core.record(name, |r| {
            let shape = r.shape(self.id);
            let ax = r.axis(shape, axis)?;
            let dims = shape.split_at_axis(ax);
            let out_shape = shape.with_dim(ax, 1).expect("a smaller dimension cannot overflow");
            let x = r.value(self.id);
            let kind = op(self.id, ax as u8);
            if dims.1 == 0 && !matches!(kind, Op::SumAxis { .. }) {
                return Err(Error::InvalidShape {
                    op: name,
                    shape,
                    detail: format!("cannot reduce over axis {axis}, which has size 0"),
                    location: r.location,
                });
            }
            let out = r.alloc(out_shape.numel())?;
            match kind {
                Op::SumAxis { .. } => kernels::sum_axis(x, dims, out),
                Op::MaxAxis { .. } => kernels::select_axis(x, dims, out, |v, best| v > best || v.is_nan()),
                Op::MinAxis { .. } => kernels::select_axis(x, dims, out, |v, best| v < best || v.is_nan()),
                _ => kernels::logsumexp_axis(x, dims, out),
            }
            Ok((kind, out_shape, out))
        })
    }

    /// Applies a one-axis reduction to each of `axes`, then drops them unless `keepdim`.
    #[track_caller]
    fn reduce_axes(
        self,
        name: &'static str,
        axes: &[isize],
        keepdim: bool,
        op: fn(NodeId<'s>, u8) -> Op<'s, T>,
    ) -> Var<'s, T> {
        let shape = self.shape();
        let mut resolved = [false; crate::shape::MAX_RANK];
        for &a in axes {
            match resolve_axis(shape.rank(), a) {
                Some(ax) => resolved[ax] = true,
                None => {
                    return self.core.fail(Error::BadAxis {
                        op: name,
                        axis: a,
                        shape,
                        location: std::panic::Location::caller(),
                    });
                }
            }
        }
        let mut v = self;
        for ax in (0..shape.rank()).filter(|&ax| resolved[ax]) {
            v = v.axis_op(name, ax as isize, op);
        }
        if keepdim {
            return v;
        }
        let mut dims = [0usize; crate::shape::MAX_RANK];
        let mut kept = 0;
        for ax in (0..shape.rank()).filter(|&ax| !resolved[ax]) {
            dims[kept] = shape.dim(ax);
            kept += 1;
        }
        v.reshape(&dims[..kept])
    }

    /// Sum over `axes` (negative counts from the end); keeps them as size 1 if `keepdim`.
    #[track_caller]
    pub fn sum_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes("sum", axes, keepdim, |x, axis| Op::SumAxis { x, axis })
    }

    /// Mean over `axes`.
    #[track_caller]
    pub fn mean_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        let shape = self.shape();
        let n: usize = axes.iter().filter_map(|&a| resolve_axis(shape.rank(), a)).map(|a| shape.dim(a)).product();
        self.sum_axes(axes, keepdim).mul_scalar(T::ONE / T::from_usize(n))
    }

    /// Maximum over `axes`; the gradient goes to the first maximal element.
    #[track_caller]
    pub fn max_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes("max", axes, keepdim, |x, axis| Op::MaxAxis { x, axis })
    }

    /// Minimum over `axes`; the gradient goes to the first minimal element.
    #[track_caller]
    pub fn min_axes(self, axes: &[isize], keepdim: bool) -> Var<'s, T> {
        self.reduce_axes("min", axes, keepdim, |x, axis| Op::MinAxis { x, axis })
    }

    /// Maximum of all elements (shape `[]`).
    #[track_caller]
    pub fn max(self) -> Var<'s, T> {
        let n = self.shape().numel();
        self.reshape(&[n]).max_axes(&[0], false)
    }

    /// Minimum of all elements (shape `[]`).
    #[track_caller]
    pub fn min(self) -> Var<'s, T> {
        let n = self.shape().numel();
        self.reshape(&[n]).min_axes(&[0], false)
    }

    /// `ln Σ exp(x)` along `axis`, computed stably.
    #[track_caller]
    pub fn logsumexp(self, axis: isize, keepdim: bool) -> Var<'s, T> {
        self.reduce_axes("logsumexp", &[axis], keepdim, |x, axis| Op::LogSumExp { x, axis })
    }

    /// Variance over `axes` with Bessel's `correction` (1 gives PyTorch's default, the
    /// unbiased estimate; 0 the population variance).
    #[track_caller]
    pub fn var(self, axes: &[isize], keepdim: bool, correction: usize) -> Var<'s, T> {
        let shape = self.shape();
        let n: usize = axes.iter().filter_map(|&a| resolve_axis(shape.rank(), a)).map(|a| shape.dim(a)).product();
        let centered = self - self.mean_axes(axes, true);
        let denom = T::from_usize(n.saturating_sub(correction));
        centered.square().sum_axes(axes, keepdim).mul_scalar(T::ONE / denom)
    }
}

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

pub(crate) fn backward_sum_axis<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    let dims = ctx.shape(x).split_at_axis(axis as usize);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::sum_axis_grad(dout, dims, dx);
    }
    Ok(())
}

pub(crate) fn backward_select_axis<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    axis: u8,
) -> Result<()> {
    let dims = ctx.shape(x).split_at_axis(axis as usize);
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        kernels::select_axis_grad(dout, xv, yv, dims, dx);
    }
    Ok(())
}

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
