//! Losses, each the mean over the batch:
//!
//! - `cross_entropy(logits [N, C], labels)`: `L = (1/N) Σᵢ (lse(xᵢ) − xᵢ[yᵢ])`, fused and
//!   stable; `dx[i, c] += dout/N · (softmax(xᵢ)[c] − [c = yᵢ])`.
//! - `nll_loss(logp [N, C], labels)`: `L = −(1/N) Σᵢ logpᵢ[yᵢ]`; `dlogp[i, yᵢ] += −dout/N`.
//! - `bce_with_logits(x, y)`: `L = mean(max(x, 0) − x·y + ln(1 + e^−|x|))`, fused;
//!   `dx += dout/n · (σ(x) − y)`, `dy += dout/n · (−x)`.
//! - `mse_loss(a, b)`: `mean((a − b)²)`, composed from `sub`, `square` and `mean`.

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels::reduce::row_lse;
use crate::kernels::scalar::{sigmoid, softplus};
use crate::kernels::{par, simd};
use crate::record::ctx::{plus, BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::{Core, Var};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

/// Checks `x` is `[N, C]` and every label is below `C`; stores the labels; returns `(N, C, at)`.
fn labels_for<T: Float>(r: &mut Rec<'_, '_, T>, shape: Shape, labels: &[usize]) -> Result<(usize, usize, u32)> {
    if shape.rank() != 2 || shape.dim(0) != labels.len() {
        return Err(Error::InvalidShape {
            op: r.op,
            shape,
            detail: format!("needs input of shape [N, C] with N = {} labels", labels.len()),
            location: r.location,
        });
    }
    let c = shape.dim(1);
    if let Some(&bad) = labels.iter().find(|&&l| l >= c) {
        return Err(Error::IndexOutOfRange { op: r.op, index: bad, len: c, shape, location: r.location });
    }
    let at = r.extra(labels.iter().map(|&l| l as u32))?;
    Ok((labels.len(), c, at))
}

impl<'s, T: Float> Var<'s, T> {
    /// Softmax cross-entropy of logits `[N, C]` against integer class labels, averaged
    /// over the batch (PyTorch's `F.cross_entropy`).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] unless the input is `[N, C]` with `N = labels.len()`;
    /// [`Error::IndexOutOfRange`] for a label `≥ C` (both recorded).
    #[track_caller]
    pub fn cross_entropy(self, labels: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::CrossEntropy, |r| {
            let shape = r.shape(self.id);
            let (n, c, at) = labels_for(r, shape, labels)?;
            let x = r.value(self.id);
            let rows = |start: usize, end: usize| {
                simd::run(
                    (end - start) * c,
                    #[inline(always)]
                    || {
                        let mut total = T::ZERO;
                        for (i, &y) in labels.iter().enumerate().take(end).skip(start) {
                            let row = &x[i * c..(i + 1) * c];
                            total += row_lse(row) - row[y];
                        }
                        total
                    },
                )
            };
            // Large batches: per-chunk partial sums (rows per chunk fixed by the shape).
            let total = if x.len() < par::MIN_PARALLEL {
                rows(0, n)
            } else {
                par::sum_chunks(self.core.par, n, par::loss_rows(n, c), &rows)
            };
            let out = r.alloc_iter(std::iter::once(total / T::from_usize(n)))?;
            Ok((Op::CrossEntropy { logits: self.id, labels: at }, Shape::scalar(), out))
        })
    }

    /// Negative log-likelihood of log-probabilities `[N, C]` at the labels, averaged.
    ///
    /// # Errors
    /// As [`cross_entropy`](Var::cross_entropy).
    #[track_caller]
    pub fn nll_loss(self, labels: &[usize]) -> Var<'s, T> {
        self.core.record(OpKind::NllLoss, |r| {
            let shape = r.shape(self.id);
            let (n, c, at) = labels_for(r, shape, labels)?;
            let x = r.value(self.id);
            let total: T = labels.iter().enumerate().map(|(i, &y)| x[i * c + y]).sum();
            let out = r.alloc_iter(std::iter::once(-total / T::from_usize(n)))?;
            Ok((Op::NllLoss { logp: self.id, labels: at }, Shape::scalar(), out))
        })
    }

    /// Binary cross-entropy of logits `self` against targets `y` in `[0, 1]` (same
    /// shape), averaged, computed stably (PyTorch's `binary_cross_entropy_with_logits`).
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] (recorded) if the shapes differ.
    #[track_caller]
    pub fn bce_with_logits(self, y: Var<'s, T>) -> Var<'s, T> {
        self.core.record(OpKind::BceWithLogits, |r| {
            let (sx, sy) = (r.shape(self.id), r.shape(y.id));
            if sx != sy {
                return Err(Error::ShapeMismatch { op: r.op, lhs: sx, rhs: sy, location: r.location });
            }
            let (x, t) = (r.value(self.id), r.value(y.id));
            let part =
                |s: usize, e: usize| -> T { x[s..e].iter().zip(&t[s..e]).map(|(&x, &t)| softplus(x) - x * t).sum() };
            let total = if x.len() < par::MIN_PARALLEL {
                part(0, x.len())
            } else {
                par::sum_chunks(self.core.par, x.len(), par::loss_rows(x.len(), 1), &part)
            };
            // The mean of nothing is NaN, as for `mean`.
            let out = r.alloc_iter(std::iter::once(total / T::from_usize(sx.numel())))?;
            Ok((Op::BceWithLogits { x: self.id, y: y.id }, Shape::scalar(), out))
        })
    }

    /// Mean squared error `mean((self − target)²)`; shapes broadcast.
    #[track_caller]
    pub fn mse_loss(self, target: Var<'s, T>) -> Var<'s, T> {
        let _name = self.core.composite("mse_loss");
        (self - target).square().mean()
    }
}

// Out of line: its `exp` is the inlined polynomial, and the walk's dispatcher must stay
// small (shape-[1] backward of every op pays for its size).
#[inline(never)]
pub(crate) fn backward_cross_entropy<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    logits: NodeId<'s>,
    labels: u32,
) -> Result<()> {
    let shape = ctx.shape(logits);
    let (n, c) = (shape.dim(0), shape.dim(1));
    let labels = ctx.extra(labels, n);
    let (x, threads) = (ctx.value(logits), ctx.par);
    if let Some((dout, dx)) = ctx.grad_pair(out, logits)? {
        let scale = dout[0] / T::from_usize(n);
        // Rows are independent: a large batch is split by rows over the threads.
        let rows = |start: usize, dx: &mut [T]| {
            let i0 = start / c.max(1);
            simd::run(
                dx.len(),
                #[inline(always)]
                || {
                    for (k, drow) in dx.chunks_exact_mut(c).enumerate() {
                        let i = i0 + k;
                        let row = &x[i * c..(i + 1) * c];
                        let lse = row_lse(row);
                        for (d, &v) in drow.iter_mut().zip(row) {
                            *d += scale * (v - lse).exp();
                        }
                        drow[labels[i] as usize] -= scale;
                    }
                },
            )
        };
        if x.len() < par::MIN_PARALLEL || c == 0 {
            rows(0, dx);
        } else {
            par::for_chunks(par::threads(threads), dx, par::loss_rows(n, c) * c, &rows);
        }
    }
    Ok(())
}

