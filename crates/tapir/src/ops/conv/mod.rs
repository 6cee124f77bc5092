//! 2-D convolution building blocks on `[N, C, H, W]` tensors: `im2col`, `max_pool2d`,
//! `avg_pool2d`, and `conv2d` composed from `im2col` and `matmul` (`conv2d.rs`).
//!
//! A window has kernel `kh×kw`, stride `sh×sw`, zero padding `ph×pw` and dilation
//! `dh×dw` (1 unless given); the output has `oh = (h + 2·ph − dh·(kh − 1) − 1)/sh + 1`
//! rows and likewise `ow` columns. Input position `(i, j)` of output `(oi, oj)` and
//! kernel offset `(a, b)` is `i = oi·sh + a·dh − ph`, `j = oj·sw + b·dw − pw`; positions
//! outside the input are padding. The geometry and its loops are in `window.rs`.
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
//!   each window position inside the input. Undilated, as PyTorch's.
//! - `conv2d(x, w [O, C/g, kh, kw])` with `g` groups: `reshape(w, [O, C·kh·kw]) · im2col(x)`
//!   for one group, reshaped to `[N, O, oh, ow]`; for `g` groups the columns and the
//!   weights are split into `g` blocks along their channels and multiplied block by block
//!   in one batched matmul. Gradients come from `im2col`, `reshape` and `matmul`.
//!
//! - `col2im(cols, [H, W]) → [N, C, H, W]`: the adjoint of `im2col` (overlaps summed,
//!   padding dropped); backward is `im2col`. Each is the other's recorded derivative, and
//!   the poolings' recorded derivatives spread `g` over the windows and fold it back with
//!   `col2im` (max pooling through a constant mask of each window's first maximum).
//!
//! The eight window numbers do not fit a 16-byte variant, so they live in the tape's
//! `extra` list as `[kh, kw, sh, sw, ph, pw, dh, dw]` and the variant keeps their offset.

pub(crate) mod conv2d;
mod pool;
mod window;

use faer::Par;

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::{Core, Var};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};
use window::{col2im_into, im2col_add, im2col_value, record_window, Args, Window, GEOM_LEN};

impl<'s, T: Float> Var<'s, T> {
    /// Unfolds every `kh×kw` window of `x: [N, C, H, W]` into a column:
    /// `out: [N, C·kh·kw, oh·ow]` with `out[n, (c·kh + a)·kw + b, oi·ow + oj] =
    /// x[n, c, oi·sh + a − ph, oj·sw + b − pw]` (0 in the padding), where
    /// `oh = (H + 2·ph − kh)/sh + 1` and likewise `ow`. A weight `[O, C·kh·kw]` times
    /// this is a convolution (see [`conv2d`](Var::conv2d)). PyTorch's `F.unfold`.
    ///
    /// Gradient (col2im): `dx[n, c, i, j] += Σ dout` over the column entries that copied `x[n, c, i, j]`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) unless `x` is 4-D and the kernel fits the padded
    /// input; [`Error::InvalidArgument`] for a zero kernel or stride.
    #[track_caller]
    pub fn im2col(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.im2col_args(Args { kernel, stride, padding, dilation: [1, 1] })
    }

    /// [`im2col`](Var::im2col) with the kernel's taps `dilation = [dh, dw]` apart:
    /// `out[n, (c·kh + a)·kw + b, oi·ow + oj] = x[n, c, oi·sh + a·dh − ph, oj·sw + b·dw − pw]`,
    /// `oh = (H + 2·ph − dh·(kh − 1) − 1)/sh + 1` and likewise `ow` (PyTorch's `F.unfold`
    /// with `dilation`). Dilation `[1, 1]` is `im2col`.
    ///
    /// Gradient: as `im2col`'s, over the dilated taps.
    ///
    /// # Errors
    /// As [`im2col`](Var::im2col), and [`Error::InvalidArgument`] for a zero dilation.
    #[track_caller]
    pub fn im2col_dilated(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Var<'s, T> {
        let _name = self.core.composite("im2col_dilated");
        self.im2col_args(Args { kernel, stride, padding, dilation })
    }

