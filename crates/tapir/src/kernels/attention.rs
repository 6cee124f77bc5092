//! Multi-head scaled dot-product attention over a packed `qkv: [B, T, 3C]` (see
//! `ops/attention.rs` for the formulas). Head `h`'s query, key and value are the column
//! blocks `[h·D, (h+1)·D)`, `C + …` and `2C + …` of each row, read in place as strided
//! faer views (row stride `3C`): nothing is split, permuted or copied.
//!
//! Work is spread over the graph's threads one sequence `b` at a time (a block of the
//! output that no other sequence touches), every product in it a sequential faer call and
//! every row computed whole by one call, so the bits do not depend on the thread count.
//!
//! Non-finite values: every product here, and the softmax backward's row sums, skip a term
//! with a factor exactly `0` instead of computing `0·NaN` or `0·∞` (a *strong zero*). The
//! weight `0` of a key that a causal row does not see therefore never multiplies that key's
//! value or key, and a row whose output gradient is `0` sends nothing back through weights
//! that are NaN, so a NaN at position `t` reaches only the rows that see it (rows `≥ t`),
//! in the values and in the gradients. Inputs without NaN or infinity take the plain faer
//! calls; only a product with a non-finite operand goes through [`product_skipping`], whose
//! finite results are faer's sums bit for bit.

use faer::Par;

use super::{par, simd};
use crate::dtype::Float;

/// `B` sequences of `T` positions, `H` heads of `D` elements (`C = H·D`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AttnDims {
    pub b: usize,
    pub t: usize,
    pub h: usize,
    pub d: usize,
}

impl AttnDims {
    /// Width `C = H·D`.
    fn c(&self) -> usize {
        self.h * self.d
    }

    /// `1/√D`.
    pub(crate) fn scale<T: Float>(&self) -> T {
        T::from_f64(1.0 / (self.d as f64).sqrt())
    }

    /// Keys row `i` attends to: `0..=i` when causal, else all.
    #[inline(always)]
    fn keys(&self, i: usize, causal: bool) -> usize {
        if causal {
            i + 1
        } else {
            self.t
        }
    }

    /// Head `h`'s block of a `[T, 3C]` sequence: query (`part` 0), key (1) or value (2),
    /// from its first element to the end of the sequence.
    #[inline]
    fn block<'a, T>(&self, seq: &'a [T], part: usize, h: usize) -> &'a [T] {
        &seq[part * self.c() + h * self.d..]
    }

    /// Runs `f(b, block)` for every sequence's block of `len_per_seq` elements of `dst`,
    /// over the threads when the work is large, under SIMD dispatch. A closure with loops
    /// of its own (not only faer calls) must be `#[inline(always)]`, or LLVM may compile it
    /// out of line for the baseline (docs/kernels.md, "Dispatch").
    fn per_seq<T: Float>(&self, par: Par, dst: &mut [T], len_per_seq: usize, f: impl Fn(usize, &mut [T]) + Sync) {
        let work = self.b * self.h * self.t * self.t * self.d;
        let threads = if work < par::MIN_PARALLEL * 8 { 1 } else { par::threads(par) };
        par::for_chunks(threads, dst, len_per_seq, &|s, block: &mut [T]| {
            simd::run(
                block.len(),
                #[inline(always)]
                || f(s / len_per_seq, block),
            )
        });
    }
}

