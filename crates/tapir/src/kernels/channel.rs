//! Broadcasts along leading and middle axes: one value per row of `inner` consecutive
//! elements, cycling through the small operand's `m` values. A per-channel bias or scale
//! `[C, 1, 1]` against `[N, C, H, W]` is the common case (`inner = H·W`, `m = C`); the
//! general index loop took 3.4 ns per element of W11's conv bias, these loops a fraction.
//!
//! Rows are split over threads in pieces of whole rows fixed by the shape, and the small
//! operand's gradient sums each of its values' rows in row order with the same eight
//! lanes per row whatever the split, so the bits do not depend on the thread count.

use faer::Par;

use super::par::{for_chunks, threads, CHUNK, MIN_PARALLEL};
use super::simd;
use crate::dtype::Float;
use crate::shape::Shape;

/// [`par::binary`](super::par::binary), with long per-channel broadcasts taken here.
#[inline]
pub(crate) fn binary<T: Float>(
    par: Par,
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (out, so): (&mut [T], &Shape),
    f: impl Fn(T, T) -> T + Sync,
) {
    if out.len() >= MIN_PARALLEL {
        if let (true, Some((_, inner))) = (sa == so, channel_len(sb, so)) {
            return forward(par, a, b, out, inner, f);
        }
        if let (true, Some((_, inner))) = (sb == so, channel_len(sa, so)) {
            return forward(par, b, a, out, inner, |y, x| f(x, y));
        }
    }
    super::par::binary(par, (a, sa), (b, sb), (out, so), f);
}

/// [`par::binary_grad`](super::par::binary_grad), with long per-channel broadcasts taken
/// here. `first` says that `da`'s elements are unspecified (its first gradient): the
/// full-size operand of a per-channel broadcast then writes `0 + g` (the bits that adding
/// into zeros gives) in one pass, and every other case zero-fills `da` first.
#[inline]
pub(crate) fn binary_grad<T: Float>(
    par: Par,
    (dout, so): (&[T], &Shape),
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (da, first): (&mut [T], bool),
    g: impl Fn(T, T, T) -> T + Sync,
) {
    if dout.len() >= MIN_PARALLEL {
        if let (true, Some((_, inner))) = (sa == so, channel_len(sb, so)) {
            return grad_full(par, dout, a, b, (da, first), inner, g);
        }
    }
    if first {
        super::par::fill(par, da, T::ZERO);
    }
    if dout.len() >= MIN_PARALLEL {
        if let (true, Some((_, inner))) = (sb == so, channel_len(sa, so)) {
            return grad_small(par, dout, a, b, da, inner, g);
        }
    }
    super::par::binary_grad(par, (dout, so), (a, sa), (b, sb), da, g);
}

/// If `small` broadcast to `out` gives one value per row of `inner > 1` consecutive
/// elements of `out`, cycling through `small`'s values (its dimensions, without leading
/// and trailing 1s, equal `out`'s at the same places, with 1s trailing): `(m, inner)`,
/// `m` being `small`'s length.
pub(crate) fn channel_len(small: &Shape, out: &Shape) -> Option<(usize, usize)> {
    let (sd, od) = (small.dims(), out.dims());
    let off = od.len().checked_sub(sd.len())?;
    let end = sd.iter().rposition(|&d| d != 1)? + 1;
    let start = sd.iter().position(|&d| d != 1)?;
    if sd[start..end] != od[off + start..off + end] {
        return None;
    }
    let inner = od[off + end..].iter().try_fold(1usize, |n, &d| n.checked_mul(d as usize))?;
    (inner > 1 && out.numel() > 0).then_some((small.numel(), inner))
}

/// `out[i] = f(full[i], small[(i / inner) mod m])`, rows split over `par`'s threads for
/// long outputs.
pub(crate) fn forward<T: Float>(
    par: Par,
    full: &[T],
    small: &[T],
    out: &mut [T],
    inner: usize,
    f: impl Fn(T, T) -> T + Sync,
) {
    let t = if out.len() < MIN_PARALLEL { 1 } else { threads(par) };
    for_chunks(t, out, (CHUNK / inner).max(1) * inner, &|s, o: &mut [T]| {
        let full = &full[s..s + o.len()];
        simd::run(
            o.len(),
            #[inline(always)]
            || {
                for (r, (oc, xc)) in o.chunks_exact_mut(inner).zip(full.chunks_exact(inner)).enumerate() {
                    let y = small[(s / inner + r) % small.len()];
                    for (o, &x) in oc.iter_mut().zip(xc) {
                        *o = f(x, y);
                    }
                }
            },
        );
    });
}

/// The full-size operand's gradient: `d[i] += g(dout[i], full[i], small[(i / inner) mod m])`,
/// or with `write`, `d[i] = 0 + g(...)` (`d`'s elements unspecified).
pub(crate) fn grad_full<T: Float>(
    par: Par,
    dout: &[T],
    full: &[T],
    small: &[T],
    (d, write): (&mut [T], bool),
    inner: usize,
    g: impl Fn(T, T, T) -> T + Sync,
) {
    let t = if d.len() < MIN_PARALLEL { 1 } else { threads(par) };
    for_chunks(t, d, (CHUNK / inner).max(1) * inner, &|s, dc: &mut [T]| {
        let e = s + dc.len();
        let (gc, xc) = (&dout[s..e], &full[s..e]);
        simd::run(
            dc.len(),
            #[inline(always)]
            || {
                let rows = dc.chunks_exact_mut(inner).zip(gc.chunks_exact(inner)).zip(xc.chunks_exact(inner));
                for (r, ((dr, gr), xr)) in rows.enumerate() {
                    let y = small[(s / inner + r) % small.len()];
                    let pairs = dr.iter_mut().zip(gr).zip(xr);
                    if write {
                        pairs.for_each(|((d, &go), &x)| *d = T::ZERO + g(go, x, y));
                    } else {
                        pairs.for_each(|((d, &go), &x)| *d += g(go, x, y));
                    }
                }
            },
        );
    });
}

