//! Slice-in, slice-out math. Kernels never see `NodeId`s, scopes or the tape: shapes and
//! slices in, slices out. Graph ops and eager [`Tensor`](crate::Tensor) ops share them.

#[cfg(test)]
mod accuracy;
pub(crate) mod attention;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod par;
pub(crate) mod scalar;
pub(crate) mod simd;
pub(crate) mod vmath;

use crate::shape::{Shape, MAX_RANK};
use crate::Float;

/// Calls `f(out, [i0, i1, ...])` for every element of `out` in row-major order, where
/// each `ik` is an offset under `strides[k]` (aligned to `out`'s rank; 0 where that input
/// is broadcast). The innermost dimension is a tight loop.
#[inline]
pub(crate) fn for_each_n<const N: usize>(
    out: &Shape,
    strides: [&[usize; MAX_RANK]; N],
    mut f: impl FnMut(usize, [usize; N]),
) {
    let r = out.rank();
    if r == 0 {
        f(0, [0; N]);
        return;
    }
    if out.numel() == 0 {
        return;
    }
    let inner = out.dim(r - 1);
    let step: [usize; N] = std::array::from_fn(|k| strides[k][r - 1]);
    let mut idx = [0usize; MAX_RANK];
    let mut base = [0usize; N];
    let mut o = 0usize;
    loop {
        for j in 0..inner {
            f(o + j, std::array::from_fn(|k| base[k] + j * step[k]));
        }
        o += inner;
        let mut d = r - 1;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            for k in 0..N {
                base[k] += strides[k][d];
            }
            if idx[d] < out.dim(d) {
                break;
            }
            for k in 0..N {
                base[k] -= strides[k][d] * idx[d];
            }
            idx[d] = 0;
        }
    }
}

/// [`for_each_n`] for two inputs: `f(out, ia, ib)`.
#[inline]
pub(crate) fn for_each2(
    out: &Shape,
    sa: &[usize; MAX_RANK],
    sb: &[usize; MAX_RANK],
    mut f: impl FnMut(usize, usize, usize),
) {
    for_each_n(out, [sa, sb], |o, [ia, ib]| f(o, ia, ib));
}

/// Calls `f(out, ia, ib)` over `out`, with `a` and `b` broadcast to it.
#[inline]
pub(crate) fn for_each_broadcast(out: &Shape, a: &Shape, b: &Shape, f: impl FnMut(usize, usize, usize)) {
    for_each2(out, &a.broadcast_strides(out), &b.broadcast_strides(out), f);
}

/// If `small` broadcast to `out` is `small` repeated end to end (its shape, without
/// leading 1s, is a suffix of `out`'s), the length of one repetition: a bias row added to
/// a batch, for example. Such broadcasts get a chunked loop instead of index arithmetic.
fn tile_len(small: &Shape, out: &Shape) -> Option<usize> {
    let dims = small.dims();
    let tail = &dims[dims.iter().position(|&d| d != 1).unwrap_or(dims.len())..];
    let od = out.dims();
    let n = small.numel();
    (n > 0 && tail.len() <= od.len() && od[od.len() - tail.len()..] == *tail).then_some(n)
}

/// `out[i] = f(a[ia], b[ib])` with broadcasting; `out` has shape `so`. Vectorised (see [`simd`]).
#[inline(always)]
pub(crate) fn binary<T: Float>(
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (out, so): (&mut [T], &Shape),
    f: impl Fn(T, T) -> T,
) {
    simd::run(
        out.len(),
        #[inline(always)]
        || binary_loop((a, sa), (b, sb), (out, so), f),
    );
}

