//! Slice-in, slice-out math. Kernels never see `NodeId`s, scopes or the tape: shapes and
//! slices in, slices out. Graph ops and eager [`Tensor`](crate::Tensor) ops share them.

#[cfg(test)]
mod accuracy;
pub(crate) mod attention;
pub(crate) mod binary_fn;
pub(crate) mod channel;
mod float;
pub(crate) mod layout;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod par;
pub(crate) mod reduce;
pub(crate) mod scalar;
pub(crate) mod simd;
#[cfg(test)]
mod tests;
pub(crate) mod unary_fn;
pub(crate) mod vmath;

use crate::dtype::Float;
use crate::shape::{Shape, MAX_RANK};

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

/// `dx[i] = 0 + dout[i] · d(x[i], y[i])`: [`map_grad`] into a first gradient, whose
/// elements are unspecified, under SIMD dispatch. Adding to zero gives the accumulating
/// path's bits (`0 + (−0) = +0`).
#[inline(never)]
pub(crate) fn map_grad_write<T: Float>(dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T) {
    simd::run(
        dx.len(),
        #[inline(always)]
        || {
            for (((g, &go), &xv), &yv) in dx.iter_mut().zip(dout).zip(x).zip(y) {
                *g = T::ZERO + go * d(xv, yv);
            }
        },
    );
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