pub(crate) fn backward_nll<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    logp: NodeId<'s>,
    labels: u32,
) -> Result<()> {
    let shape = ctx.shape(logp);
    let (n, c) = (shape.dim(0), shape.dim(1));
    let labels = ctx.extra(labels, n);
    if let Some((dout, dx)) = ctx.grad_pair(out, logp)? {
        let scale = dout[0] / T::from_usize(n);
        for (i, &y) in labels.iter().enumerate() {
            dx[i * c + y as usize] -= scale;
        }
    }
    Ok(())
}

pub(crate) fn backward_bce<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    y: NodeId<'s>,
) -> Result<()> {
    let (xv, yv, threads) = (ctx.value(x), ctx.value(y), ctx.par);
    let n = T::from_usize(xv.len());
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        let g = dout[0] / n;
        let part = |s: usize, dx: &mut [T]| {
            for (d, (&xi, &yi)) in dx.iter_mut().zip(xv[s..].iter().zip(&yv[s..])) {
                *d += g * (sigmoid(xi) - yi);
            }
        };
        if xv.len() < par::MIN_PARALLEL {
            part(0, dx);
        } else {
            par::for_chunks(par::threads(threads), dx, par::CHUNK, &part);
        }
    }
    if let Some((dout, dy)) = ctx.grad_pair(out, y)? {
        par::axpy(threads, dy, -(dout[0] / n), xv);
    }
    Ok(())
}