#[inline(always)]
fn binary_loop<T: Float>(
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (out, so): (&mut [T], &Shape),
    f: impl Fn(T, T) -> T,
) {
    if sa == so && sb == so {
        for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
            *o = f(x, y);
        }
    } else if let (true, [y]) = (sa == so, b) {
        // One element against many (a recorded sum's derivative): a flat loop, where the
        // tiled one below would run rows of length 1.
        for (o, &x) in out.iter_mut().zip(a) {
            *o = f(x, *y);
        }
    } else if let (true, [x]) = (sb == so, a) {
        for (o, &y) in out.iter_mut().zip(b) {
            *o = f(*x, y);
        }
    } else if let (true, Some(n)) = (sa == so, tile_len(sb, so)) {
        for (oc, ac) in out.chunks_exact_mut(n).zip(a.chunks_exact(n)) {
            for ((o, &x), &y) in oc.iter_mut().zip(ac).zip(b) {
                *o = f(x, y);
            }
        }
    } else if let (true, Some(n)) = (sb == so, tile_len(sa, so)) {
        for (oc, bc) in out.chunks_exact_mut(n).zip(b.chunks_exact(n)) {
            for ((o, &x), &y) in oc.iter_mut().zip(a).zip(bc) {
                *o = f(x, y);
            }
        }
    } else {
        for_each_broadcast(so, sa, sb, |i, ia, ib| out[i] = f(a[ia], b[ib]));
    }
}

/// `da[ia] += g(dout[i], a[ia], b[ib])`: the gradient of a broadcast binary op with
/// respect to `a`, summed over the dimensions along which `a` was broadcast.
#[inline]
pub(crate) fn binary_grad<T: Float>(
    (dout, so): (&[T], &Shape),
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    da: &mut [T],
    g: impl Fn(T, T, T) -> T,
) {
    simd::run(
        dout.len(),
        #[inline(always)]
        || binary_grad_loop((dout, so), (a, sa), (b, sb), da, g),
    );
}

/// The loops of [`binary_grad`], inlined into its SIMD dispatch.
#[inline(always)]
fn binary_grad_loop<T: Float>(
    (dout, so): (&[T], &Shape),
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    da: &mut [T],
    g: impl Fn(T, T, T) -> T,
) {
    if sa == so && sb == so {
        for (((d, &go), &x), &y) in da.iter_mut().zip(dout).zip(a).zip(b) {
            *d += g(go, x, y);
        }
    } else if let (true, Some(n)) = (sa == so, tile_len(sb, so)) {
        // `a` is full size, `b` repeats every `n` elements.
        for ((dc, gc), ac) in da.chunks_exact_mut(n).zip(dout.chunks_exact(n)).zip(a.chunks_exact(n)) {
            for (((d, &go), &x), &y) in dc.iter_mut().zip(gc).zip(ac).zip(b) {
                *d += g(go, x, y);
            }
        }
    } else if let (true, Some(n)) = (sb == so, tile_len(sa, so)) {
        // `a` repeats every `n` elements: its gradient sums over the repetitions.
        for (gc, bc) in dout.chunks_exact(n).zip(b.chunks_exact(n)) {
            for (((d, &go), &x), &y) in da.iter_mut().zip(gc).zip(a).zip(bc) {
                *d += g(go, x, y);
            }
        }
    } else {
        for_each_broadcast(so, sa, sb, |i, ia, ib| da[ia] += g(dout[i], a[ia], b[ib]));
    }
}

/// Something that applies a scalar function to every element: a recording that fills the
/// arena, an eager tensor op that fills a vector. [`UnaryFn::forward`](crate::UnaryFn)
/// hands each function's formula to one, so the formula is written once and every caller
/// gets a loop monomorphised for it.
pub(crate) trait ElementMap<T> {
    /// What the mapping produces.
    type Out;
    /// Applies `f` to every element.
    fn map(self, f: impl Fn(T) -> T + Sync) -> Self::Out;
    /// As `map` for a long formula, whose loop should run out of line.
    fn map_long(self, f: impl Fn(T) -> T + Sync) -> Self::Out;
}