/// The most partial sums [`grad_small`] keeps (on the stack) when it splits the outer
/// index into groups.
const GROUP_PARTIALS: usize = 1024;

/// The small operand's gradient: `d[k] += Σ g(dout[i], small[k], full[i])` over the rows
/// `r ≡ k (mod m)`, each row summed in eight lanes. Split over `par`'s threads for long
/// `dout`, in one of two ways chosen by the shape alone, so the bits never depend on the
/// thread count: when the values of `small` span several pieces of about [`CHUNK`]
/// elements of `dout` per outer index, by values, each summing its rows in row order;
/// otherwise (a conv bias: few channels, many images), by runs of the outer index, each
/// run's sums kept apart and then added to `d` in run order.
pub(crate) fn grad_small<T: Float>(
    par: Par,
    dout: &[T],
    small: &[T],
    full: &[T],
    d: &mut [T],
    inner: usize,
    g: impl Fn(T, T, T) -> T + Sync,
) {
    let m = small.len();
    let outer = dout.len() / (m * inner);
    let t = if dout.len() < MIN_PARALLEL { 1 } else { threads(par) };
    // Values per piece: about CHUNK elements of `dout` per outer index.
    let per_piece = (CHUNK / inner).max(1);
    // The outer index's runs: about CHUNK elements of `dout` each, within the partials.
    let runs = (dout.len() / CHUNK).min(outer).min(GROUP_PARTIALS / m.max(1));
    if m > per_piece || runs < 2 || dout.len() < MIN_PARALLEL {
        for_chunks(t, d, per_piece, &|k0, dc: &mut [T]| sum_rows(dout, small, full, (0..outer, k0, inner), dc, &g));
        return;
    }
    let per = outer.div_ceil(runs);
    let runs = outer.div_ceil(per);
    let mut partials = [T::ZERO; GROUP_PARTIALS];
    for_chunks(t, &mut partials[..runs * m], m, &|s, p: &mut [T]| {
        let first = s / m * per;
        sum_rows(dout, small, full, (first..outer.min(first + per), 0, inner), p, &g);
    });
    for (k, dk) in d.iter_mut().enumerate() {
        let mut acc = partials[k];
        for r in 1..runs {
            acc += partials[r * m + k];
        }
        *dk += acc;
    }
}

/// `dc[kk] += Σ_o row_sum(row (o, k0 + kk))` over the outer indices `outers`, in order.
#[inline(always)]
fn sum_rows<T: Float>(
    dout: &[T],
    small: &[T],
    full: &[T],
    (outers, k0, inner): (std::ops::Range<usize>, usize, usize),
    dc: &mut [T],
    g: &(impl Fn(T, T, T) -> T + Sync),
) {
    let m = small.len();
    simd::run(
        dc.len() * inner * outers.len(),
        #[inline(always)]
        || {
            for o in outers {
                for (kk, dk) in dc.iter_mut().enumerate() {
                    let k = k0 + kk;
                    let at = (o * m + k) * inner;
                    *dk += row_sum(&dout[at..at + inner], small[k], &full[at..at + inner], g);
                }
            }
        },
    );
}

/// `Σ g(dout[j], y, full[j])` in eight lanes added pairwise at the end.
#[inline(always)]
fn row_sum<T: Float>(dout: &[T], y: T, full: &[T], g: &impl Fn(T, T, T) -> T) -> T {
    const LANES: usize = 8;
    let mut acc = [T::ZERO; LANES];
    let (gc, xc) = (dout.chunks_exact(LANES), full.chunks_exact(LANES));
    let (gr, xr) = (gc.remainder(), xc.remainder());
    for (gs, xs) in gc.zip(xc) {
        for l in 0..LANES {
            acc[l] += g(gs[l], y, xs[l]);
        }
    }
    for (l, (&go, &x)) in gr.iter().zip(xr).enumerate() {
        acc[l] += g(go, y, x);
    }
    ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(d: &[usize]) -> Shape {
        Shape::new(d).unwrap()
    }

    #[test]
    fn channel_shapes_are_found_and_others_are_not() {
        assert_eq!(channel_len(&s(&[16, 1, 1]), &s(&[4, 16, 8, 8])), Some((16, 64)));
        assert_eq!(channel_len(&s(&[1, 16, 1, 1]), &s(&[4, 16, 8, 8])), Some((16, 64)));
        assert_eq!(channel_len(&s(&[4, 1, 1, 1]), &s(&[4, 16, 8, 8])), Some((4, 1024)));
        assert_eq!(channel_len(&s(&[16, 8, 1]), &s(&[4, 16, 8, 3])), Some((128, 3)));
        // A trailing run is a tile, not a channel; a gap of 1s inside is neither.
        assert_eq!(channel_len(&s(&[8, 8]), &s(&[4, 16, 8, 8])), None);
        assert_eq!(channel_len(&s(&[16, 1, 8]), &s(&[4, 16, 8, 8])), None);
        assert_eq!(channel_len(&s(&[1, 1]), &s(&[4, 16])), None);
        assert_eq!(channel_len(&s(&[3, 1]), &s(&[4, 16])), None);
        assert_eq!(channel_len(&s(&[16, 1]), &s(&[0, 16, 5])), None);
    }
}
