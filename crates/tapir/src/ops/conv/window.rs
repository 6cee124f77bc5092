//! The geometry of a sliding window over `[N, C, H, W]`, shared by `im2col`, `col2im` and
//! the poolings: its checks when an op is recorded, its place in the tape's `extra` list,
//! and the loops that visit its taps.
//!
//! Kernel offset `(a, b)` of output `(oi, oj)` reads input `(oi·sh + a·dh − ph,
//! oj·sw + b·dw − pw)`; the output has `oh = (H + 2·ph − dh·(kh − 1) − 1)/sh + 1` rows and
//! likewise `ow` columns (PyTorch's rule). The eight numbers are stored as
//! `[kh, kw, sh, sw, ph, pw, dh, dw]` ([`GEOM_LEN`]).
//!
//! The loops are written once and compiled twice, for dilation 1 and for any dilation,
//! so that the common undilated case keeps the loop shape it had before dilation existed
//! (a multiplication by a constant 1 folds away, a runtime `dw` would not).

use std::ops::Range;

use faer::Par;

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels::par;
use crate::record::ctx::Rec;
use crate::shape::Shape;

/// How many `u32`s of the tape's `extra` list one window takes.
pub(super) const GEOM_LEN: usize = 8;

/// The geometry of a sliding window over `[n, c, h, w]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Window {
    pub(super) n: usize,
    pub(super) c: usize,
    pub(super) h: usize,
    pub(super) w: usize,
    pub(super) kh: usize,
    pub(super) kw: usize,
    pub(super) sh: usize,
    pub(super) sw: usize,
    pub(super) ph: usize,
    pub(super) pw: usize,
    pub(super) dh: usize,
    pub(super) dw: usize,
    pub(super) oh: usize,
    pub(super) ow: usize,
}

impl Window {
    /// The window over `x` of the geometry `[kh, kw, sh, sw, ph, pw, dh, dw]`, or `None`
    /// if it does not fit (checked when the op is recorded).
    pub(super) fn new(x: Shape, [kh, kw, sh, sw, ph, pw, dh, dw]: [usize; GEOM_LEN]) -> Option<Window> {
        if x.rank() != 4 || kh == 0 || kw == 0 || sh == 0 || sw == 0 || dh == 0 || dw == 0 {
            return None;
        }
        let (n, c, h, w) = (x.dim(0), x.dim(1), x.dim(2), x.dim(3));
        // The dilated kernel's extent, `d·(k − 1) + 1`.
        let (eh, ew) = (dh.checked_mul(kh - 1)?.checked_add(1)?, dw.checked_mul(kw - 1)?.checked_add(1)?);
        let oh = h.checked_add(ph.checked_mul(2)?)?.checked_sub(eh)? / sh + 1;
        let ow = w.checked_add(pw.checked_mul(2)?)?.checked_sub(ew)? / sw + 1;
        Some(Window { n, c, h, w, kh, kw, sh, sw, ph, pw, dh, dw, oh, ow })
    }

    /// Reads the geometry back from the tape's `extra` list (`g` holds [`GEOM_LEN`] numbers).
    pub(super) fn from_extra(x: Shape, g: &[u32]) -> Window {
        let g: [u32; GEOM_LEN] = g.try_into().expect("a window's geometry is GEOM_LEN numbers");
        Window::new(x, g.map(|v| v as usize)).expect("the window was checked when the op was recorded")
    }

    /// Whether the window is dilated along either axis (the loops' slow shape).
    #[inline]
    pub(super) fn dilated(&self) -> bool {
        self.dh != 1 || self.dw != 1
    }

    /// The kernel rows `a` whose input row `oi·sh + a·dh − ph` lies inside the input: the
    /// window clipped to the input, so that a kernel far larger than the input costs no
    /// more than the input. `dh` is the window's, or a constant 1 in the undilated loops.
    #[inline(always)]
    pub(super) fn rows(&self, oi: usize, dh: usize) -> Range<usize> {
        clip(oi * self.sh, self.ph, self.h, self.kh, dh)
    }

    /// As [`rows`](Window::rows) for kernel columns at output column `oj`.
    #[inline(always)]
    pub(super) fn cols(&self, oj: usize, dw: usize) -> Range<usize> {
        clip(oj * self.sw, self.pw, self.w, self.kw, dw)
    }