/// `p[b, h, i, :] = softmax_j(q_i · k_j / √D)` over keys `j ≤ i` (causal) or all `j`, and
/// exactly `0` for the keys a causal row does not see. `p: [B, H, T, T]`.
pub(crate) fn weights<T: Float>(par: Par, dims: AttnDims, qkv: &[T], causal: bool, p: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (ld, scale) = (3 * dims.c(), dims.scale::<T>());
    if t == 0 || h == 0 {
        return;
    }
    dims.per_seq(
        par,
        p,
        h * t * t,
        #[inline(always)]
        |b, pb| {
            let seq = &qkv[b * t * ld..(b + 1) * t * ld];
            for (hi, ph) in pb.chunks_exact_mut(t * t).enumerate() {
                // ph = q_h · k_hᵀ
                T::gemm_strided(
                    ph,
                    t,
                    dims.block(seq, 0, hi),
                    ld,
                    false,
                    dims.block(seq, 1, hi),
                    ld,
                    true,
                    (t, d, t),
                    false,
                );
                for (i, row) in ph.chunks_exact_mut(t).enumerate() {
                    let (seen, unseen) = row.split_at_mut(dims.keys(i, causal));
                    softmax_in_place(seen, scale);
                    unseen.fill(T::ZERO);
                }
            }
        },
    );
}

/// `row ← softmax(scale · row)`, shifted by the row's maximum.
#[inline(always)]
fn softmax_in_place<T: Float>(row: &mut [T], scale: T) {
    let m = super::reduce::max_lanes(row);
    for v in row.iter_mut() {
        *v = ((*v - m) * scale).exp();
    }
    let inv = T::ONE / super::reduce::sum(row);
    for v in row.iter_mut() {
        *v *= inv;
    }
}

/// Backward of [`weights`] into the query and key blocks of `dqkv`, with `dp` the
/// gradient of `p`. First `ds = scale · p ⊙ (dp − Σ_j dp ⊙ p)` row by row (zero where `p`
/// is, even where `dp` is NaN: strong zeros, see the module doc), for every head (`ds`:
/// scratch of `p`'s size); then per sequence and head `dq_h += ds · k_h` and
/// `dk_h += dsᵀ · q_h`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn weights_backward<T: Float>(
    par: Par,
    dims: AttnDims,
    qkv: &[T],
    p: &[T],
    dp: &[T],
    dqkv: &mut [T],
    ds: &mut [T],
) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld, scale) = (dims.c(), 3 * dims.c(), dims.scale::<T>());
    if t == 0 || h == 0 {
        return;
    }
    dims.per_seq(
        par,
        ds,
        h * t * t,
        #[inline(always)]
        |b, dsb| {
            let at = b * h * t * t;
            let rows = p[at..at + dsb.len()].chunks_exact(t).zip(dp[at..at + dsb.len()].chunks_exact(t));
            for (o, (pr, dpr)) in dsb.chunks_exact_mut(t).zip(rows) {
                let dot = super::reduce::sum(mul_rows(pr, dpr, o));
                // A NaN or infinity in `p` or `dp` makes `dot` non-finite (as `0·NaN` does):
                // only then is the row worth the strong zeros.
                if !dot.is_finite() {
                    ds_row_skipping(pr, dpr, o, scale);
                    continue;
                }
                for ((o, &pv), &dv) in o.iter_mut().zip(pr).zip(dpr) {
                    *o = scale * pv * (dv - dot);
                }
            }
        },
    );
    let ds = &*ds;
    dims.per_seq(
        par,
        dqkv,
        t * ld,
        #[inline(always)]
        |b, dseq| {
            let seq = &qkv[b * t * ld..(b + 1) * t * ld];
            // One scan of the sequence's queries and keys serves every head, and one of
            // `ds_h` both of its products.
            let qk_finite = finite_cols(seq, ld, 0..2 * c);
            for hi in 0..h {
                let at = (b * h + hi) * t * t;
                let (ds_h, ds_ht) = (Operand::new(&ds[at..], t, false, t, t), Operand::new(&ds[at..], t, true, t, t));
                let k = Operand::new(dims.block(seq, 1, hi), ld, false, t, d);
                let q = Operand::new(dims.block(seq, 0, hi), ld, false, t, d);
                let ds_finite = ds_h.finite();
                product(&mut dseq[hi * d..], ld, ds_h, k, true, ds_finite && (qk_finite || k.finite()));
                product(&mut dseq[c + hi * d..], ld, ds_ht, q, true, ds_finite && (qk_finite || q.finite()));
            }
        },
    );
}

