//! Reductions along an axis, viewed as `(outer, len, inner)`: sums, the selection of
//! `max`/`min`, `logsumexp` and softmax, with their gradients, and the lane-wise sums they
//! share.

use crate::dtype::Float;
use crate::kernels::simd;
use crate::kernels::{add_assign, map};

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
