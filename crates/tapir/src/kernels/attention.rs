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
    let (ld, scale) = (3 * dims.c(), dims.scale::<T>());
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
            for hi in 0..h {
                let at = (b * h + hi) * t * t;
                let dsh = &ds[at..at + t * t];
                product(&mut dseq[hi * d..], ld, dsh, t, false, dims.block(seq, 1, hi), ld, false, (t, t, d), true);
                let c = dims.c();
                product(&mut dseq[c + hi * d..], ld, dsh, t, true, dims.block(seq, 0, hi), ld, false, (t, t, d), true);
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
            for hi in 0..h {
                let at = (b * h + hi) * t * t;
                product(
                    &mut ob[hi * d..],
                    c,
                    &p[at..at + t * t],
                    t,
                    false,
                    dims.block(seq, 2, hi),
                    ld,
                    false,
                    (t, t, d),
                    false,
                );
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
            for (hi, dph) in dpb.chunks_exact_mut(t * t).enumerate() {
                product(dph, t, &g[hi * d..], c, false, dims.block(seq, 2, hi), ld, true, (t, d, t), true);
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
            for hi in 0..h {
                let at = (b * h + hi) * t * t;
                product(
                    &mut dseq[2 * c + hi * d..],
                    ld,
                    &p[at..at + t * t],
                    t,
                    true,
                    &g[hi * d..],
                    c,
                    false,
                    (t, t, d),
                    true,
                );
            }
        },
    );
}

/// A matrix operand of [`product`] as [`Float::gemm_strided`] takes it: `rows × cols` as
/// used, stored row-major with `ld` elements between row starts, transposed when `t`.
#[derive(Clone, Copy)]
struct Operand<'a, T> {
    x: &'a [T],
    ld: usize,
    t: bool,
    rows: usize,
    cols: usize,
}

impl<T: Float> Operand<'_, T> {
    /// Rows and columns as stored.
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
        (0..rows).all(|r| self.x[r * self.ld..r * self.ld + cols].iter().fold(true, |ok, v| ok & v.is_finite()))
    }

    /// `x` up to the matrix's last element, each NaN or infinity replaced by `0`.
    fn finite_copy(&self) -> Vec<T> {
        let (rows, cols) = self.stored();
        let span = (rows - 1) * self.ld + cols;
        self.x[..span].iter().map(|&v| if v.is_finite() { v } else { T::ZERO }).collect()
    }
}

/// `dst ← op(a)·op(b)` (`+ dst` if `accumulate`), with [`Float::gemm_strided`]'s
/// arguments and strong zeros: a term `a_il·b_lj` with one factor `0` and the other NaN or
/// infinite is skipped, not computed as NaN. With finite operands (every call without NaN
/// or infinity) this is the one faer call, bit for bit.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn product<T: Float>(
    dst: &mut [T],
    ld_dst: usize,
    a: &[T],
    lda: usize,
    a_t: bool,
    b: &[T],
    ldb: usize,
    b_t: bool,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    let oa = Operand { x: a, ld: lda, t: a_t, rows: m, cols: k };
    let ob = Operand { x: b, ld: ldb, t: b_t, rows: k, cols: n };
    if m == 0 || k == 0 || n == 0 || (oa.finite() && ob.finite()) {
        T::gemm_strided(dst, ld_dst, a, lda, a_t, b, ldb, b_t, (m, k, n), accumulate);
    } else {
        product_skipping(dst, ld_dst, oa, ob, (m, k, n), accumulate);
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
fn product_skipping<T: Float>(
    dst: &mut [T],
    ld_dst: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) {
    let dst = &mut dst[..(m - 1) * ld_dst + n];
    let (a0, b0) = (a.finite_copy(), b.finite_copy());
    let mut skipped = dst.to_vec();
    T::gemm_strided(&mut skipped, ld_dst, &a0, a.ld, a.t, &b0, b.ld, b.t, (m, k, n), accumulate);
    T::gemm_strided(dst, ld_dst, a.x, a.ld, a.t, b.x, b.ld, b.t, (m, k, n), accumulate);
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