/// One row of `ds` (see [`weights_backward`]) with strong zeros: a product `p·dp` or
/// `p·(dp − dot)` with a factor `0` is `0` even when the other is NaN or infinite. The
/// products of finite factors are those of the plain loop, so a row whose non-finite
/// `dp` sit where `p` is `0` (the keys a causal row does not see) gets the bits it would
/// have with finite ones there.
#[cold]
#[inline(never)]
fn ds_row_skipping<T: Float>(p: &[T], dp: &[T], ds: &mut [T], scale: T) {
    for ((o, &pv), &dv) in ds.iter_mut().zip(p).zip(dp) {
        *o = strong_mul(pv, dv);
    }
    let dot = super::reduce::sum(ds);
    for ((o, &pv), &dv) in ds.iter_mut().zip(p).zip(dp) {
        let diff = dv - dot;
        *o = if skips(pv, diff) { T::ZERO } else { scale * pv * diff };
    }
}

/// Whether the term `x·y` is skipped: one factor is `0` and the other NaN or infinite.
#[inline(always)]
fn skips<T: Float>(x: T, y: T) -> bool {
    (x == T::ZERO && !y.is_finite()) || (y == T::ZERO && !x.is_finite())
}

/// `x·y`, or `0` for a skipped term (see [`skips`]).
#[inline(always)]
fn strong_mul<T: Float>(x: T, y: T) -> T {
    if skips(x, y) {
        T::ZERO
    } else {
        x * y
    }
}

/// `out = a ⊙ b`, returned for a sum.
#[inline(always)]
fn mul_rows<'o, T: Float>(a: &[T], b: &[T], out: &'o mut [T]) -> &'o [T] {
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x * y;
    }
    out
}

/// `out[b, :, h·D..] = p_bh · v_h`: the heads' mixtures of values, `out: [B, T, C]`.
pub(crate) fn attend<T: Float>(par: Par, dims: AttnDims, p: &[T], qkv: &[T], out: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld) = (dims.c(), 3 * dims.c());
    if t == 0 || c == 0 {
        return;
    }
    dims.per_seq(
        par,
        out,
        t * c,
        #[inline(always)]
        |b, ob| {
            let seq = &qkv[b * t * ld..(b + 1) * t * ld];
            let head = |hi: usize| {
                let at = (b * h + hi) * t * t;
                (Operand::new(&p[at..], t, false, t, t), Operand::new(dims.block(seq, 2, hi), ld, false, t, d))
            };
            for hi in 0..h {
                let (ph, v) = head(hi);
                gemm(&mut ob[hi * d..], c, ph, v, false);
            }
            // A product is finite exactly when none of its terms is NaN or infinite (or it
            // overflowed), so the output, `T × C` elements against the operands'
            // `H·T² + T·C`, says whether a strong zero could change it.
            if all_finite(ob) {
                return;
            }
            for hi in 0..h {
                let ((ph, v), oh) = (head(hi), &mut ob[hi * d..]);
                if !Operand::new(&*oh, c, false, t, d).finite() {
                    product_skipping(oh, c, ph, v, false);
                }
            }
        },
    );
}

/// Backward of [`attend`] into the weights: `dp_bh += dout_bh · v_hᵀ`.
pub(crate) fn attend_backward_p<T: Float>(par: Par, dims: AttnDims, dout: &[T], qkv: &[T], dp: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld) = (dims.c(), 3 * dims.c());
    if t == 0 || c == 0 {
        return;
    }
    dims.per_seq(
        par,
        dp,
        h * t * t,
        #[inline(always)]
        |b, dpb| {
            let (seq, g) = (&qkv[b * t * ld..(b + 1) * t * ld], &dout[b * t * c..(b + 1) * t * c]);
            // One scan of the sequence's output gradient and values serves every head.
            let finite = all_finite(g) && finite_cols(seq, ld, 2 * c..3 * c);
            for (hi, dph) in dpb.chunks_exact_mut(t * t).enumerate() {
                let (gh, vt) =
                    (Operand::new(&g[hi * d..], c, false, t, d), Operand::new(dims.block(seq, 2, hi), ld, true, d, t));
                product(dph, t, gh, vt, true, finite || (gh.finite() && vt.finite()));
            }
        },
    );
}