    #[track_caller]
    fn im2col_args(self, args: Args) -> Var<'s, T> {
        self.core.record(OpKind::Im2Col, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, args, false)?;
            // Saturating: an overflowing product is rejected by `shape_of`, not a panic.
            let k = win.c.saturating_mul(win.kh).saturating_mul(win.kw);
            let so = r.shape_of(sx, &[win.n, k, win.oh.saturating_mul(win.ow)])?;
            let out = im2col_value(r, &win, self.core.par, r.value(self.id), so.numel())?;
            Ok((Op::Im2Col { x: self.id, geom: at }, so, out))
        })
    }

    /// Folds columns `[N, C·kh·kw, oh·ow]` back onto an image `[N, C, H, W]` with
    /// `[H, W] = size`, summing where windows overlap: the adjoint of
    /// [`im2col`](Var::im2col) with the same kernel, stride and padding (entries that
    /// fall in the padding are dropped). PyTorch's `F.fold`.
    ///
    /// Gradient: `dx = im2col(dout)`.
    ///
    /// # Errors
    /// As [`im2col`](Var::im2col) for the image shape, and [`Error::InvalidShape`]
    /// (recorded) unless the input is `[N, C·kh·kw, oh·ow]` for that image.
    #[track_caller]
    pub fn col2im(self, size: [usize; 2], kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.col2im_args(size, Args { kernel, stride, padding, dilation: [1, 1] })
    }

    /// [`col2im`](Var::col2im) with dilated kernel taps: the adjoint of
    /// [`im2col_dilated`](Var::im2col_dilated) with the same arguments (PyTorch's `F.fold`
    /// with `dilation`).
    ///
    /// Gradient: `dx = im2col_dilated(dout)`.
    ///
    /// # Errors
    /// As [`col2im`](Var::col2im), and [`Error::InvalidArgument`] for a zero dilation.
    #[track_caller]
    pub fn col2im_dilated(
        self,
        size: [usize; 2],
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Var<'s, T> {
        let _name = self.core.composite("col2im_dilated");
        self.col2im_args(size, Args { kernel, stride, padding, dilation })
    }

    #[track_caller]
    fn col2im_args(self, size: [usize; 2], args: Args) -> Var<'s, T> {
        self.core.record(OpKind::Col2Im, |r| {
            let sx = r.shape(self.id);
            let Args { kernel, stride, padding, dilation } = args;
            let kk = kernel[0].saturating_mul(kernel[1]);
            let (op, location) = (r.op, r.location);
            let bad = |detail: String| Error::InvalidShape { op, shape: sx, detail, location };
            if sx.rank() != 3 || kk == 0 || sx.dim(1) % kk != 0 {
                return Err(bad(format!("needs columns [N, C·{}·{}, L] for kernel {kernel:?}", kernel[0], kernel[1])));
            }
            let image = r.shape_of(sx, &[sx.dim(0), sx.dim(1) / kk, size[0], size[1]])?;
            let (win, at) = record_window(r, image, args, false)?;
            if win.oh.saturating_mul(win.ow) != sx.dim(2) {
                let d = if dilation == [1, 1] { String::new() } else { format!(", dilation {dilation:?}") };
                return Err(bad(format!(
                    "has {} columns but image {image} with kernel {kernel:?}, stride {stride:?}, padding {padding:?}{d} has {}×{} windows",
                    sx.dim(2),
                    win.oh,
                    win.ow
                )));
            }
            col2im_record(r, self.core.par, self.id, image, at)
        })
    }

    /// `col2im` onto `image` with the geometry the tape stored at `geom` (the recorded
    /// derivative of `im2col`, whose arguments were checked).
    #[track_caller]
    pub(crate) fn col2im_at(self, image: Shape, geom: u32) -> Var<'s, T> {
        self.core.record(OpKind::Col2Im, |r| col2im_record(r, self.core.par, self.id, image, geom))
    }

    /// `im2col` with the geometry the tape stored at `geom` (the recorded derivative of `col2im`).
    #[track_caller]
    pub(crate) fn im2col_at(self, geom: u32) -> Var<'s, T> {
        self.core.record(OpKind::Im2Col, |r| {
            let sx = r.shape(self.id);
            let win = Window::from_extra(sx, &r.tape.extra[geom as usize..geom as usize + GEOM_LEN]);
            let so = r.shape_of(sx, &[win.n, win.c * win.kh * win.kw, win.oh * win.ow])?;
            let out = im2col_value(r, &win, self.core.par, r.value(self.id), so.numel())?;
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
        self.max_pool2d_args(Args { kernel, stride, padding, dilation: [1, 1] })
    }

    /// [`max_pool2d`](Var::max_pool2d) over windows whose taps are `dilation = [dh, dw]`
    /// apart: `out[n, c, oi, oj] = max_{a,b} x[n, c, oi·sh + a·dh − ph, oj·sw + b·dw − pw]`
    /// over the taps inside the input, `oh = (H + 2·ph − dh·(kh − 1) − 1)/sh + 1` and
    /// likewise `ow` (PyTorch's `max_pool2d` with `dilation`, `ceil_mode=False`). The
    /// padding must still be at most half the (undilated) kernel, PyTorch's rule; a
    /// dilated window can then straddle a small input without a tap inside it, and its
    /// maximum is `−∞` with no gradient, as in PyTorch.
    ///
    /// Gradient: `dout` flows to the first maximal tap of each window.
    ///
    /// # Errors
    /// As [`max_pool2d`](Var::max_pool2d), and [`Error::InvalidArgument`] for a zero dilation.
    #[track_caller]
    pub fn max_pool2d_dilated(
        self,
        kernel: [usize; 2],
        stride: [usize; 2],
        padding: [usize; 2],
        dilation: [usize; 2],
    ) -> Var<'s, T> {
        let _name = self.core.composite("max_pool2d_dilated");
        self.max_pool2d_args(Args { kernel, stride, padding, dilation })
    }

    #[track_caller]
    fn max_pool2d_args(self, args: Args) -> Var<'s, T> {
        self.core.record(OpKind::MaxPool2d, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, args, true)?;
            let so = r.shape_of(sx, &[win.n, win.c, win.oh, win.ow])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            let ohw = win.oh * win.ow;
            win.for_planes(self.core.par, out, ohw, &|planes, out| {
                if win.plain() {
                    return win.max_plain(planes, x, out);
                }
                let base = planes.start * ohw;
                out.fill(T::neg_infinity());
                // A NaN in the window wins and stays (PyTorch).
                win.for_each_tap(planes, |o, i| {
                    let o = o - base;
                    if !out[o].is_nan() && (x[i] > out[o] || x[i].is_nan()) {
                        out[o] = x[i];
                    }
                });
            });
            Ok((Op::MaxPool2d { x: self.id, geom: at }, so, out))
        })
    }

    /// Average pooling of `x: [N, C, H, W]` over `kh×kw` windows: `out: [N, C, oh, ow]`,
    /// `out = (1/(kh·kw)) Σ window`, padding counting as zeros. PyTorch's `AvgPool2d`
    /// has no dilation, and neither has this.
    ///
    /// Gradient: `dx += dout/(kh·kw)` at each window position inside the input.
    ///
    /// # Errors
    /// As [`max_pool2d`](Var::max_pool2d).
    #[track_caller]
    pub fn avg_pool2d(self, kernel: [usize; 2], stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        self.core.record(OpKind::AvgPool2d, |r| {
            let sx = r.shape(self.id);
            let (win, at) = record_window(r, sx, Args { kernel, stride, padding, dilation: [1, 1] }, true)?;
            let so = r.shape_of(sx, &[win.n, win.c, win.oh, win.ow])?;
            let x = r.value(self.id);
            let out = r.alloc(so.numel())?;
            let (ohw, scale) = (win.oh * win.ow, T::ONE / T::from_usize(win.kh * win.kw));
            win.for_planes(self.core.par, out, ohw, &|planes, out| {
                let base = planes.start * ohw;
                win.for_each_tap(planes, |o, i| out[o - base] += x[i]);
                out.iter_mut().for_each(|v| *v *= scale);
            });
            Ok((Op::AvgPool2d { x: self.id, geom: at }, so, out))
        })
    }
}

