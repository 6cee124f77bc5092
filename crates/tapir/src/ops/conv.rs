//! 2-D convolution building blocks on `[N, C, H, W]` tensors: `im2col`, `max_pool2d`,
//! `avg_pool2d`, and `conv2d` composed from `im2col` and `matmul`.
//!
//! A window has kernel `kh×kw`, stride `sh×sw` and zero padding `ph×pw`; the output has
//! `oh = (h + 2·ph − kh)/sh + 1` rows and `ow = (w + 2·pw − kw)/sw + 1` columns. Input
//! position `(i, j)` of output `(oi, oj)` and kernel offset `(a, b)` is
//! `i = oi·sh + a − ph`, `j = oj·sw + b − pw`; positions outside the input are padding.
//!
//! - `im2col(x) → cols [N, C·kh·kw, oh·ow]`:
//!   `cols[n, (c·kh + a)·kw + b, oi·ow + oj] = x[n, c, i, j]` (0 in the padding).
//!   Backward is col2im, the scatter-add of the same map: `dx[n, c, i, j] += dcols[...]`
//!   over every `(a, b, oi, oj)` that reads `(i, j)`.
//! - `max_pool2d(x) → [N, C, oh, ow]`: `out = max` of the window's positions inside the
//!   input (padding never wins). Backward: `dx[argmax] += dout`, the first maximal
//!   position in row-major window order (recomputed from `x`, which stays in the arena).
//! - `avg_pool2d(x) → [N, C, oh, ow]`: `out = (1/(kh·kw)) Σ window`, padding counted as
//!   zeros (PyTorch's `count_include_pad=True`). Backward: `dx[i, j] += dout/(kh·kw)` for
//!   each window position inside the input.
//! - `conv2d(x, w [O, C, kh, kw])`: `reshape(w, [O, C·kh·kw]) · im2col(x)`, reshaped to
//!   `[N, O, oh, ow]`; gradients come from `im2col` and `matmul`, so one GEMM per
//!   batch element does the work in both directions.
//!
//! - `col2im(cols, [H, W]) → [N, C, H, W]`: the adjoint of `im2col` (overlaps summed,
//!   padding dropped); backward is `im2col`. Each is the other's recorded derivative, and
//!   the poolings' recorded derivatives spread `g` over the windows and fold it back with
//!   `col2im` (max pooling through a constant mask of each window's first maximum).
//!
//! The six window numbers do not fit a 16-byte variant, so they live in the tape's `extra`
//! list as `[kh, kw, sh, sw, ph, pw]` and the variant keeps their offset.

use crate::error::{Error, Result};
use std::ops::Range;

use crate::dtype::Float;
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::{Core, Var};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};

/// The geometry of a sliding window over `[n, c, h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Window {
    n: usize,
    c: usize,
    h: usize,
    w: usize,
    kh: usize,
    kw: usize,
    sh: usize,
    sw: usize,
    ph: usize,
    pw: usize,
    oh: usize,
    ow: usize,
}

impl Window {
    /// The window over `x` of the given geometry, or `None` if it does not fit (checked
    /// when the op is recorded).
    fn new(x: Shape, [kh, kw, sh, sw, ph, pw]: [usize; 6]) -> Option<Window> {
        if x.rank() != 4 || kh == 0 || kw == 0 || sh == 0 || sw == 0 {
            return None;
        }
        let (n, c, h, w) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
        let oh = h.checked_add(ph.checked_mul(2)?)?.checked_sub(kh)? / sh + 1;
        let ow = w.checked_add(pw.checked_mul(2)?)?.checked_sub(kw)? / sw + 1;
        Some(Window { n, c, h, w, kh, kw, sh, sw, ph, pw, oh, ow })
    }

    /// Reads the geometry back from the tape's `extra` list.
    fn from_extra(x: Shape, g: &[u32]) -> Window {
        let p = |i: usize| g[i] as usize;
        Window::new(x, [p(0), p(1), p(2), p(3), p(4), p(5)]).expect("the window was checked when the op was recorded")
    }

