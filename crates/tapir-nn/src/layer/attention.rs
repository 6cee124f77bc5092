//! [`CausalSelfAttention`]: multi-head self-attention in which position `i` attends only
//! to positions `j ≤ i`.
//!
//! For `x: [B, T, C]` with `H` heads of `D = C/H` elements:
//!
//! ```text
//! qkv = x·W_qkv + b_qkv                               [B, T, 3C]: q | k | v, head-major
//! a = dropout(softmax_{j ≤ i}(q_i·k_jᵀ/√D))            [B, H, T, T], 0 for j > i
//! y = concat_heads(a·v)·W_proj + b_proj               [B, T, C]
//! ```
//!
//! The middle line is the engine's [`Var::attention_weights`] on the packed `qkv` and
//! the last one's product its [`Var::attend`]: two nodes that read the heads in place
//! (no head split, transpose, mask or merge is materialised) and whose gradients and
//! recorded derivatives are the engine's. Masked positions never enter the softmax: their
//! probability is exactly `0`, and no value or gradient anywhere is infinite or NaN, so
//! anomaly detection stays usable. A NaN in the input at position `t` reaches only the
//! positions `≥ t`: the engine skips the masked weights rather than multiplying them by
//! it (`docs/design.md`, "NaN policy"). The parameters' gradients, which sum over every
//! position, are NaN.

use rand::Rng;
use tapir::{Float, ParamStore, Var};

use crate::init::Init;
use crate::layer::{Ctx, Dropout, Linear, Module};

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
        const OP: &str = "CausalSelfAttention::new";
        if dim == 0 || heads == 0 || context == 0 || dim % heads != 0 {
            return Err(crate::invalid(
                OP,
                format!("dim {dim} must be a positive multiple of heads {heads}, and context {context} positive"),
            ));
        }
        let width = crate::mul_size(OP, "the qkv width 3·dim", 3, dim)?;
        let qkv =
            Linear::with_init(store, &format!("{name}.qkv"), dim, width, init, true, rng).map_err(crate::in_op(OP))?;
        let proj =
            Linear::with_init(store, &format!("{name}.proj"), dim, dim, init, true, rng).map_err(crate::in_op(OP))?;
        Ok(CausalSelfAttention { qkv, proj, heads, dim, context, dropout: None })
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
}

impl<T: Float> Module<T> for CausalSelfAttention {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        const OP: &str = "CausalSelfAttention::forward";
        // The rank first: only a `[B, T, C]` input has a `T` and a `C` to check.
        let shape = x.shape();
        if shape.rank() != 3 {
            return cx.scope().invalid(OP, format!("expects [batch, time, channels], got input {shape}"));
        }
        if shape.dim(2) != self.dim {
            return cx.scope().invalid(
                OP,
                format!("input {shape} has {} channels but the layer's width is {}", shape.dim(2), self.dim),
            );
        }
        let t = shape.dim(1);
        if t > self.context {
            return cx
                .scope()
                .invalid(OP, format!("input {shape} has {t} positions, more than the context of {}", self.context));
        }
        let qkv = self.qkv.forward(cx, x); // [B, T, 3C]
        let mut weights = qkv.attention_weights(self.heads, true); // [B, H, T, T]
        if let Some(dropout) = &self.dropout {
            weights = dropout.forward(cx, weights);
        }
        self.proj.forward(cx, weights.attend(qkv))
    }
}