/// As [`ElementMap`] for a binary function `f(a, b)`.
pub(crate) trait PairMap<T> {
    /// What the mapping produces.
    type Out;
    /// Applies `f` to every pair.
    fn map(self, f: impl Fn(T, T) -> T + Sync) -> Self::Out;
}

/// As [`ElementMap`] for a derivative `f'(x, y)` of `y = f(x)`.
pub(crate) trait GradMap<T> {
    /// What the mapping produces.
    type Out;
    /// Applies `d` to every `(x, y)` pair.
    fn map(self, d: impl Fn(T, T) -> T + Sync) -> Self::Out;
    /// As `map` for a constant derivative `c`.
    fn scale(self, c: T) -> Self::Out;
    /// As `map` for a long derivative, whose loop should run out of line.
    fn map_long(self, d: impl Fn(T, T) -> T + Sync) -> Self::Out;
}

/// `out[i] = f(x[i])`, vectorised for the CPU at hand (see [`simd`]).
#[inline(always)]
pub(crate) fn map<T: Float>(x: &[T], out: &mut [T], f: impl Fn(T) -> T) {
    simd::run(
        x.len(),
        #[inline(always)]
        || {
            for (o, &v) in out.iter_mut().zip(x) {
                *o = f(v);
            }
        },
    );
}

/// `x[i] = f(x[i])` in place, vectorised as [`map`].
#[inline(always)]
pub(crate) fn map_in_place<T: Float>(x: &mut [T], f: impl Fn(T) -> T) {
    simd::run(
        x.len(),
        #[inline(always)]
        || {
            for v in x.iter_mut() {
                *v = f(*v);
            }
        },
    );
}

/// `dx[i] += dout[i] · d(x[i], y[i])` for an elementwise `y = f(x)`. Not under SIMD
/// dispatch: the dispatch check alone cost shape-`[1]` backward 5–9% more instructions
/// (W3, callgrind); the loop still vectorises for the baseline (SSE2), and the
/// derivatives are the same branch-free formulas.
#[inline]
pub(crate) fn map_grad<T: Float>(dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T) {
    map_grad_loop(dout, x, y, dx, d);
}

/// The loop of [`map_grad`], always inlined, so that under dispatch it is compiled for the
/// dispatched instruction set (an out-of-line [`map_grad`] stayed at the baseline one).
#[inline(always)]
fn map_grad_loop<T: Float>(dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T) {
    for (((g, &go), &xv), &yv) in dx.iter_mut().zip(dout).zip(x).zip(y) {
        *g += go * d(xv, yv);
    }
}

/// [`map_grad`] out of line and under SIMD dispatch, for long derivative formulas.
#[inline(never)]
pub(crate) fn map_grad_long<T: Float>(dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T) {
    simd::run(
        dx.len(),
        #[inline(always)]
        || map_grad_loop(dout, x, y, dx, d),
    );
}

/// `dst[i] += src[i]`.
#[inline]
pub(crate) fn add_assign<T: Float>(dst: &mut [T], src: &[T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += s;
    }
}

/// `dst[i] += c · src[i]`.
#[inline]
pub(crate) fn axpy<T: Float>(dst: &mut [T], c: T, src: &[T]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        *d += c * s;
    }
}

/// Sum of all elements, in eight lanes (vectorisable, and more accurate than a running sum).
pub(crate) fn sum<T: Float>(x: &[T]) -> T {
    sum_map(x, |v| v)
}

/// `Σ f(v)` over `x` in [`sum`]'s eight lanes, inlined into its caller (under SIMD dispatch
/// there, it is compiled for the dispatched instruction set).
#[inline(always)]
pub(crate) fn sum_map<T: Float>(x: &[T], f: impl Fn(T) -> T) -> T {
    let mut lanes = [T::ZERO; 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += f(v);
        }
    }
    let mut total = T::ZERO;
    for l in lanes {
        total += l;
    }
    for &v in rest {
        total += f(v);
    }
    total
}