    /// The kernel rows `a` whose input row `oi·sh + a − ph` lies inside the input: the
    /// window clipped to the input, so that a kernel far larger than the input costs no
    /// more than the input.
    #[inline]
    fn rows(&self, oi: usize) -> Range<usize> {
        clip(oi * self.sh, self.ph, self.h, self.kh)
    }

    /// As [`rows`](Window::rows) for kernel columns at output column `oj`.
    #[inline]
    fn cols(&self, oj: usize) -> Range<usize> {
        clip(oj * self.sw, self.pw, self.w, self.kw)
    }

    /// Calls `f(plane, o, i)` for every output position `o` of every `(n, c)` plane and
    /// every input position `i` of its window, both as flat indices, in row-major window order.
    #[inline]
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let (hw, ohw) = (self.h * self.w, self.oh * self.ow);
        for plane in 0..self.n * self.c {
            for oi in 0..self.oh {
                let rows = self.rows(oi);
                for oj in 0..self.ow {
                    let o = plane * ohw + oi * self.ow + oj;
                    let cols = self.cols(oj);
                    for a in rows.clone() {
                        let i = oi * self.sh + a - self.ph;
                        for b in cols.clone() {
                            f(plane, o, plane * hw + i * self.w + oj * self.sw + b - self.pw);
                        }
                    }
                }
            }
        }
    }

    /// Calls `f(col, x)` for every element of `im2col`'s output that reads the input, with
    /// the flat indices of the column element and of the input element it copies.
    #[inline]
    fn for_each_col(&self, mut f: impl FnMut(usize, usize)) {
        let (k, l) = (self.c * self.kh * self.kw, self.oh * self.ow);
        for n in 0..self.n {
            for c in 0..self.c {
                let plane = (n * self.c + c) * self.h * self.w;
                for oi in 0..self.oh {
                    for a in self.rows(oi) {
                        let i = oi * self.sh + a - self.ph;
                        for oj in 0..self.ow {
                            for b in self.cols(oj) {
                                let row = (n * k + (c * self.kh + a) * self.kw + b) * l;
                                f(row + oi * self.ow + oj, plane + i * self.w + oj * self.sw + b - self.pw);
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The kernel offsets `a` in `0..k` with `start + a − pad` in `0..len`.
#[inline]
fn clip(start: usize, pad: usize, len: usize, k: usize) -> Range<usize> {
    let lo = pad.saturating_sub(start).min(k);
    let hi = (len + pad).saturating_sub(start).min(k);
    lo..hi.max(lo)
}

/// Checks the window arguments of `op` on `x`; stores them in `extra`; returns the window
/// and the offset.
fn record_window<T: Float>(
    r: &mut Rec<'_, '_, T>,
    x: Shape,
    kernel: [usize; 2],
    stride: [usize; 2],
    padding: [usize; 2],
    pool: bool,
) -> Result<(Window, u32)> {
    if x.rank() != 4 {
        return Err(Error::InvalidShape {
            op: r.op,
            shape: x,
            detail: "needs a 4-D input [N, C, H, W]".into(),
            location: r.location,
        });
    }
    let g = [kernel[0], kernel[1], stride[0], stride[1], padding[0], padding[1]];
    if g.iter().any(|&v| u32::try_from(v).is_err()) {
        return Err(r.invalid(format!(
            "kernel {kernel:?}, stride {stride:?} and padding {padding:?} must each be below 2^32 (input shape {x})"
        )));
    }
    if kernel.contains(&0) || stride.contains(&0) {
        return Err(r.invalid(format!("kernel {kernel:?} and stride {stride:?} must be positive (input shape {x})")));
    }
    if pool && (padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2) {
        return Err(r.invalid(format!(
            "padding {padding:?} must be at most half the kernel {kernel:?}, so that no window is all padding (input shape {x})"
        )));
    }
    let Some(win) = Window::new(x, g) else {
        return Err(Error::InvalidShape {
            op: r.op,
            shape: x,
            detail: format!("kernel {kernel:?} does not fit the input padded by {padding:?}"),
            location: r.location,
        });
    };
    let at = r.extra(g.iter().map(|&v| v as u32))?;
    Ok((win, at))
}

impl<'s, T: Float> Var<'s, T> {
    /// Unfolds every `kh×kw` window of `x: [N, C, H, W]` into a column:
    /// `out: [N, C·kh·kw, oh·ow]` with `out[n, (c·kh + a)·kw + b, oi·ow + oj] =
    /// x[n, c, oi·sh + a − ph, oj·sw + b − pw]` (0 in the padding), where
    /// `oh = (H + 2·ph − kh)/sh + 1` and likewise `ow`. A weight `[O, C·kh·kw]` times
    /// this is a convolution (see [`conv2d`](Var::conv2d)).
    ///
    /// Gradient (col2im): `dx[n, c, i, j] += Σ dout` over the column entries that copied `x[n, c, i, j]`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) unless `x` is 4-D and the kernel fits the padded
    /// input; [`Error::InvalidArgument`] for a zero kernel or stride.
    #[track_caller]
    pub fn im2col(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.core.record(OpKind::Im2Col, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, kernel, stride, padding, false)?;
            // Saturating: an overflowing product is rejected by `shape_of`, not a panic.
            let k = win.c.saturating_mul(win.kh).saturating_mul(win.kw);
            let so = r.shape_of(sx, &[win.n, k, win.oh.saturating_mul(win.ow)])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            win.for_each_col(|o, i| out[o] = x[i]);
            Ok((Op::Im2Col { x: self.id, geom: at }, so, out))
        })
    }

    /// Folds columns `[N, C·kh·kw, oh·ow]` back onto an image `[N, C, H, W]` with
    /// `[H, W] = size`, summing where windows overlap: the adjoint of
    /// [`im2col`](Var::im2col) with the same kernel, stride and padding (entries that
    /// fall in the padding are dropped).
    ///
    /// Gradient: `dx = im2col(dout)`.
    ///
    /// # Errors
    /// As [`im2col`](Var::im2col) for the image shape, and [`Error::InvalidShape`]
    /// (recorded) unless the input is `[N, C·kh·kw, oh·ow]` for that image.
    #[track_caller]
    pub fn col2im(self, size: [usize; 2], kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.core.record(OpKind::Col2Im, |r| {
            let sx = r.shape(self.id);
            let kk = kernel[0].saturating_mul(kernel[1]);
            let (op, location) = (r.op, r.location);
            let bad = |detail: String| Error::InvalidShape { op, shape: sx, detail, location };
            if sx.rank() != 3 || kk == 0 || sx.dim(1) % kk != 0 {
                return Err(bad(format!("needs columns [N, C·{}·{}, L] for kernel {kernel:?}", kernel[0], kernel[1])));
            }
            let image = r.shape_of(sx, &[sx.dim(0), sx.dim(1) / kk, size[0], size[1]])?;
            let (win, at) = record_window(r, image, kernel, stride, padding, false)?;
            if win.oh.saturating_mul(win.ow) != sx.dim(2) {
                return Err(bad(format!(
                    "has {} columns but image {image} with kernel {kernel:?}, stride {stride:?}, padding {padding:?} has {}×{} windows",
                    sx.dim(2),
                    win.oh,
                    win.ow
                )));
            }
            col2im_record(r, self.id, image, at)
        })
    }

    /// `col2im` onto `image` with the geometry the tape stored at `geom` (the recorded
    /// derivative of `im2col`, whose arguments were checked).
    #[track_caller]
    pub(crate) fn col2im_at(self, image: Shape, geom: u32) -> Var<'s, T> {
        self.core.record(OpKind::Col2Im, |r| col2im_record(r, self.id, image, geom))
    }

    /// `im2col` with the geometry the tape stored at `geom` (the recorded derivative of `col2im`).
    #[track_caller]
    pub(crate) fn im2col_at(self, geom: u32) -> Var<'s, T> {
        self.core.record(OpKind::Im2Col, |r| {
            let sx = r.shape(self.id);
            let win = Window::from_extra(sx, &r.tape.extra[geom as usize..geom as usize + 6]);
            let so = r.shape_of(sx, &[win.n, win.c * win.kh * win.kw, win.oh * win.ow])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            win.for_each_col(|o, i| out[o] = x[i]);
            Ok((Op::Im2Col { x: self.id, geom }, so, &*out))
        })
    }

    /// Max pooling of `x: [N, C, H, W]` over `kh×kw` windows: `out: [N, C, oh, ow]`,
    /// each element the maximum of its window (padding is ignored, never the maximum).
    ///
    /// Gradient: `dout` flows to the first maximal element of each window.
    ///
    /// # Errors
    /// As [`im2col`](Var::im2col), and [`Error::InvalidArgument`] if the padding exceeds
    /// half the kernel.
    #[track_caller]
    pub fn max_pool2d(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.core.record(OpKind::MaxPool2d, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, kernel, stride, padding, true)?;
            let so = r.shape_of(sx, &[win.n, win.c, win.oh, win.ow])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            out.fill(T::neg_infinity());
            // A NaN in the window wins and stays (PyTorch).
            win.for_each_tap(|_, o, i| {
                if !out[o].is_nan() && (x[i] > out[o] || x[i].is_nan()) {
                    out[o] = x[i];
                }
            });
            Ok((Op::MaxPool2d { x: self.id, geom: at }, so, out))
        })
    }

    /// Average pooling of `x: [N, C, H, W]` over `kh×kw` windows: `out: [N, C, oh, ow]`,
    /// `out = (1/(kh·kw)) Σ window`, padding counting as zeros.
    ///
    /// Gradient: `dx += dout/(kh·kw)` at each window position inside the input.
    ///
    /// # Errors
    /// As [`max_pool2d`](Var::max_pool2d).
    #[track_caller]
    pub fn avg_pool2d(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.core.record(OpKind::AvgPool2d, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, kernel, stride, padding, true)?;
            let so = r.shape_of(sx, &[win.n, win.c, win.oh, win.ow])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            win.for_each_tap(|_, o, i| out[o] += x[i]);
            let scale = T::ONE / T::from_usize(win.kh * win.kw);
            out.iter_mut().for_each(|v| *v *= scale);
            Ok((Op::AvgPool2d { x: self.id, geom: at }, so, out))
        })
    }

    /// 2-D convolution (cross-correlation, as in PyTorch) of `x: [N, C, H, W]` with
    /// weights `w: [O, C, kh, kw]`: `out: [N, O, oh, ow]`,
    /// `out[n, o, oi, oj] = Σ_{c,a,b} w[o, c, a, b] · x[n, c, oi·sh + a − ph, oj·sw + b − pw]`.
    /// Composed as `reshape(w, [O, C·kh·kw]) · im2col(x)`, so gradients need no new code.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) unless `w` is 4-D with `C` input channels, and
    /// as [`im2col`](Var::im2col).
    #[track_caller]
    pub fn conv2d(self, w: Var<'s, T>, stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        let _name = self.core.composite("conv2d");
        let (sx, sw) = (self.shape(), w.shape());
        if sw.rank() != 4 || sx.rank() != 4 || sx.dim(1) != sw.dim(1) {
            let location = std::panic::Location::caller();
            return self.core.fail_as("conv2d", |op| Error::InvalidShape {
                op,
                shape: sx,
                detail: format!("needs input [N, C, H, W] and weights [O, C, kh, kw] with equal C, got weights {sw}"),
                location,
            });
        }
        let (o, c, kh, kw) = (sw.dim(0), sw.dim(1), sw.dim(2), sw.dim(3));
        let cols = self.im2col([kh, kw], stride, padding);
        // Saturating: with huge zero-size weights the product overflows; reshape then fails.
        let out = w.reshape(&[o, c.saturating_mul(kh).saturating_mul(kw)]).matmul(cols);
        match Window::new(sx, [kh, kw, stride[0], stride[1], padding[0], padding[1]]) {
            Some(win) => out.reshape(&[win.n, o, win.oh, win.ow]),
            // im2col has recorded the error already; this handle is poisoned.
            None => out,
        }
    }
}

