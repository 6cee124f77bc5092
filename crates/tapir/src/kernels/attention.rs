//! Multi-head scaled dot-product attention over a packed `qkv: [B, T, 3C]` (see
//! `ops/attention.rs` for the formulas). Head `h`'s query, key and value are the column
//! blocks `[h·D, (h+1)·D)`, `C + …` and `2C + …` of each row, read in place as strided
//! faer views (row stride `3C`): nothing is split, permuted or copied.
//!
//! Work is spread over the graph's threads one sequence `b` at a time (a block of the
//! output that no other sequence touches), every product in it a sequential faer call and
//! every row computed whole by one call, so the bits do not depend on the thread count.

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
/// is), for every head (`ds`: scratch of `p`'s size); then per sequence and head
/// `dq_h += ds · k_h` and `dk_h += dsᵀ · q_h`.
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
                for ((o, &pv), &dv) in o.iter_mut().zip(pr).zip(dpr) {
                    *o = scale * pv * (dv - dot);
                }
            }
        },
    );
    let ds = &*ds;
    dims.per_seq(par, dqkv, t * ld, |b, dseq| {
        let seq = &qkv[b * t * ld..(b + 1) * t * ld];
        for hi in 0..h {
            let at = (b * h + hi) * t * t;
            let dsh = &ds[at..at + t * t];
            T::gemm_strided(&mut dseq[hi * d..], ld, dsh, t, false, dims.block(seq, 1, hi), ld, false, (t, t, d), true);
            let c = dims.c();
            T::gemm_strided(
                &mut dseq[c + hi * d..],
                ld,
                dsh,
                t,
                true,
                dims.block(seq, 0, hi),
                ld,
                false,
                (t, t, d),
                true,
            );
        }
    });
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
    dims.per_seq(par, out, t * c, |b, ob| {
        let seq = &qkv[b * t * ld..(b + 1) * t * ld];
        for hi in 0..h {
            let at = (b * h + hi) * t * t;
            T::gemm_strided(
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
    });
}

/// Backward of [`attend`] into the weights: `dp_bh += dout_bh · v_hᵀ`.
pub(crate) fn attend_backward_p<T: Float>(par: Par, dims: AttnDims, dout: &[T], qkv: &[T], dp: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld) = (dims.c(), 3 * dims.c());
    if t == 0 || c == 0 {
        return;
    }
    dims.per_seq(par, dp, h * t * t, |b, dpb| {
        let (seq, g) = (&qkv[b * t * ld..(b + 1) * t * ld], &dout[b * t * c..(b + 1) * t * c]);
        for (hi, dph) in dpb.chunks_exact_mut(t * t).enumerate() {
            T::gemm_strided(dph, t, &g[hi * d..], c, false, dims.block(seq, 2, hi), ld, true, (t, d, t), true);
        }
    });
}

/// Backward of [`attend`] into the value blocks of `dqkv`: `dv_h += p_bhᵀ · dout_bh`.
pub(crate) fn attend_backward_v<T: Float>(par: Par, dims: AttnDims, dout: &[T], p: &[T], dqkv: &mut [T]) {
    let AttnDims { t, h, d, .. } = dims;
    let (c, ld) = (dims.c(), 3 * dims.c());
    if t == 0 || c == 0 {
        return;
    }
    dims.per_seq(par, dqkv, t * ld, |b, dseq| {
        let g = &dout[b * t * c..(b + 1) * t * c];
        for hi in 0..h {
            let at = (b * h + hi) * t * t;
            T::gemm_strided(
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
    });
}