/// `out[o, i] = Σ_l x[o, l, i]` for `x` viewed as `(outer, len, inner)`; `out` is zeroed.
pub(crate) fn sum_axis<T: Float>(x: &[T], (outer, len, inner): (usize, usize, usize), out: &mut [T]) {
    if inner == 1 {
        // The last axis (LayerNorm's mean and variance): each row is one contiguous
        // [`sum`], not `len` one-element slices.
        for (o, row) in out.iter_mut().zip(x.chunks_exact(len.max(1))) {
            *o += sum(row);
        }
        return;
    }
    for o in 0..outer {
        let dst = &mut out[o * inner..(o + 1) * inner];
        for l in 0..len {
            add_assign(dst, &x[(o * len + l) * inner..(o * len + l + 1) * inner]);
        }
    }
}

/// `dx[o, l, i] += dout[o, i]`: the gradient of [`sum_axis`].
pub(crate) fn sum_axis_grad<T: Float>(dout: &[T], (outer, len, inner): (usize, usize, usize), dx: &mut [T]) {
    if inner == 1 {
        for (&g, row) in dout.iter().zip(dx.chunks_exact_mut(len.max(1))) {
            for d in row {
                *d += g;
            }
        }
        return;
    }
    for o in 0..outer {
        let src = &dout[o * inner..(o + 1) * inner];
        for l in 0..len {
            add_assign(&mut dx[(o * len + l) * inner..(o * len + l + 1) * inner], src);
        }
    }
}

/// `out[o, i] = pick_l x[o, l, i]` where `better(candidate, best)` says when to switch.
/// `len` must be at least 1.
pub(crate) fn select_axis<T: Float>(
    x: &[T],
    (outer, len, inner): (usize, usize, usize),
    out: &mut [T],
    better: impl Fn(T, T) -> bool,
) {
    for o in 0..outer {
        for i in 0..inner {
            let mut best = x[o * len * inner + i];
            for l in 1..len {
                let v = x[(o * len + l) * inner + i];
                if better(v, best) {
                    best = v;
                }
            }
            out[o * inner + i] = best;
        }
    }
}

/// Gradient of [`select_axis`]: `dout` goes to the first element equal to the selected one.
pub(crate) fn select_axis_grad<T: Float>(
    dout: &[T],
    x: &[T],
    y: &[T],
    (outer, len, inner): (usize, usize, usize),
    dx: &mut [T],
) {
    for o in 0..outer {
        for i in 0..inner {
            let target = y[o * inner + i];
            for l in 0..len {
                let at = (o * len + l) * inner + i;
                // NaN never equals itself: a NaN result came from the first NaN, which takes
                // the gradient (as PyTorch's index-based backward does).
                if x[at] == target || (target.is_nan() && x[at].is_nan()) {
                    dx[at] += dout[o * inner + i];
                    break;
                }
            }
        }
    }
}

/// `ln Σ exp(row)`, shifted by the row's maximum `m`: NaN if any element is NaN, and `m`
/// itself when it is infinite. Inlined into its caller, so that under SIMD dispatch the
/// maximum and the sum of exponentials run in eight lanes of the dispatched width.
#[inline(always)]
pub(crate) fn row_lse<T: Float>(row: &[T]) -> T {
    let m = max_lanes(row);
    if !m.is_finite() {
        // An infinity, or nothing but NaN and −∞: the NaN-propagating maximum is the answer.
        return nan_max(row.iter().copied());
    }
    // A NaN element makes its exponential NaN, and with it the sum.
    m + sum_map(row, |v| (v - m).exp()).ln()
}

/// The maximum of `x`'s non-NaN values, −∞ if there are none (what a `Float::max` fold
/// gives), in eight lanes of a compare and a select each, which vectorise where `max`'s
/// NaN test does not. Inlined into its caller, so that under SIMD dispatch it is compiled
/// for the dispatched instruction set.
#[inline(always)]
pub(crate) fn max_lanes<T: Float>(x: &[T]) -> T {
    let mut lanes = [T::neg_infinity(); 8];
    let chunks = x.chunks_exact(8);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l = if v > *l { v } else { *l };
        }
    }
    let mut m = T::neg_infinity();
    for v in lanes.into_iter().chain(rest.iter().copied()) {
        m = if v > m { v } else { m };
    }
    m
}