#[inline(never)]
pub(crate) fn backward_im2col<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, 6));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        win.for_each_col(|o, i| dx[i] += dout[o]);
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_max_pool2d<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, 6));
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        // The first position equal to the window's maximum (the first NaN, for a NaN
        // maximum) gets the gradient. Taps come
        // window by window, so remembering the last window served is enough.
        let mut served = usize::MAX;
        win.for_each_tap(|_, o, i| {
            if served != o && (xv[i] == yv[o] || (xv[i].is_nan() && yv[o].is_nan())) {
                dx[i] += dout[o];
                served = o;
            }
        });
    }
    Ok(())
}

#[inline(never)]
pub(crate) fn backward_avg_pool2d<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, 6));
    let scale = T::ONE / T::from_usize(win.kh * win.kw);
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        win.for_each_tap(|_, o, i| dx[i] += dout[o] * scale);
    }
    Ok(())
}

fn col2im_record<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    x: NodeId<'s>,
    image: Shape,
    geom: u32,
) -> Result<(Op<'s, T>, Shape, &'s [T])> {
    let win = Window::from_extra(image, &r.tape.extra[geom as usize..geom as usize + 6]);
    let xv = r.value(x);
    let out = r.alloc(image.numel())?;
    win.for_each_col(|o, i| out[i] += xv[o]);
    Ok((Op::Col2Im { x, geom }, image, out))
}