#[inline(never)]
pub(crate) fn backward_im2col<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    geom: u32,
) -> Result<()> {
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, GEOM_LEN));
    let par = ctx.par;
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        col2im_into(&win, par, dout, dx);
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
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, GEOM_LEN));
    let (xv, yv) = (ctx.value(x), ctx.value(out));
    let (par, hw) = (ctx.par, win.h * win.w);
    if win.pairs() {
        // Every element written on a first gradient: no zero fill first.
        if let Some((dout, dx, first)) = ctx.grad_pair_write(out, x)? {
            win.for_planes(par, dx, hw, &|planes, dx| win.max_grad_pairs(planes, xv, yv, dout, dx, first));
        }
        return Ok(());
    }
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        win.for_planes(par, dx, hw, &|planes, dx| {
            if win.plain() {
                return win.max_grad_plain(planes, xv, yv, dout, dx);
            }
            let base = planes.start * hw;
            // The first position equal to the window's maximum (the first NaN, for a NaN
            // maximum) gets the gradient. Taps come window by window, so remembering the
            // last window served is enough.
            let mut served = usize::MAX;
            win.for_each_tap(planes, |o, i| {
                if served != o && (xv[i] == yv[o] || (xv[i].is_nan() && yv[o].is_nan())) {
                    dx[i - base] += dout[o];
                    served = o;
                }
            });
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
    let win = Window::from_extra(ctx.shape(x), ctx.extra(geom, GEOM_LEN));
    let scale = T::ONE / T::from_usize(win.kh * win.kw);
    let par = ctx.par;
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        let hw = win.h * win.w;
        win.for_planes(par, dx, hw, &|planes, dx| {
            let base = planes.start * hw;
            win.for_each_tap(planes, |o, i| dx[i - base] += dout[o] * scale);
        });
    }
    Ok(())
}