    /// Calls `f(planes, piece)` for consecutive pieces of `out`, each holding whole
    /// `(n, c)` planes of `per_plane` elements (`out` is per-plane: the outputs, `oh·ow`
    /// per plane, or the input's gradient, `h·w`), over `threads` when the input or `out`
    /// has [`par::MIN_PARALLEL`] elements or more. A piece covers about [`par::CHUNK`]
    /// elements of the larger of the two: the split depends on the shape alone, and every
    /// element is computed by the same loop whatever the thread count.
    pub(super) fn for_planes<U: Send>(
        &self,
        threads: Par,
        out: &mut [U],
        per_plane: usize,
        f: &(impl Fn(Range<usize>, &mut [U]) + Sync),
    ) {
        self.split(threads, out, self.n * self.c, per_plane, self.h * self.w, f);
    }

    /// As [`for_planes`](Window::for_planes) for pieces of whole images (`n`), each of
    /// `per_image` elements: `im2col`'s columns, `C·kh·kw·oh·ow` per image, or their
    /// adjoint's image, `C·h·w`.
    pub(super) fn for_images<U: Send>(
        &self,
        threads: Par,
        out: &mut [U],
        per_image: usize,
        f: &(impl Fn(Range<usize>, &mut [U]) + Sync),
    ) {
        self.split(threads, out, self.n, per_image, self.c * self.h * self.w, f);
    }

    /// `units` units of `per_unit` elements of `out`, each reading `unit_input` input
    /// elements, split as [`for_planes`](Window::for_planes) describes.
    fn split<U: Send>(
        &self,
        threads: Par,
        out: &mut [U],
        units: usize,
        per_unit: usize,
        unit_input: usize,
        f: &(impl Fn(Range<usize>, &mut [U]) + Sync),
    ) {
        if per_unit == 0 || units == 0 {
            return f(0..units, out);
        }
        // Sized by the larger side of a unit: `im2col`'s columns are `kh·kw` times its input.
        let unit = unit_input.max(per_unit);
        let threads = if units.saturating_mul(unit) < par::MIN_PARALLEL { 1 } else { par::threads(threads) };
        let per_piece = (par::CHUNK / unit).max(1);
        par::for_chunks(threads, out, per_piece * per_unit, &|start, piece| {
            let first = start / per_unit;
            f(first..first + piece.len() / per_unit, piece)
        });
    }

    /// Calls `f(o, i)` for every output position `o` of the `(n, c)` planes `planes` and
    /// every input position `i` of its window, both as flat indices into the whole output
    /// and input, in row-major window order.
    #[inline]
    pub(super) fn for_each_tap(&self, planes: Range<usize>, f: impl FnMut(usize, usize)) {
        if self.dilated() {
            self.taps::<true>(planes, f);
        } else {
            self.taps::<false>(planes, f);
        }
    }

    #[inline(always)]
    fn taps<const DILATED: bool>(&self, planes: Range<usize>, mut f: impl FnMut(usize, usize)) {
        let (dh, dw) = if DILATED { (self.dh, self.dw) } else { (1, 1) };
        let (hw, ohw) = (self.h * self.w, self.oh * self.ow);
        for plane in planes {
            for oi in 0..self.oh {
                let rows = self.rows(oi, dh);
                for oj in 0..self.ow {
                    let o = plane * ohw + oi * self.ow + oj;
                    let cols = self.cols(oj, dw);
                    for a in rows.clone() {
                        let i = oi * self.sh + a * dh - self.ph;
                        for b in cols.clone() {
                            f(o, plane * hw + i * self.w + oj * self.sw + b * dw - self.pw);
                        }
                    }
                }
            }
        }
    }

    /// Whether output row `oi` reads input rows `oi + a·dh − ph` (stride 1) and is as wide as
    /// an input row (`sw = 1`, `ow = w`: a "same"-width convolution, `2·pw = dw·(kw − 1)`).
    /// Then each kernel tap's columns over a plane are the plane's rows shifted by `b·dw − pw`
    /// elements, which [`im2col_aligned`](Window::im2col_aligned) copies in one piece.
    #[inline]
    pub(super) fn aligned(&self) -> bool {
        self.sh == 1 && self.sw == 1 && self.ow == self.w
    }

