//! Max pooling's own loops for windows that lie wholly inside the input: no padding, no
//! dilation ([`Window::plain`]), and the 2×2 stride-2 windows of most CNNs
//! ([`Window::pairs`]), which read each window's rows as slices instead of clipping
//! ranges tap by tap. Values and gradients are those of the general loops in `mod.rs`.

use std::ops::Range;

use crate::dtype::Float;

use super::window::Window;

impl Window {
    /// Whether every tap of every window lies inside the input and taps are adjacent: no
    /// padding, no dilation. Such windows take the max-pooling loops below, which read
    /// each window's rows as slices instead of clipping ranges tap by tap.
    #[inline]
    pub(super) fn plain(&self) -> bool {
        self.ph == 0 && self.pw == 0 && !self.dilated()
    }

    /// Whether the window is 2×2 with stride 2 and [`plain`](Window::plain): pooling's
    /// commonest shape, which the max-pooling loops take two input rows at a time.
    #[inline]
    pub(super) fn pairs(&self) -> bool {
        self.plain() && [self.kh, self.kw, self.sh, self.sw] == [2, 2, 2, 2]
    }

    /// Max pooling of a [`plain`](Window::plain) window over the planes `planes`: `out`
    /// holds their outputs. The taps are visited in row-major window order and a NaN wins
    /// and stays, as in the general loop, so the values are the same.
    pub(super) fn max_plain<T: Float>(&self, planes: Range<usize>, x: &[T], out: &mut [T]) {
        let (hw, ohw) = (self.h * self.w, self.oh * self.ow);
        if self.pairs() {
            // 2×2 windows with stride 2: two input rows give one output row.
            for (p, out) in planes.zip(out.chunks_exact_mut(ohw)) {
                let plane = &x[p * hw..(p + 1) * hw];
                for (oi, out) in out.chunks_exact_mut(self.ow).enumerate() {
                    let top = &plane[2 * oi * self.w..][..2 * self.ow];
                    let bottom = &plane[(2 * oi + 1) * self.w..][..2 * self.ow];
                    for ((o, t), b) in out.iter_mut().zip(top.chunks_exact(2)).zip(bottom.chunks_exact(2)) {
                        *o = later(later(later(t[0], t[1]), b[0]), b[1]);
                    }
                }
            }
            return;
        }
        for (p, out) in planes.zip(out.chunks_exact_mut(ohw)) {
            let plane = &x[p * hw..(p + 1) * hw];
            for (oi, out) in out.chunks_exact_mut(self.ow).enumerate() {
                for (oj, o) in out.iter_mut().enumerate() {
                    let mut m = T::neg_infinity();
                    for a in 0..self.kh {
                        let at = (oi * self.sh + a) * self.w + oj * self.sw;
                        for &v in &plane[at..at + self.kw] {
                            m = later(m, v);
                        }
                    }
                    *o = m;
                }
            }
        }
    }

