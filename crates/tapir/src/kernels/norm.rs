//! Layer normalisation over rows of `c` elements (see `ops/norm.rs` for the formulas).
//! Rows are split over the graph's threads in chunks that depend only on the shapes, and
//! each row is computed whole by one call, so the bits do not depend on the thread count;
//! the parameter gradients sum their rows in order on the calling thread.

use faer::Par;

use super::{par, simd};
use crate::dtype::Float;

/// The mean of a row and `1/√(σ² + eps)`, `σ²` by a second pass over `x − μ`.
#[inline(always)]
fn stats<T: Float>(row: &[T], eps: T) -> (T, T) {
    let n = T::from_usize(row.len());
    let mean = super::reduce::sum_map(row, move |v| v) / n;
    let var = super::reduce::sum_map(row, move |v| (v - mean) * (v - mean)) / n;
    (mean, T::ONE / (var + eps).sqrt())
}

/// Runs `f(first_row, rows_of_out)` over pieces of `out` holding whole rows of `per_row`
/// elements each (`per_row` of `out` per row of the input), on `par`'s threads when the
/// input (`len` elements) is large, each piece under SIMD dispatch.
fn rows<T: Float>(par: Par, len: usize, c: usize, out: &mut [T], per_row: usize, f: impl Fn(usize, &mut [T]) + Sync) {
    let chunk = par::row_chunk(c) * per_row;
    let threads = if len < par::MIN_PARALLEL { 1 } else { par::threads(par) };
    par::for_chunks(threads, out, chunk, &|s, piece: &mut [T]| {
        simd::run(
            piece.len() * c / per_row.max(1),
            #[inline(always)]
            || f(s / per_row, piece),
        )
    });
}

/// `out = (x − μ)·r ⊙ w + b` row by row.
pub(crate) fn forward<T: Float>(par: Par, x: &[T], w: &[T], b: &[T], eps: T, out: &mut [T]) {
    let c = w.len();
    if c == 0 {
        return;
    }
    rows(
        par,
        x.len(),
        c,
        out,
        c,
        #[inline(always)]
        move |r0, o| {
            for (k, orow) in o.chunks_exact_mut(c).enumerate() {
                let row = &x[(r0 + k) * c..(r0 + k + 1) * c];
                let (mean, rstd) = stats(row, eps);
                for (((o, &v), &wv), &bv) in orow.iter_mut().zip(row).zip(w).zip(b) {
                    *o = (v - mean) * rstd * wv + bv;
                }
            }
        },
    );
}

/// `stats[2i] = μ`, `stats[2i + 1] = r` of every row of `x`.
pub(crate) fn row_stats<T: Float>(par: Par, x: &[T], c: usize, eps: T, stats_out: &mut [T]) {
    rows(
        par,
        x.len(),
        c,
        stats_out,
        2,
        #[inline(always)]
        move |r0, st| {
            for (k, s) in st.chunks_exact_mut(2).enumerate() {
                let (mean, rstd) = stats(&x[(r0 + k) * c..(r0 + k + 1) * c], eps);
                s[0] = mean;
                s[1] = rstd;
            }
        },
    );
}

/// `dx += r·(ĝ − mean(ĝ) − x̂ ⊙ mean(ĝ ⊙ x̂))` with `ĝ = g ⊙ w`, row by row.
pub(crate) fn backward_x<T: Float>(par: Par, g: &[T], x: &[T], w: &[T], st: &[T], dx: &mut [T]) {
    let c = w.len();
    let n = T::from_usize(c);
    rows(
        par,
        x.len(),
        c,
        dx,
        c,
        #[inline(always)]
        move |r0, d| {
            for (k, drow) in d.chunks_exact_mut(c).enumerate() {
                let i = r0 + k;
                let (row, grow) = (&x[i * c..(i + 1) * c], &g[i * c..(i + 1) * c]);
                let (mean, rstd) = (st[2 * i], st[2 * i + 1]);
                // Σ ĝ and Σ ĝ ⊙ x̂ in eight lanes each.
                let (mut s1, mut s2) = ([T::ZERO; 8], [T::ZERO; 8]);
                let whole = c / 8 * 8;
                for ((gc, wc), xc) in
                    grow[..whole].chunks_exact(8).zip(w[..whole].chunks_exact(8)).zip(row[..whole].chunks_exact(8))
                {
                    for l in 0..8 {
                        let gw = gc[l] * wc[l];
                        s1[l] += gw;
                        s2[l] += gw * ((xc[l] - mean) * rstd);
                    }
                }
                let (mut a, mut bsum) = (T::ZERO, T::ZERO);
                for l in 0..8 {
                    a += s1[l];
                    bsum += s2[l];
                }
                for j in whole..c {
                    let gw = grow[j] * w[j];
                    a += gw;
                    bsum += gw * ((row[j] - mean) * rstd);
                }
                let (a, bsum) = (a / n, bsum / n);
                for (((dv, &gv), &wv), &v) in drow.iter_mut().zip(grow).zip(w).zip(row) {
                    *dv += rstd * (gv * wv - a - (v - mean) * rstd * bsum);
                }
            }
        },
    );
}

/// `dw += Σ_rows g ⊙ x̂`, rows in order.
pub(crate) fn backward_w<T: Float>(g: &[T], x: &[T], st: &[T], dw: &mut [T]) {
    let c = dw.len();
    simd::run(
        x.len(),
        #[inline(always)]
        || {
            for (i, (row, grow)) in x.chunks_exact(c).zip(g.chunks_exact(c)).enumerate() {
                let (mean, rstd) = (st[2 * i], st[2 * i + 1]);
                for ((d, &gv), &v) in dw.iter_mut().zip(grow).zip(row) {
                    *d += gv * ((v - mean) * rstd);
                }
            }
        },
    );
}

/// `db += Σ_rows g`, rows in order.
pub(crate) fn backward_b<T: Float>(g: &[T], db: &mut [T]) {
    let c = db.len();
    simd::run(
        g.len(),
        #[inline(always)]
        || {
            for grow in g.chunks_exact(c) {
                super::add_assign(db, grow);
            }
        },
    );
}