    /// Calls `f(plane, tap, at, rows, right, left)` for every kernel tap `(c, a, b)` of the
    /// images `images` of an [`aligned`](Window::aligned) window, in the columns' order:
    /// `plane` the input plane (`n·C + c`), `tap` the tap's column block counted from the
    /// first image's, `rows` the elements of that block (`oh·ow`) whose output rows read
    /// the input, starting at element `at` of the plane, and output column `oj` reads input
    /// column `oj + right − left` (one of the two is 0).
    #[inline(always)]
    fn aligned_taps(&self, images: Range<usize>, mut f: impl FnMut(usize, usize, usize, Range<usize>, usize, usize)) {
        let w = self.w;
        let mut tap = 0;
        for plane in images.start * self.c..images.end * self.c {
            for a in 0..self.kh {
                let ois = span(a * self.dh, self.ph, self.h, 1, self.oh);
                // Input row of output row `oi` is `oi + a·dh − ph` (span keeps it inside).
                let at = (ois.start + a * self.dh).saturating_sub(self.ph) * w;
                let rows = if ois.is_empty() { 0..0 } else { ois.start * w..ois.end * w };
                for b in 0..self.kw {
                    let (right, left) = ((b * self.dw).saturating_sub(self.pw), self.pw.saturating_sub(b * self.dw));
                    f(plane, tap, at, rows.clone(), right, left);
                    tap += 1;
                }
            }
        }
    }

    /// `im2col` of the images `images` for an [`aligned`](Window::aligned) window, writing
    /// every element of `cols` (their columns): per kernel tap `(c, a, b)` of an image,
    /// one copy of the input rows that the tap's output rows read, shifted by
    /// `b·dw − pw`, then zeros over the output rows and edge columns that fall in the
    /// padding (the copy's elements there came from a neighbouring row).
    pub(super) fn im2col_aligned<T: Float>(&self, images: Range<usize>, x: &[T], cols: &mut [T]) {
        let (w, hw, l) = (self.w, self.h * self.w, self.oh * self.ow);
        self.aligned_taps(images, |plane, tap, src, rows, right, left| {
            let (plane, tap) = (&x[plane * hw..][..hw], &mut cols[tap * l..][..l]);
            tap[..rows.start].fill(T::ZERO);
            tap[rows.end..].fill(T::ZERO);
            let block = &mut tap[rows];
            let len = block.len();
            if len == 0 {
                return;
            }
            if right > 0 {
                let d = right.min(len);
                block[..len - d].copy_from_slice(&plane[src + d..src + len]);
                zero_edges(block, w, w - right.min(w)..w);
            } else {
                let d = left.min(len);
                block[d..].copy_from_slice(&plane[src..src + len - d]);
                zero_edges(block, w, 0..left.min(w));
            }
        });
    }

    /// `image += col2im(cols)` of the images `images` for an [`aligned`](Window::aligned)
    /// window (`image` holds their planes, `cols` the whole columns): kernel tap by tap,
    /// then output row by output row, as the general loop sums, so the bits are its bits.
    /// A tap with no horizontal shift adds its rows in one piece. (Adding a shifted tap in
    /// one piece too, setting aside and restoring the elements that wrap into a
    /// neighbouring row, took 1.6 times the instructions on W11's 4-wide rows.)
    pub(super) fn col2im_aligned<T: Float>(&self, images: Range<usize>, cols: &[T], image: &mut [T]) {
        let (w, hw, l) = (self.w, self.h * self.w, self.oh * self.ow);
        let (first, cols) = (images.start * self.c, &cols[images.start * self.c * self.kh * self.kw * l..]);
        self.aligned_taps(images, |plane, tap, dst, rows, right, left| {
            // Output column `oj` adds to input column `oj + right − left`, for the
            // `w − shift` columns inside the input.
            let keep = w - (right + left).min(w);
            if rows.is_empty() || keep == 0 {
                return;
            }
            let plane = &mut image[(plane - first) * hw..][..hw];
            let (from, to) = (&cols[tap * l..][rows.clone()], &mut plane[dst..dst + rows.len()]);
            if right == 0 && left == 0 {
                to.iter_mut().zip(from).for_each(|(d, &v)| *d += v);
                return;
            }
            for (to, from) in to.chunks_exact_mut(w).zip(from.chunks_exact(w)) {
                let (to, from) = (&mut to[right..right + keep], &from[left..left + keep]);
                to.iter_mut().zip(from).for_each(|(d, &v)| *d += v);
            }
        });
    }

