//! The pieces of a GPT-style decoder: [`PositionalEmbedding`], the pre-norm
//! [`TransformerBlock`], and [`Gpt`], a character- or token-level language model whose
//! output projection is tied to its token embedding.
//!
//! ```text
//! block:  x = x + attn(ln1(x));  x = x + fc2(gelu(fc1(ln2(x))))
//! gpt:    h = E[tokens] + P[0..T];  h = blocks(h);  logits = ln_f(h)·Eᵀ
//! ```
//!
//! GELU is the exact form `x·Φ(x)` (PyTorch's `nn.GELU()` default) and every LayerNorm
//! has `ε = 1e-5`, so a PyTorch model with the same weights computes the same logits.

use rand::Rng;
use tapir::{Float, ParamId, ParamStore, Tensor, Var};

use crate::init::Init;
use crate::layer::{CausalSelfAttention, Ctx, Embedding, LayerNorm, Linear, Module};

/// Learned positional embeddings: one vector of `dim` elements per position
/// (`"{name}.weight"`, `[context, dim]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PositionalEmbedding {
    /// The table, `[context, dim]`.
    pub weight: ParamId,
    /// Number of positions.
    pub context: usize,
    /// Elements per vector.
    pub dim: usize,
}

impl PositionalEmbedding {
    /// A table for `context` positions, drawn from `N(0, std²)` with `rng`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if `context` or `dim` is zero, the name is taken
    /// or `std` is not finite and non-negative (in `T` too);
    /// [`tapir::Error::InvalidShape`] or [`tapir::Error::TensorOutOfMemory`] if the table
    /// cannot exist or be allocated. Every error names `PositionalEmbedding::new`.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        context: usize,
        dim: usize,
        std: f64,
        rng: &mut R,
    ) -> tapir::Result<PositionalEmbedding> {
        const OP: &str = "PositionalEmbedding::new";
        if context == 0 || dim == 0 {
            return Err(crate::invalid(OP, format!("context {context} and dim {dim} must be positive")));
        }
        if !(std.is_finite() && T::from_f64(std).is_finite() && std >= 0.0) {
            return Err(crate::invalid(OP, format!("std {std} must be finite in {} and non-negative", T::NAME)));
        }
        let w = Tensor::normal(&[context, dim], T::ZERO, T::from_f64(std), rng).map_err(crate::in_op(OP))?;
        let weight = store.add(format!("{name}.weight"), w)?;
        Ok(PositionalEmbedding { weight, context, dim })
    }

    /// The vectors of positions `0..t`, `[t, dim]` (they broadcast over a batch).
    ///
    /// # Errors
    /// [`tapir::Error::IndexOutOfRange`] (recorded) if `t > context`.
    #[track_caller]
    pub fn forward<'s, T: Float>(&self, cx: Ctx<'s, '_, T>, t: usize) -> Var<'s, T> {
        cx.param(self.weight).narrow(0, 0, t)
    }
}

/// A pre-norm transformer block of width `C`: causal self-attention and a `C → 4C → C`
/// GELU MLP, each behind a LayerNorm and inside a residual connection.
///
/// Parameters: `"{name}.ln1.*"`, `"{name}.attn.*"` (see [`CausalSelfAttention`]),
/// `"{name}.ln2.*"`, `"{name}.fc1.*"` (`[C, 4C]`), `"{name}.fc2.*"` (`[4C, C]`).
#[derive(Debug)]
pub struct TransformerBlock {
    /// Before attention.
    pub ln1: LayerNorm,
    /// The attention.
    pub attn: CausalSelfAttention,
    /// Before the MLP.
    pub ln2: LayerNorm,
    /// `C → 4C`.
    pub fc1: Linear,
    /// `4C → C`.
    pub fc2: Linear,
}