/// `dx += im2col(dout)`.
#[inline(never)]
pub(crate) fn backward_col2im<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    let win = Window::from_extra(ctx.shape(out), ctx.extra(geom, 6));
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        win.for_each_col(|o, i| dx[o] += dout[i]);
    }
    Ok(())
}

/// Recorded derivative of `im2col`: `dx = col2im(g)`.
#[track_caller]
pub(crate) fn grad_im2col<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let image = ctx.shape(x);
        ctx.add(x, g.col2im_at(image, geom));
    }
    Ok(())
}

/// Recorded derivative of `col2im`: `dx = im2col(g)`.
#[track_caller]
pub(crate) fn grad_col2im<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    if ctx.wants(x) {
        ctx.add(x, g.im2col_at(geom));
    }
    Ok(())
}

/// A pooling's recorded derivative: `g` spread over each window's `kh·kw` taps
/// (`[N, C, kh·kw, oh·ow]`), weighted by `weights` (a constant of that shape, or `None`
/// for a uniform `scale`), folded back by `col2im`.
#[track_caller]
fn pool_grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    geom: u32,
    weights: Option<Var<'s, T>>,
    win: Window,
) {
    let (kk, l) = (win.kh * win.kw, win.oh * win.ow);
    let spread = g.reshape(&[win.n, win.c, 1, l]).broadcast_to(&[win.n, win.c, kk, l]);
    let weighted = match weights {
        Some(w) => spread * w,
        None => spread.mul_scalar(T::ONE / T::from_usize(kk)),
    };
    let image = ctx.shape(x);
    ctx.add(x, weighted.reshape(&[win.n, win.c * kk, l]).col2im_at(image, geom));
}