    /// Max pooling's gradient for a [`plain`](Window::plain) window over the planes
    /// `planes`: `dx` holds their input gradients; the first tap equal to the window's
    /// maximum (the first NaN, for a NaN maximum) gets `dout`, as in the general loop.
    /// ([`pairs`](Window::pairs) windows take [`max_grad_pairs`](Window::max_grad_pairs).)
    pub(super) fn max_grad_plain<T: Float>(&self, planes: Range<usize>, x: &[T], y: &[T], dout: &[T], dx: &mut [T]) {
        let (hw, ohw) = (self.h * self.w, self.oh * self.ow);
        for (p, dx) in planes.zip(dx.chunks_exact_mut(hw)) {
            let plane = &x[p * hw..(p + 1) * hw];
            for oi in 0..self.oh {
                for oj in 0..self.ow {
                    let o = p * ohw + oi * self.ow + oj;
                    let m = y[o];
                    'window: for a in 0..self.kh {
                        let at = (oi * self.sh + a) * self.w + oj * self.sw;
                        for (b, &v) in plane[at..at + self.kw].iter().enumerate() {
                            if v == m || (v.is_nan() && m.is_nan()) {
                                dx[at + b] += dout[o];
                                break 'window;
                            }
                        }
                    }
                }
            }
        }
    }

    /// Max pooling's gradient for [`pairs`](Window::pairs) windows over the planes
    /// `planes`, as [`max_grad_plain`](Window::max_grad_plain) adds it; with `write`,
    /// every element of `dx` is set instead (`dout` at each window's maximum, `0` at its
    /// other taps and at the odd last row or column no window reads), so `dx`'s elements
    /// may be unspecified.
    pub(super) fn max_grad_pairs<T: Float>(
        &self,
        planes: Range<usize>,
        x: &[T],
        y: &[T],
        dout: &[T],
        dx: &mut [T],
        write: bool,
    ) {
        let (hw, ohw, w, ow) = (self.h * self.w, self.oh * self.ow, self.w, self.ow);
        for (p, dx) in planes.zip(dx.chunks_exact_mut(hw)) {
            if write && (self.h % 2 == 1 || w % 2 == 1) {
                dx.fill(T::ZERO);
            }
            let plane = &x[p * hw..(p + 1) * hw];
            let (yp, dp) = (&y[p * ohw..(p + 1) * ohw], &dout[p * ohw..(p + 1) * ohw]);
            for ((oi, ym), dm) in yp.chunks_exact(ow).enumerate().zip(dp.chunks_exact(ow)) {
                for (oj, (&m, &d)) in ym.iter().zip(dm).enumerate() {
                    // The window's taps are `i`, `i + 1`, `i + w` and `i + w + 1`, all inside
                    // the plane: `2·oi + 1 < h` and `2·oj + 1 < w`.
                    let i = 2 * oi * w + 2 * oj;
                    // Which taps differ from the maximum (and, for a NaN maximum, are not
                    // NaN): the first that does not gets the gradient. Where the maximum
                    // lies is random, so branches on it would mispredict.
                    let nan = m.is_nan();
                    let miss = |v: T| !((v == m) | (v.is_nan() & nan));
                    let (m0, m1) = (miss(plane[i]), miss(plane[i + 1]));
                    let (m2, m3) = (miss(plane[i + w]), miss(plane[i + w + 1]));
                    // The first tap equal to the maximum as an index (4: none, which the
                    // forward's own maximum never leaves), then an offset.
                    let at = usize::from(m0)
                        + usize::from(m0 & m1)
                        + usize::from(m0 & m1 & m2)
                        + usize::from(m0 & m1 & m2 & m3);
                    if write {
                        // Zeros, then `0 + d` (the accumulating path's bits: `-0` becomes
                        // `+0`) at the maximum: stores, no branch on where the maximum is
                        // (a select between float values compiles to one, which
                        // mispredicts: the maximum's place is random).
                        dx[i] = T::ZERO;
                        dx[i + 1] = T::ZERO;
                        dx[i + w] = T::ZERO;
                        dx[i + w + 1] = T::ZERO;
                        if at < 4 {
                            dx[i + (at & 1) + (at >> 1) * w] = T::ZERO + d;
                        }
                        continue;
                    }
                    if at < 4 {
                        dx[i + (at & 1) + (at >> 1) * w] += d;
                    }
                }
            }
        }
    }
}

/// The running maximum `m` after tap `v`: a NaN wins and stays, and of equal values the
/// earlier stays (the general loop's rule, with the taps in row-major order).
#[inline(always)]
fn later<T: Float>(m: T, v: T) -> T {
    // Two selects, each on one comparison, which compile to compare-and-mask
    // instructions; a select on a combination of comparisons compiles to a branch, which
    // mispredicts (the maximum's place is random). `m >= v` fails where `v` is larger
    // or either is NaN.
    let t = if m >= v { m } else { v };
    if m.is_nan() {
        m
    } else {
        t
    }
}