impl TransformerBlock {
    /// A block of width `dim` with `heads` heads for up to `context` positions. Weights
    /// are drawn from `N(0, std²)`, except the two projections back into the residual
    /// stream (`attn.proj`, `fc2`), drawn from `N(0, proj_std²)`; biases are zero.
    ///
    /// # Errors
    /// As [`CausalSelfAttention::new`]; a non-finite `std`.
    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        dim: usize,
        heads: usize,
        context: usize,
        std: f64,
        proj_std: f64,
        rng: &mut R,
    ) -> tapir::Result<TransformerBlock> {
        const OP: &str = "TransformerBlock::new";
        // Checked before anything is made, so a failure names this constructor, not the
        // first sub-layer to notice.
        if dim == 0 || heads == 0 || context == 0 || dim % heads != 0 {
            return Err(crate::invalid(
                OP,
                format!("dim {dim} must be a positive multiple of heads {heads}, and context {context} positive"),
            ));
        }
        let hidden = crate::mul_size(OP, "the MLP width 4·dim", 4, dim)?;
        crate::mul_size(OP, "the qkv width 3·dim", 3, dim)?;
        let ln1 = LayerNorm::new(store, &format!("{name}.ln1"), dim)?;
        let attn =
            CausalSelfAttention::new(store, &format!("{name}.attn"), dim, heads, context, normal(std, dim), rng)?;
        // Re-draw the output projection with the residual scale.
        *store.get_mut(attn.proj.weight).expect("made above") =
            normal(proj_std, dim).tensor(&[dim, dim], dim, dim, rng).map_err(crate::in_op(OP))?;
        let ln2 = LayerNorm::new(store, &format!("{name}.ln2"), dim)?;
        let fc1 = Linear::with_init(store, &format!("{name}.fc1"), dim, hidden, normal(std, dim), true, rng)
            .map_err(crate::in_op(OP))?;
        let fc2 = Linear::with_init(store, &format!("{name}.fc2"), hidden, dim, normal(proj_std, hidden), true, rng)
            .map_err(crate::in_op(OP))?;
        Ok(TransformerBlock { ln1, attn, ln2, fc1, fc2 })
    }
}

/// `N(0, std²)` as an [`Init`]: Kaiming normal has std `gain/√fan_in`.
fn normal(std: f64, fan_in: usize) -> Init {
    Init::KaimingNormal { gain: std * (fan_in as f64).sqrt() }
}

impl<T: Float> Module<T> for TransformerBlock {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let x = x + self.attn.forward(cx, self.ln1.forward(cx, x));
        x + self.fc2.forward(cx, self.fc1.forward(cx, self.ln2.forward(cx, x)).gelu())
    }
}

/// The shape of a [`Gpt`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GptConfig {
    /// Vocabulary size `V`.
    pub vocab: usize,
    /// Longest sequence `T`.
    pub context: usize,
    /// Width `C`.
    pub dim: usize,
    /// Heads per block.
    pub heads: usize,
    /// Number of blocks.
    pub layers: usize,
}

/// A GPT-style language model: token and positional embeddings, pre-norm
/// [`TransformerBlock`]s, a final LayerNorm, and an output projection tied to the token
/// embedding (`logits = h·Eᵀ`, no separate weight; `E` gets the gradient of both uses).
///
/// Initialisation as in GPT-2: every weight `N(0, 0.02²)`, the residual projections
/// `N(0, (0.02/√(2·layers))²)`, biases 0, LayerNorms `γ = 1, β = 0`. Parameter names:
/// `"tok.weight"`, `"pos.weight"`, `"h.{i}.*"`, `"ln_f.*"`.
#[derive(Debug)]
pub struct Gpt {
    /// The shape.
    pub config: GptConfig,
    /// Token embedding `E`, `[V, C]`; also the output projection.
    pub tok: Embedding,
    /// Positional embedding, `[T, C]`.
    pub pos: PositionalEmbedding,
    /// The blocks.
    pub blocks: Vec<TransformerBlock>,
    /// The final LayerNorm.
    pub ln_f: LayerNorm,
}