/// The maximum, NaN as soon as one value is NaN (`Float::max` would skip it); −∞ for none.
#[inline]
fn nan_max<T: Float>(values: impl Iterator<Item = T>) -> T {
    values.fold(T::neg_infinity(), |m, v| if !m.is_nan() && (v > m || v.is_nan()) { v } else { m })
}

/// `out[o, i] = log Σ_l exp(x[o, l, i])`, shifted by the maximum for stability.
pub(crate) fn logsumexp_axis<T: Float>(x: &[T], (outer, len, inner): (usize, usize, usize), out: &mut [T]) {
    if inner == 1 && len > 0 {
        // The last axis: contiguous rows, vectorised.
        simd::run(
            x.len(),
            #[inline(always)]
            || {
                for (row, o) in x.chunks_exact(len).zip(out.iter_mut()) {
                    *o = row_lse(row);
                }
            },
        );
        return;
    }
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| x[(o * len + l) * inner + i];
            let m = nan_max((0..len).map(at));
            out[o * inner + i] = if m.is_finite() {
                let mut s = T::ZERO;
                for l in 0..len {
                    s += (at(l) - m).exp();
                }
                m + s.ln()
            } else {
                m
            };
        }
    }
}

/// Softmax along the axis: `y = exp(x - lse)`; with `log`, `y = x - lse`.
pub(crate) fn softmax_axis<T: Float>(x: &[T], dims: (usize, usize, usize), out: &mut [T], log: bool) {
    let (outer, len, inner) = dims;
    if inner == 1 && len > 0 {
        // The last axis (attention rows, class scores): contiguous rows, vectorised.
        for (row, orow) in x.chunks_exact(len).zip(out.chunks_exact_mut(len)) {
            softmax_row(row, orow, log);
        }
        return;
    }
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| (o * len + l) * inner + i;
            let mut m = T::neg_infinity();
            for l in 0..len {
                m = m.max(x[at(l)]);
            }
            let mut s = T::ZERO;
            for l in 0..len {
                s += (x[at(l)] - m).exp();
            }
            let lse = m + s.ln();
            for l in 0..len {
                out[at(l)] = if log { x[at(l)] - lse } else { (x[at(l)] - lse).exp() };
            }
        }
    }
}

/// [`softmax_axis`] of one contiguous row: the exponentials through the vectorised
/// [`map`], their sum in [`sum`]'s lanes.
fn softmax_row<T: Float>(row: &[T], out: &mut [T], log: bool) {
    let m = max_lanes(row);
    map(row, out, move |v| (v - m).exp());
    let lse = m + sum(out).ln();
    if log {
        map(row, out, move |v| v - lse);
    } else {
        map(row, out, move |v| (v - lse).exp());
    }
}

/// Gradient of softmax (`log == false`, `y` the probabilities):
/// `dx += y ⊙ (dy − Σ dy ⊙ y)`; of log-softmax (`y` the log-probabilities):
/// `dx += dy − exp(y) Σ dy`.
#[inline(never)]
pub(crate) fn softmax_axis_grad<T: Float>(dy: &[T], y: &[T], dims: (usize, usize, usize), dx: &mut [T], log: bool) {
    let (outer, len, inner) = dims;
    for o in 0..outer {
        for i in 0..inner {
            let at = |l: usize| (o * len + l) * inner + i;
            let mut s = T::ZERO;
            for l in 0..len {
                s += if log { dy[at(l)] } else { dy[at(l)] * y[at(l)] };
            }
            for l in 0..len {
                dx[at(l)] += if log { dy[at(l)] - y[at(l)].exp() * s } else { y[at(l)] * (dy[at(l)] - s) };
            }
        }
    }
}