/// Backward of [`attend`] into the value blocks of `dqkv`: `dv_h += p_bhᵀ · dout_bh`.
pub(crate) fn attend_backward_v<T: Float>(par: Par, dims: AttnDims, dout: &[T], p: &[T], dqkv: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld) = (dims.c(), 3 * dims.c());
    if t == 0 || c == 0 {
        return;
    }
    dims.per_seq(
        par,
        dqkv,
        t * ld,
        #[inline(always)]
        |b, dseq| {
            let g = &dout[b * t * c..(b + 1) * t * c];
            let g_finite = all_finite(g);
            for hi in 0..h {
                let at = (b * h + hi) * t * t;
                let (pt, gh) = (Operand::new(&p[at..], t, true, t, t), Operand::new(&g[hi * d..], c, false, t, d));
                product(&mut dseq[2 * c + hi * d..], ld, pt, gh, true, pt.finite() && (g_finite || gh.finite()));
            }
        },
    );
}

/// A matrix operand of a product as [`Float::gemm_strided`] takes it: `rows × cols` as
/// used, stored row-major from the start of `x` with `ld` elements between row starts,
/// transposed when `t`.
#[derive(Clone, Copy)]
struct Operand<'a, T> {
    x: &'a [T],
    ld: usize,
    t: bool,
    rows: usize,
    cols: usize,
}

impl<'a, T: Float> Operand<'a, T> {
    #[inline(always)]
    fn new(x: &'a [T], ld: usize, t: bool, rows: usize, cols: usize) -> Self {
        Operand { x, ld, t, rows, cols }
    }

    /// Rows and columns as stored.
    #[inline(always)]
    fn stored(&self) -> (usize, usize) {
        if self.t {
            (self.cols, self.rows)
        } else {
            (self.rows, self.cols)
        }
    }

    /// Element `(i, j)` as used.
    #[inline(always)]
    fn at(&self, i: usize, j: usize) -> T {
        if self.t {
            self.x[j * self.ld + i]
        } else {
            self.x[i * self.ld + j]
        }
    }

    /// Whether every element of the matrix (not of the rest of `x`) is finite.
    #[inline(always)]
    fn finite(&self) -> bool {
        let (rows, cols) = self.stored();
        rows == 0 || cols == 0 || finite_cols(&self.x[..(rows - 1) * self.ld + cols], self.ld, 0..cols)
    }

    /// `x` up to the matrix's last element, each NaN or infinity replaced by `0`.
    fn finite_copy(&self) -> Vec<T> {
        let (rows, cols) = self.stored();
        let span = (rows - 1) * self.ld + cols;
        self.x[..span].iter().map(|&v| if v.is_finite() { v } else { T::ZERO }).collect()
    }
}

/// Whether every element of `x` is finite: `0·v` is `±0` for a finite `v` and NaN
/// otherwise. Summed in 32 lanes, the vector adds do not wait on each other: 0.028 ns per
/// element of a 4096-element `f32` slice, against 0.062 in 8 lanes and 0.070 for a fold of
/// `is_finite` (built for x86-64-v3, the 2-core machine).
#[inline(always)]
fn all_finite<T: Float>(x: &[T]) -> bool {
    let mut lanes = [T::ZERO; 32];
    let chunks = x.chunks_exact(32);
    let rest = chunks.remainder();
    for c in chunks {
        for (l, &v) in lanes.iter_mut().zip(c) {
            *l += v * T::ZERO;
        }
    }
    // A lane is `±0` or NaN, and so is `0` times it.
    lanes.iter().chain(rest).all(|&v| v * T::ZERO == T::ZERO)
}

