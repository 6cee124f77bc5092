//! [`CausalSelfAttention`]: multi-head self-attention in which position `i` attends only
//! to positions `j ≤ i`.
//!
//! For `x: [B, T, C]` with `H` heads of `D = C/H` elements:
//!
//! ```text
//! [q | k | v] = x·W_qkv + b_qkv                       [B, T, 3C], split per head into [B, H, T, D]
//! s = (q/√D)·kᵀ                                       [B, H, T, T]
//! s_ij = −10⁹ where j > i  (the causal mask)
//! a = dropout(softmax_j(s))                           [B, H, T, T]
//! y = concat_heads(a·v)·W_proj + b_proj               [B, T, C]
//! ```
//!
//! Composed from engine ops (`matmul` batched over `[B, H]`, `narrow`, `permute`,
//! `where_`, `softmax`), so its gradient is theirs. The mask *replaces* the masked scores
//! with `−10⁹` through `where_` rather than adding `−∞`: softmax subtracts the row maximum
//! (a finite score, since the diagonal is never masked), and `exp(−10⁹ − max)` underflows
//! to exactly `0`, in `f32` and `f64`. So masked positions get exactly zero probability,
//! no value or gradient anywhere is infinite or NaN, and anomaly detection stays usable;
//! `where_` sends the masked positions no gradient, and softmax's own backward gives
//! them `a ⊙ (…) = 0` as well.

use rand::Rng;
use tapir::{Float, ParamStore, Var};

use crate::layer::{Ctx, Dropout, Linear, Module};
use crate::Init;

/// The value that replaces masked attention scores: finite, so that nothing on the tape is
/// infinite, and far enough below any real score that `exp` of it underflows to 0.
pub const MASKED_SCORE: f64 = -1e9;

/// Causal multi-head self-attention over `[B, T, C]` inputs with `T ≤ context`.
///
/// Parameters: `"{name}.qkv.weight"` `[C, 3C]` (columns: all of `q`, then `k`, then `v`,
/// head-major inside each), `"{name}.qkv.bias"` `[3C]`, `"{name}.proj.weight"` `[C, C]`,
/// `"{name}.proj.bias"` `[C]`.
#[derive(Debug)]
pub struct CausalSelfAttention {
    /// The fused query, key and value projection, `C → 3C`.
    pub qkv: Linear,
    /// The output projection, `C → C`.
    pub proj: Linear,
    /// Number of heads `H`.
    pub heads: usize,
    /// Width `C`.
    pub dim: usize,
    /// Longest sequence `T` accepted.
    pub context: usize,
    dropout: Option<Dropout>,
    /// `context × context`, row-major: 1 where key `j` comes after query `i` (masked).
    /// Index list for `index_select`, so the mask is built in the arena without
    /// touching the heap.
    future: Vec<usize>,
}

impl CausalSelfAttention {
    /// `heads` heads over width `dim` for sequences of up to `context` positions, weights
    /// drawn by `init` (biases zero), no dropout.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if a size is zero, `dim` is not a multiple of
    /// `heads`, or a name is taken.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        dim: usize,
        heads: usize,
        context: usize,
        init: Init,
        rng: &mut R,
    ) -> tapir::Result<CausalSelfAttention> {
        if dim == 0 || heads == 0 || context == 0 || dim % heads != 0 {
            return Err(crate::invalid(
                "CausalSelfAttention::new",
                format!("dim {dim} must be a positive multiple of heads {heads}, and context {context} positive"),
            ));
        }
        let qkv = Linear::with_init(store, &format!("{name}.qkv"), dim, 3 * dim, init, true, rng)?;
        let proj = Linear::with_init(store, &format!("{name}.proj"), dim, dim, init, true, rng)?;
        let future = (0..context * context).map(|k| usize::from(k % context > k / context)).collect();
        Ok(CausalSelfAttention { qkv, proj, heads, dim, context, dropout: None, future })
    }

    /// Dropout with probability `p` on the attention weights while training, masks drawn
    /// from a generator seeded with `seed`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `0 ≤ p < 1`.
    #[track_caller]
    pub fn with_dropout(mut self, p: f64, seed: u64) -> tapir::Result<Self> {
        self.dropout = if p == 0.0 { None } else { Some(Dropout::new(p, seed)?) };
        Ok(self)
    }

    /// The causal mask for `t` positions, `[t, t]`: 1 where key `j > i` (to be masked),
    /// else 0. Built in the arena from a two-element table.
    #[track_caller]
    pub fn future_mask<'s, T: Float>(&self, cx: Ctx<'s, '_, T>, t: usize) -> Var<'s, T> {
        let s = cx.scope();
        let full =
            s.tensor(&[T::ZERO, T::ONE], &[2]).index_select(0, &self.future).reshape(&[self.context, self.context]);
        if t == self.context {
            full
        } else {
            full.narrow(0, 0, t).narrow(1, 0, t)
        }
    }
}

impl<T: Float> Module<T> for CausalSelfAttention {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let s = cx.scope();
        // A wrong rank, width or length makes an engine op below record the error: the
        // `qkv` matmul for the width, the head-split reshape for the rank, the mask's
        // `narrow` for `T > context`.
        let (dims, _) = crate::dims(x.shape());
        let (b, t, c) = (dims[0], dims[1], self.dim);
        let (h, d) = (self.heads, self.dim / self.heads);
        // [B, T, 3C], then one head split per projection: narrow to [B, T, C], view as
        // [B, T, H, D], permute.
        let qkv = self.qkv.forward(cx, x);
        let split = |which: usize, axes: &[usize]| qkv.narrow(-1, which * c, c).reshape(&[b, t, h, d]).permute(axes);
        let scale = T::from_f64(1.0 / (d as f64).sqrt());
        let q = split(0, &[0, 2, 1, 3]).mul_scalar(scale); // [B, H, T, D], scaled here: T·D < T·T
        let kt = split(1, &[0, 2, 3, 1]); // [B, H, D, T]
        let v = split(2, &[0, 2, 1, 3]); // [B, H, T, D]
        let scores = q.matmul(kt); // [B, H, T, T]
        let masked = s.where_(self.future_mask(cx, t), s.scalar(T::from_f64(MASKED_SCORE)), scores);
        let mut weights = masked.softmax(-1);
        if let Some(dropout) = &self.dropout {
            weights = dropout.forward(cx, weights);
        }
        let y = weights.matmul(v).permute(&[0, 2, 1, 3]).reshape(&[b, t, c]);
        self.proj.forward(cx, y)
    }
}