impl Gpt {
    /// A model of shape `config`, drawn with `rng`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if a size is zero, `dim` is not a multiple of
    /// `heads`, `4·dim` overflows, or a name is taken in `store`;
    /// [`tapir::Error::TensorOutOfMemory`] if a table or the list of `layers` blocks
    /// cannot be allocated. The sizes are checked before anything is added to `store`;
    /// every error names `Gpt::new`.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        config: GptConfig,
        rng: &mut R,
    ) -> tapir::Result<Gpt> {
        const OP: &str = "Gpt::new";
        let GptConfig { vocab, context, dim, heads, layers } = config;
        if vocab == 0 || layers == 0 || context == 0 || dim == 0 || heads == 0 || dim % heads != 0 {
            return Err(crate::invalid(
                OP,
                format!(
                    "vocab {vocab}, layers {layers} and context {context} must be positive, and dim {dim} a \
                     positive multiple of heads {heads}"
                ),
            ));
        }
        crate::mul_size(OP, "the MLP width 4·dim", 4, dim)?;
        // `layers` is the caller's number: reserve the list of blocks fallibly (a huge
        // count fails here, typed, before any parameter is made).
        let location = std::panic::Location::caller();
        let mut blocks: Vec<TransformerBlock> = Vec::new();
        blocks.try_reserve_exact(layers).map_err(|_| tapir::Error::TensorOutOfMemory {
            op: OP,
            shape: tapir::Shape::scalar(),
            requested: layers.saturating_mul(std::mem::size_of::<TransformerBlock>()),
            location,
        })?;
        const STD: f64 = 0.02;
        let tok_table = Tensor::normal(&[vocab, dim], T::ZERO, T::from_f64(STD), rng).map_err(crate::in_op(OP))?;
        let tok = Embedding { weight: store.add("tok.weight", tok_table)?, count: vocab, dim };
        let pos = PositionalEmbedding::new(store, "pos", context, dim, STD, rng).map_err(crate::in_op(OP))?;
        let proj_std = STD / (2.0 * layers as f64).sqrt();
        for i in 0..layers {
            let block = TransformerBlock::new(store, &format!("h.{i}"), dim, heads, context, STD, proj_std, rng);
            blocks.push(block.map_err(crate::in_op(OP))?);
        }
        let ln_f = LayerNorm::new(store, "ln_f", dim).map_err(crate::in_op(OP))?;
        Ok(Gpt { config, tok, pos, blocks, ln_f })
    }

    /// Logits `[B, T, V]` for `tokens`, `B` sequences of `t` tokens each, row-major
    /// (`tokens.len() = B·t`).
    ///
    /// # Errors
    /// Recorded in the scope: [`tapir::Error::IndexOutOfRange`] for a token `≥ V` or
    /// `t > context`; a shape error if `tokens.len()` is not a multiple of `t`.
    #[track_caller]
    pub fn forward<'s, T: Float>(&self, cx: Ctx<'s, '_, T>, tokens: &[usize], t: usize) -> Var<'s, T> {
        let (c, v) = (self.config.dim, self.config.vocab);
        let b = tokens.len().checked_div(t).unwrap_or(0);
        // A length that is not a multiple of t makes this reshape record the error.
        let rows = if b * t == tokens.len() { b } else { tokens.len() };
        let tok = self.tok.forward(cx, tokens).reshape(&[rows, t, c]);
        let mut h = tok + self.pos.forward(cx, t);
        for block in &self.blocks {
            h = block.forward(cx, h);
        }
        let h = self.ln_f.forward(cx, h);
        // The tied head: the same parameter leaf again, transposed.
        // `rows · t` overflows only for a `t` whose first reshape already recorded the error;
        // saturating keeps that error the one reported, and no panic here.
        h.reshape(&[rows.saturating_mul(t), c]).matmul(cx.param(self.tok.weight).t()).reshape(&[rows, t, v])
    }

    /// The mean cross-entropy of predicting `targets` (next tokens, same layout as
    /// `tokens`), and the logits.
    #[track_caller]
    pub fn loss<'s, T: Float>(
        &self,
        cx: Ctx<'s, '_, T>,
        tokens: &[usize],
        targets: &[usize],
        t: usize,
    ) -> (Var<'s, T>, Var<'s, T>) {
        let logits = self.forward(cx, tokens, t);
        let loss = logits.reshape(&[tokens.len(), self.config.vocab]).cross_entropy(targets);
        (loss, logits)
    }
}