/// Whether columns `cols` of every row of the row-major `x` (rows `ld` apart, the last
/// one perhaps ending at `cols.end`) are finite: one scan when they are whole rows.
#[inline(always)]
fn finite_cols<T: Float>(x: &[T], ld: usize, cols: std::ops::Range<usize>) -> bool {
    if cols.start == 0 && cols.end == ld {
        return all_finite(x);
    }
    (0..x.len().div_ceil(ld)).all(|r| all_finite(&x[r * ld + cols.start..(r * ld + cols.end).min(x.len())]))
}

/// `dst ← a·b` (`+ dst` if `accumulate`), `dst` row-major with `ld_dst` between rows: the
/// one faer call.
#[inline(always)]
fn gemm<T: Float>(dst: &mut [T], ld_dst: usize, a: Operand<'_, T>, b: Operand<'_, T>, accumulate: bool) {
    T::gemm_strided(dst, ld_dst, a.x, a.ld, a.t, b.x, b.ld, b.t, (a.rows, a.cols, b.cols), accumulate);
}

/// `dst ← a·b` (`+ dst` if `accumulate`) with strong zeros: a term `a_il·b_lj` with one
/// factor `0` and the other NaN or infinite is skipped, not computed as NaN. `finite`
/// says that both operands are finite (the caller scans each once); then this is the one
/// faer call, bit for bit.
#[inline(always)]
fn product<T: Float>(
    dst: &mut [T],
    ld_dst: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    accumulate: bool,
    finite: bool,
) {
    if finite {
        gemm(dst, ld_dst, a, b, accumulate);
    } else {
        product_skipping(dst, ld_dst, a, b, accumulate);
    }
}

/// [`product`] with a non-finite operand. An element of `dst` that some term with a
/// non-finite factor and a non-zero partner reaches is non-finite whatever is skipped, and
/// gets the plain product's value. Every other element gets the product of copies of the
/// operands in which each NaN and infinity is `0`, with the same strides and from the same
/// `dst`: faer computes each element from its own row and column only, so that element has
/// the bits it would have with any finite values in place of the skipped ones (up to the
/// sign of a zero term, which changes no sum that has a non-zero term). Allocates its
/// copies: a run that meets NaN is not the steady state that the allocation tests watch.
#[cold]
#[inline(never)]
fn product_skipping<T: Float>(dst: &mut [T], ld_dst: usize, a: Operand<'_, T>, b: Operand<'_, T>, accumulate: bool) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if m == 0 || k == 0 || n == 0 {
        gemm(dst, ld_dst, a, b, accumulate);
        return;
    }
    let dst = &mut dst[..(m - 1) * ld_dst + n];
    let (a0, b0) = (a.finite_copy(), b.finite_copy());
    let mut skipped = dst.to_vec();
    gemm(&mut skipped, ld_dst, Operand { x: &a0, ..a }, Operand { x: &b0, ..b }, accumulate);
    gemm(dst, ld_dst, a, b, accumulate);
    let mut reached = vec![false; m * n];
    for i in 0..m {
        for l in (0..k).filter(|&l| !a.at(i, l).is_finite()) {
            for j in (0..n).filter(|&j| b.at(l, j) != T::ZERO) {
                reached[i * n + j] = true;
            }
        }
    }
    for l in 0..k {
        for j in (0..n).filter(|&j| !b.at(l, j).is_finite()) {
            for i in (0..m).filter(|&i| a.at(i, l) != T::ZERO) {
                reached[i * n + j] = true;
            }
        }
    }
    for i in 0..m {
        for j in (0..n).filter(|&j| !reached[i * n + j]) {
            dst[i * ld_dst + j] = skipped[i * ld_dst + j];
        }
    }
}