fn col2im_record<'s, T: Float>(
    r: &mut Rec<'_, 's, T>,
    threads: Par,
    x: NodeId<'s>,
    image: Shape,
    geom: u32,
) -> Result<(Op<'s, T>, Shape, &'s [T])> {
    let win = Window::from_extra(image, &r.tape.extra[geom as usize..geom as usize + GEOM_LEN]);
    let xv = r.value(x);
    let out = r.alloc(image.numel())?;
    col2im_into(&win, threads, xv, out);
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
    let win = Window::from_extra(ctx.shape(out), ctx.extra(geom, GEOM_LEN));
    let par = ctx.par;
    if let Some((dout, dx)) = ctx.grad_pair(out, x)? {
        im2col_add(&win, par, dout, dx);
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
        Window::from_extra(tape.shape(x), &tape.extra[geom as usize..geom as usize + GEOM_LEN])
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
                    'window: for a in win.rows(oi, win.dh) {
                        for b in win.cols(oj, win.dw) {
                            let (r, c) = (oi * win.sh + a * win.dh - win.ph, oj * win.sw + b * win.dw - win.pw);
                            let i = plane * win.h * win.w + r * win.w + c;
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
        let win = { Window::from_extra(sx, &ctx.core.tape.borrow().extra[geom as usize..geom as usize + GEOM_LEN]) };
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