    /// Calls `f(col, x, len)` for every run of `im2col`'s output for the images `images`
    /// that reads the input: `len` consecutive column elements from flat index `col` (into
    /// the whole output) copy the input elements `x, x + sw, …, x + (len − 1)·sw` (into the
    /// whole input). A run is one output row `oi` of one kernel tap `(c, a, b)`: the
    /// output columns `oj` whose input column lies inside the input. Row by row, a copy is
    /// a slice (`sw = 1`) rather than an index computation per element.
    #[inline]
    pub(super) fn for_each_run(&self, images: Range<usize>, mut f: impl FnMut(usize, usize, usize)) {
        let (k, l) = (self.c * self.kh * self.kw, self.oh * self.ow);
        for n in images {
            for c in 0..self.c {
                let plane = (n * self.c + c) * self.h * self.w;
                for a in 0..self.kh {
                    // Output rows whose input row `oi·sh + a·dh − ph` is inside the input.
                    let ois = span(a * self.dh, self.ph, self.h, self.sh, self.oh);
                    for b in 0..self.kw {
                        let ojs = span(b * self.dw, self.pw, self.w, self.sw, self.ow);
                        if ojs.is_empty() {
                            continue;
                        }
                        let row = (n * k + (c * self.kh + a) * self.kw + b) * l;
                        for oi in ois.clone() {
                            let i = oi * self.sh + a * self.dh - self.ph;
                            let j = ojs.start * self.sw + b * self.dw - self.pw;
                            f(row + oi * self.ow + ojs.start, plane + i * self.w + j, ojs.len());
                        }
                    }
                }
            }
        }
    }
}

/// `im2col(x)` in a new arena slice of `len` elements, image by image over `threads`: an
/// [`aligned`](Window::aligned) window's loop writes every element, so its slice is not
/// zeroed first; the other loops write only what they copy, into a zeroed slice.
pub(super) fn im2col_value<'s, T: Float>(
    r: &Rec<'_, 's, T>,
    win: &Window,
    threads: Par,
    x: &[T],
    len: usize,
) -> Result<&'s mut [T]> {
    if win.aligned() {
        let out = r.alloc_written(len)?;
        let per_image = win.c * win.kh * win.kw * win.oh * win.ow;
        win.for_images(threads, out, per_image, &|images, cols| win.im2col_aligned(images, x, cols));
        return Ok(out);
    }
    let out = r.alloc(len)?;
    im2col_runs(win, threads, x, out, false);
    Ok(out)
}

/// `cols += im2col(x)`, image by image over `threads`.
pub(super) fn im2col_add<T: Float>(win: &Window, threads: Par, x: &[T], cols: &mut [T]) {
    im2col_runs(win, threads, x, cols, true);
}

/// `cols (=|+=) im2col(x)` run by run (a copy, or an add if `add`).
fn im2col_runs<T: Float>(win: &Window, threads: Par, x: &[T], cols: &mut [T], add: bool) {
    let per_image = win.c * win.kh * win.kw * win.oh * win.ow;
    let sw = win.sw;
    win.for_images(threads, cols, per_image, &|images, cols| {
        let base = images.start * per_image;
        win.for_each_run(images, |o, i, len| {
            let cols = &mut cols[o - base..o - base + len];
            let from = x[i..].iter().step_by(sw);
            match (add, sw) {
                (false, 1) => cols.copy_from_slice(&x[i..i + len]),
                (false, _) => cols.iter_mut().zip(from).for_each(|(c, &v)| *c = v),
                (true, _) => cols.iter_mut().zip(from).for_each(|(c, &v)| *c += v),
            }
        });
    });
}

/// `image += col2im(cols)`, the scatter-add of `im2col`'s map, image by image over
/// `threads` (each image's sums run in the same order whatever the thread count: by
/// kernel tap, then output position).
pub(super) fn col2im_into<T: Float>(win: &Window, threads: Par, cols: &[T], image: &mut [T]) {
    let per_image = win.c * win.h * win.w;
    if win.aligned() {
        return win.for_images(threads, image, per_image, &|images, image| win.col2im_aligned(images, cols, image));
    }
    let sw = win.sw;
    win.for_images(threads, image, per_image, &|images, image| {
        let base = images.start * per_image;
        win.for_each_run(images, |o, i, len| {
            let image = &mut image[i - base..];
            image.iter_mut().step_by(sw).zip(&cols[o..o + len]).for_each(|(d, &v)| *d += v);
        });
    });
}

/// Zeros the columns `cols` of every row of `block` (rows of `w` elements). A
/// one-column edge, a 3×3 kernel's, is one store per row rather than a call to `memset`.
#[inline(always)]
fn zero_edges<T: Float>(block: &mut [T], w: usize, cols: Range<usize>) {
    if cols.len() == 1 {
        block.iter_mut().skip(cols.start).step_by(w).for_each(|v| *v = T::ZERO);
    } else if !cols.is_empty() {
        block.chunks_exact_mut(w).for_each(|row| row[cols.clone()].fill(T::ZERO));
    }
}