/// `out[p] = x[perm-strided p]`: copies `x` (shape `sx`) into `out` (shape `so`, the
/// permuted shape) with the input strides rearranged by `axes`.
pub(crate) fn permute<T: Float>(x: &[T], sx: &Shape, axes: &[usize], so: &Shape, out: &mut [T]) {
    if let Some((m, n)) = swaps_last_two(sx, axes) {
        transpose_tiles(x, m, n, |o, v| out[o] = v);
        return;
    }
    let s = sx.strides();
    let mut st = [0; MAX_RANK];
    for (i, &a) in axes.iter().enumerate() {
        st[i] = s[a];
    }
    for_each2(so, &st, &[0; MAX_RANK], |o, ix, _| out[o] = x[ix]);
}

/// `dx[perm p] += dout[p]`: the gradient of [`permute`].
pub(crate) fn permute_grad<T: Float>(dout: &[T], sx: &Shape, axes: &[usize], so: &Shape, dx: &mut [T]) {
    if let Some((m, n)) = swaps_last_two(sx, axes) {
        // `dout` is `x`'s transpose, `[.., n, m]`: transposing it back adds into `dx`.
        transpose_tiles(dout, n, m, |i, v| dx[i] += v);
        return;
    }
    let s = sx.strides();
    let mut st = [0; MAX_RANK];
    for (i, &a) in axes.iter().enumerate() {
        st[i] = s[a];
    }
    for_each2(so, &st, &[0; MAX_RANK], |o, ix, _| dx[ix] += dout[o]);
}

/// `(m, n)`, the last two dimensions of `sx`, if `axes` swaps them and keeps the rest (a
/// batched matrix transpose, what `t()` and the recorded derivative of matmul record).
fn swaps_last_two(sx: &Shape, axes: &[usize]) -> Option<(usize, usize)> {
    let r = axes.len();
    let swap = r >= 2
        && axes[r - 2] == r - 1
        && axes[r - 1] == r - 2
        && axes[..r - 2].iter().enumerate().all(|(i, &a)| a == i);
    swap.then(|| (sx.dim(r - 2), sx.dim(r - 1)))
}