/// Recorded derivative of `max_pool2d`: `g` routed to each window's first maximal
/// element through a constant mask (second derivative 0 almost everywhere).
#[track_caller]
pub(crate) fn grad_max_pool2d<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let (mask, win) = first_maxima(ctx.core, "grad", out, x, geom);
        pool_grad(ctx, g, x, geom, Some(mask), win);
    }
    Ok(())
}

/// A constant `[N, C, kh·kw, oh·ow]` in `im2col`'s layout, 1 at each window's first
/// maximal element (the one the fast backward picks) and 0 elsewhere, recorded under
/// `name`; and the window.
#[track_caller]
fn first_maxima<'s, T: Float>(
    core: &'s Core<'s, T>,
    name: &'static str,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> (Var<'s, T>, Window) {
    let win = {
        let tape = core.tape.borrow();
        Window::from_extra(tape.shape(x), &tape.extra[geom as usize..geom as usize + 6])
    };
    let (kk, l) = (win.kh * win.kw, win.oh * win.ow);
    let mask_shape = Shape::new(&[win.n, win.c, kk, l]).expect("no larger than im2col's output, which fit");
    let mask = core.constant(name, mask_shape, |tape, m| {
        let (xv, yv) = (tape.value(x), tape.value(out));
        for plane in 0..win.n * win.c {
            for oi in 0..win.oh {
                for oj in 0..win.ow {
                    let o = oi * win.ow + oj;
                    let y = yv[plane * l + o];
                    'window: for a in win.rows(oi) {
                        for b in win.cols(oj) {
                            let i =
                                plane * win.h * win.w + (oi * win.sh + a - win.ph) * win.w + oj * win.sw + b - win.pw;
                            if xv[i] == y || (xv[i].is_nan() && y.is_nan()) {
                                m[(plane * kk + a * win.kw + b) * l + o] = T::ONE;
                                break 'window;
                            }
                        }
                    }
                }
            }
        }
    });
    (mask, win)
}