/// The one-hot rows of the `n` labels stored at `labels`, as a constant `[n, c]`.
#[track_caller]
fn one_hot<'s, T: Float>(core: &'s Core<'s, T>, name: &'static str, shape: Shape, labels: u32) -> Var<'s, T> {
    let (n, c) = (shape.dim(0), shape.dim(1));
    core.constant(name, shape, |tape, m| {
        for (i, &y) in tape.extra[labels as usize..labels as usize + n].iter().enumerate() {
            m[i * c + y as usize] = T::ONE;
        }
    })
}

/// Recorded derivative of `cross_entropy`: `dx = (softmax(x) − onehot) ⊙ g/N`.
#[track_caller]
pub(crate) fn grad_cross_entropy<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    logits: NodeId<'s>,
    labels: u32,
) -> Result<()> {
    if ctx.wants(logits) {
        let shape = ctx.shape(logits);
        let hot = one_hot(ctx.core, "grad", shape, labels);
        let scale = g.mul_scalar(T::ONE / T::from_usize(shape.dim(0)));
        ctx.add(logits, (ctx.var(logits).softmax(1) - hot) * scale);
    }
    Ok(())
}

/// Recorded derivative of `nll_loss`: `dlogp = −onehot ⊙ g/N` (linear in `g`).
#[track_caller]
pub(crate) fn grad_nll<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    logp: NodeId<'s>,
    labels: u32,
) -> Result<()> {
    if ctx.wants(logp) {
        let shape = ctx.shape(logp);
        let hot = one_hot(ctx.core, "grad", shape, labels);
        ctx.add(logp, hot * g.mul_scalar(-T::ONE / T::from_usize(shape.dim(0))));
    }
    Ok(())
}

/// Recorded derivative of `bce_with_logits`: `dx = (σ(x) − y) ⊙ g/n`, `dy = −x ⊙ g/n`.
#[track_caller]
pub(crate) fn grad_bce<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    y: NodeId<'s>,
) -> Result<()> {
    let (xv, yv) = (ctx.var(x), ctx.var(y));
    let scale = g.mul_scalar(T::ONE / T::from_usize(ctx.shape(x).numel()));
    if ctx.wants(x) {
        ctx.add(x, (xv.sigmoid() - yv) * scale);
    }
    if ctx.wants(y) {
        ctx.add(y, -(xv * scale));
    }
    Ok(())
}

/// Forward rule of `cross_entropy`: `(Σ softmax(x) ⊙ t − Σ onehot ⊙ t)/N`.
#[track_caller]
pub(crate) fn jvp_cross_entropy<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    logits: NodeId<'s>,
    labels: u32,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(logits) else { return Ok(None) };
    let shape = ctx.shape(logits);
    let hot = one_hot(ctx.core, "jvp", shape, labels);
    let n = T::ONE / T::from_usize(shape.dim(0));
    Ok(Some(ctx.fit(out, ((ctx.var(logits).softmax(1) - hot) * t).sum().mul_scalar(n))))
}

/// Forward rule of `nll_loss`: `−Σ onehot ⊙ t / N`.
#[track_caller]
pub(crate) fn jvp_nll<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    logp: NodeId<'s>,
    labels: u32,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(logp) else { return Ok(None) };
    let shape = ctx.shape(logp);
    let hot = one_hot(ctx.core, "jvp", shape, labels);
    Ok(Some(ctx.fit(out, (hot * t).sum().mul_scalar(-T::ONE / T::from_usize(shape.dim(0))))))
}

/// Forward rule of `bce_with_logits`: `Σ ((σ(x) − y) ⊙ tx − x ⊙ ty)/n`.
#[track_caller]
pub(crate) fn jvp_bce<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    y: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    let (xv, yv) = (ctx.var(x), ctx.var(y));
    let terms = plus(ctx.tangent(x).map(|t| (xv.sigmoid() - yv) * t), ctx.tangent(y).map(|t| -(xv * t)));
    let n = T::ONE / T::from_usize(ctx.shape(x).numel());
    Ok(terms.map(|t| ctx.fit(out, t.sum().mul_scalar(n))))
}