/// The outputs `o` in `0..count` whose input `o·stride + offset − pad` lies in `0..len`.
#[inline(always)]
fn span(offset: usize, pad: usize, len: usize, stride: usize, count: usize) -> Range<usize> {
    // Stride 1, the commonest, without the two divisions: `for_each_run` computes a span
    // for every kernel tap of every channel of every image.
    let up = |v: usize| if stride == 1 { v } else { v.div_ceil(stride) };
    let hi = up((len + pad).saturating_sub(offset)).min(count);
    let lo = up(pad.saturating_sub(offset)).min(hi);
    lo..hi
}

/// The kernel offsets `a` in `0..k` with `0 ≤ start + a·d − pad < len`. Every sum is of
/// a dimension and a number below 2^32, and the divisions round up without adding, so
/// nothing overflows however large the kernel or the dilation.
#[inline(always)]
fn clip(start: usize, pad: usize, len: usize, k: usize, d: usize) -> Range<usize> {
    // a·d ≥ pad − start, and a·d < len + pad − start.
    let (lo, hi) = (pad.saturating_sub(start), (len + pad).saturating_sub(start));
    let (lo, hi) = if d == 1 { (lo, hi) } else { (lo.div_ceil(d), hi.div_ceil(d)) };
    let (lo, hi) = (lo.min(k), hi.min(k));
    lo..hi.max(lo)
}

/// A window's arguments as the caller gave them.
#[derive(Debug, Clone, Copy)]
pub(super) struct Args {
    pub(super) kernel: [usize; 2],
    pub(super) stride: [usize; 2],
    pub(super) padding: [usize; 2],
    pub(super) dilation: [usize; 2],
}

impl Args {
    /// The geometry in its stored order.
    pub(super) fn geom(&self) -> [usize; GEOM_LEN] {
        let Args { kernel: k, stride: s, padding: p, dilation: d } = *self;
        [k[0], k[1], s[0], s[1], p[0], p[1], d[0], d[1]]
    }

    /// The arguments for an error message; dilation only where it is not 1, so that
    /// the undilated ops' messages read as they did.
    fn describe(&self) -> String {
        let Args { kernel, stride, padding, dilation } = *self;
        let d = if dilation == [1, 1] { String::new() } else { format!(", dilation {dilation:?}") };
        format!("kernel {kernel:?}, stride {stride:?}, padding {padding:?}{d}")
    }
}

/// Checks the window arguments of `op` on `x` (`pool`: PyTorch's pooling rule, padding
/// at most half the kernel); stores them in `extra`; returns the window and the offset.
pub(super) fn record_window<T: Float>(
    r: &mut Rec<'_, '_, T>,
    x: Shape,
    args: Args,
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
    let Args { kernel, stride, padding, dilation } = args;
    let g = args.geom();
    if g.iter().any(|&v| u32::try_from(v).is_err()) {
        return Err(r.invalid(format!("{} must each be below 2^32 (input shape {x})", args.describe())));
    }
    if kernel.contains(&0) || stride.contains(&0) || dilation.contains(&0) {
        let d = if dilation == [1, 1] { String::new() } else { format!(" and dilation {dilation:?}") };
        return Err(r.invalid(format!("kernel {kernel:?}, stride {stride:?}{d} must be positive (input shape {x})")));
    }
    if pool && (padding[0] > kernel[0] / 2 || padding[1] > kernel[1] / 2) {
        // Undilated, the rule means no window is all padding; dilated, a window can
        // straddle a small input and yield −∞, as in PyTorch, which checks the same rule.
        let why = if dilation == [1, 1] { ", so that no window is all padding" } else { " (PyTorch's rule)" };
        return Err(r.invalid(format!(
            "padding {padding:?} must be at most half the kernel {kernel:?}{why} (input shape {x})"
        )));
    }
    let Some(win) = Window::new(x, g) else {
        let d = if dilation == [1, 1] { String::new() } else { format!(" dilated by {dilation:?}") };
        return Err(Error::InvalidShape {
            op: r.op,
            shape: x,
            detail: format!("kernel {kernel:?}{d} does not fit the input padded by {padding:?}"),
            location: r.location,
        });
    };
    let at = r.extra(g.iter().map(|&v| v as u32))?;
    Ok((win, at))
}