/// Calls `put(o, x[i])` for every element of each `m×n` matrix of `x` and its position `o`
/// in the `n×m` transpose. Eight output rows at a time, each filled front to back: eight
/// sequential write streams and short contiguous reads. (Square 32×32 tiles were slower:
/// with a power-of-two row length their 32 rows fall in one cache set and evict each other.)
#[inline]
fn transpose_tiles<T: Float>(x: &[T], m: usize, n: usize, mut put: impl FnMut(usize, T)) {
    const ROWS: usize = 8;
    let mn = m * n;
    if mn == 0 {
        return;
    }
    for (b, xb) in x.chunks_exact(mn).enumerate() {
        let base = b * mn;
        for j0 in (0..n).step_by(ROWS) {
            let j1 = (j0 + ROWS).min(n);
            for (i, row) in xb.chunks_exact(n).enumerate() {
                for (j, &v) in row[j0..j1].iter().enumerate() {
                    put(base + (j0 + j) * m + i, v);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Against `ln Σ eˣ` summed in f64 from the unshifted values (a different order
    /// and no shift), for lengths around the 8-lane chunks, and the special values.
    #[test]
    fn row_lse_matches_a_direct_sum_and_keeps_nan_and_infinities() {
        for len in [1usize, 7, 8, 9, 23, 96, 100] {
            let row: Vec<f64> = (0..len).map(|i| ((i * 37 % 11) as f64 - 5.0) * 1.3).collect();
            let direct = row.iter().map(|v| v.exp()).sum::<f64>().ln();
            let got = row_lse(&row);
            assert!((got - direct).abs() < 1e-13, "len {len}: {got} vs {direct}");
            let row32: Vec<f32> = row.iter().map(|&v| v as f32).collect();
            assert!((row_lse(&row32) as f64 - direct).abs() < 1e-5, "f32 len {len}");
            for at in [0, len / 2, len - 1] {
                let mut bad = row.clone();
                bad[at] = f64::NAN;
                assert!(row_lse(&bad).is_nan(), "NaN at {at} of {len}");
                bad[at] = f64::INFINITY;
                assert_eq!(row_lse(&bad), f64::INFINITY, "+inf at {at} of {len}");
                bad[(at + 1) % len] = f64::NAN;
                assert!(len == 1 || row_lse(&bad).is_nan(), "+inf and NaN in {len}");
            }
            assert_eq!(row_lse(&vec![f64::NEG_INFINITY; len]), f64::NEG_INFINITY);
            assert!(row_lse(&vec![f64::NAN; len]).is_nan());
        }
    }

    #[test]
    fn tiled_transpose_matches_the_strided_walk() {
        for dims in [vec![2, 3], vec![33, 70], vec![2, 40, 33], vec![3, 1, 5], vec![0, 4]] {
            let sx = shape(&dims);
            let r = dims.len();
            let mut axes: Vec<usize> = (0..r).collect();
            axes.swap(r - 2, r - 1);
            let mut od = dims.clone();
            od.swap(r - 2, r - 1);
            let so = shape(&od);
            let x: Vec<f64> = (0..sx.numel()).map(|i| i as f64).collect();
            let mut fast = vec![0.0; so.numel()];
            permute(&x, &sx, &axes, &so, &mut fast);
            let mut st = [0; MAX_RANK];
            for (i, &a) in axes.iter().enumerate() {
                st[i] = sx.strides()[a];
            }
            let mut slow = vec![0.0; so.numel()];
            for_each2(&so, &st, &[0; MAX_RANK], |o, ix, _| slow[o] = x[ix]);
            assert_eq!(fast, slow, "{dims:?}");
            let mut back = vec![1.0; sx.numel()];
            permute_grad(&fast, &sx, &axes, &so, &mut back);
            assert_eq!(back, x.iter().map(|v| v + 1.0).collect::<Vec<_>>(), "{dims:?}");
        }
    }

    fn shape(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn broadcast_add_matches_hand_result() {
        // [[1], [2]] + [10, 20, 30] = [[11, 21, 31], [12, 22, 32]]
        let (a, b) = ([1.0f64, 2.0], [10.0, 20.0, 30.0]);
        let mut out = [0.0; 6];
        binary((&a, &shape(&[2, 1])), (&b, &shape(&[3])), (&mut out, &shape(&[2, 3])), |x, y| x + y);
        assert_eq!(out, [11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
    }

    #[test]
    fn tiled_broadcasts_match_the_general_path() {
        // Bias-style broadcasts take the chunked path; compare with index arithmetic.
        for (sa, sb) in
            [(vec![3, 4], vec![4]), (vec![3, 4], vec![1, 4]), (vec![2, 3, 4], vec![3, 4]), (vec![4], vec![3, 4])]
        {
            let (sa, sb) = (shape(&sa), shape(&sb));
            let so = sa.broadcast(&sb).unwrap();
            let a: Vec<f64> = (0..sa.numel()).map(|i| i as f64 * 0.5 - 1.0).collect();
            let b: Vec<f64> = (0..sb.numel()).map(|i| 2.0 - i as f64).collect();
            let dout: Vec<f64> = (0..so.numel()).map(|i| (i % 5) as f64).collect();
            let mut fast = vec![0.0; so.numel()];
            binary((&a, &sa), (&b, &sb), (&mut fast, &so), |x, y| x * y + 1.0);
            let mut slow = vec![0.0; so.numel()];
            for_each_broadcast(&so, &sa, &sb, |i, ia, ib| slow[i] = a[ia] * b[ib] + 1.0);
            assert_eq!(fast, slow);
            for (x, sx, y, sy) in [(&a, &sa, &b, &sb), (&b, &sb, &a, &sa)] {
                let mut fast = vec![0.0; sx.numel()];
                binary_grad((&dout, &so), (x, sx), (y, sy), &mut fast, |d, u, v| d * v + u);
                let mut slow = vec![0.0; sx.numel()];
                for_each_broadcast(&so, sx, sy, |i, ix, iy| slow[ix] += dout[i] * y[iy] + x[ix]);
                assert_eq!(fast, slow);
            }
        }
    }

    #[test]
    fn permute_transposes() {
        let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut out = [0.0; 6];
        permute(&x, &shape(&[2, 3]), &[1, 0], &shape(&[3, 2]), &mut out);
        assert_eq!(out, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
    }

    #[test]
    fn gemm_matches_naive() {
        // [[1, 2], [3, 4]] · [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
        let (a, b) = ([1.0f64, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
        let mut c = [0.0; 4];
        f64::gemm(&mut c, &a, false, &b, false, (2, 2, 2), false, faer::Par::Seq);
        assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
        // aᵀ · b = [[26, 30], [38, 44]], accumulated onto the previous result.
        f64::gemm(&mut c, &a, true, &b, false, (2, 2, 2), true, faer::Par::Seq);
        assert_eq!(c, [45.0, 52.0, 81.0, 94.0]);
    }

    /// Integer-valued `a` (stored `[k, m]`) and `b` (`[k, n]`), and `1 + aᵀ·b` summed
    /// naively: every partial sum is exact, so any order of summation gives these bits.
    fn at_b_problem(m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
        let a: Vec<f64> = (0..k * m).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
        let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 13) as f64 - 6.0).collect();
        let mut want = vec![1.0; m * n];
        for i in 0..m {
            for j in 0..n {
                want[i * n + j] += (0..k).map(|r| a[r * m + i] * b[r * n + j]).sum::<f64>();
            }
        }
        (a, b, want)
    }

    #[test]
    fn narrow_products_match_the_naive_sum() {
        // `a` used transposed, 2 <= n <= 16, m >= 64: the blocked column-major path, with a
        // last block of 88 rows. Integer-valued entries make every sum exact.
        let (m, k) = (600, 50);
        for n in [2, 10, 16, 17] {
            let (a, b, want) = at_b_problem(m, k, n);
            for par in [faer::Par::Seq, faer::Par::rayon(2)] {
                let mut c = vec![1.0; m * n];
                f64::gemm(&mut c, &a, true, &b, false, (m, k, n), true, par);
                assert_eq!(c, want, "n = {n}, accumulated");
                let mut c = vec![f64::NAN; m * n];
                f64::gemm(&mut c, &a, true, &b, false, (m, k, n), false, par);
                assert!(c.iter().zip(&want).all(|(x, w)| *x == w - 1.0), "n = {n}, replaced");
            }
        }
    }

    #[test]
    fn long_reductions_in_k_blocks_match_the_naive_sum() {
        // k = 1100 takes the blocked path (four blocks of 256 and one of 76); integer-valued
        // entries make every partial sum exact, so any order of summation gives these bits.
        let (m, k, n) = (37, 1100, 29);
        let (a, b, want) = at_b_problem(m, k, n);
        for (accumulate, par) in [(true, faer::Par::Seq), (true, faer::Par::rayon(2))] {
            let mut c = vec![1.0; m * n];
            f64::gemm(&mut c, &a, true, &b, false, (m, k, n), accumulate, par);
            assert_eq!(c, want);
        }
        let mut c = vec![f64::NAN; m * n];
        f64::gemm(&mut c, &a, true, &b, false, (m, k, n), false, faer::Par::Seq);
        assert!(c.iter().zip(&want).all(|(x, w)| *x == w - 1.0), "replace ignores the old values");
    }
}