/// Recorded derivative of `avg_pool2d`: `g/(kh·kw)` spread over each window by `col2im`.
#[track_caller]
pub(crate) fn grad_avg_pool2d<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    if ctx.wants(x) {
        let sx = ctx.shape(x);
        let win = { Window::from_extra(sx, &ctx.core.tape.borrow().extra[geom as usize..geom as usize + 6]) };
        pool_grad(ctx, g, x, geom, None, win);
    }
    Ok(())
}

/// Forward rule of `im2col`: the tangent unfolded alike (the op is linear).
#[track_caller]
pub(crate) fn jvp_im2col<'s, T: Float>(ctx: &JvpCtx<'s, T>, x: NodeId<'s>, geom: u32) -> Result<Option<Var<'s, T>>> {
    Ok(ctx.tangent(x).map(|t| t.im2col_at(geom)))
}

/// Forward rule of `col2im`: the tangent folded alike.
#[track_caller]
pub(crate) fn jvp_col2im<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<Option<Var<'s, T>>> {
    let image = ctx.shape(out);
    Ok(ctx.tangent(x).map(|t| t.col2im_at(image, geom)))
}

/// The windows of `t` (of the pooled input's shape) as `[N, C, kh·kw, oh·ow]`.
#[track_caller]
fn windows<'s, T: Float>(ctx: &JvpCtx<'s, T>, out: NodeId<'s>, t: Var<'s, T>, geom: u32) -> (Var<'s, T>, usize) {
    let so = ctx.shape(out);
    let (n, c, l) = (so.dim(0), so.dim(1), so.dim(2) * so.dim(3));
    let cols = t.im2col_at(geom);
    let kk = cols.shape().dim(1) / c.max(1);
    (cols.reshape(&[n, c, kk, l]), kk)
}

/// Forward rule of `max_pool2d`: each window's tangent at its first maximum.
#[track_caller]
pub(crate) fn jvp_max_pool2d<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(x) else { return Ok(None) };
    let (mask, _) = first_maxima(ctx.core, "jvp", out, x, geom);
    let (cols, _) = windows(ctx, out, t, geom);
    let so = ctx.shape(out);
    Ok(Some((cols * mask).sum_axes(&[2], false).reshape(&so.to_array()[..4])))
}

/// Forward rule of `avg_pool2d`: the tangent averaged over the same windows.
#[track_caller]
pub(crate) fn jvp_avg_pool2d<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<Option<Var<'s, T>>> {
    let Some(t) = ctx.tangent(x) else { return Ok(None) };
    let (cols, kk) = windows(ctx, out, t, geom);
    let so = ctx.shape(out);
    Ok(Some(cols.sum_axes(&[2], false).mul_scalar(T::ONE / T::from_usize(kk)).reshape(&so.to_array()[..4])))
}
