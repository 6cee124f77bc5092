//! Layer 4, the rules. Each family file holds, side by side, the recording methods
//! (forward), the kernel calls and the two derivatives of its variants of
//! [`Op`](crate::tape::op::Op):
//!
//! | file           | kinds                                                                     |
//! |----------------|---------------------------------------------------------------------------|
//! | `unary.rs`     | every elementwise `y = f(x)` (the table is `kernels/unary_fn.rs`)         |
//! | `binary.rs`    | every broadcasting `out = f(a, b)` (the table is `kernels/binary_fn.rs`)  |
//! | `matmul.rs`    | `matmul`, `linear` (product and bias in one node)                         |
//! | `view.rs`      | `reshape`, `permute`, `broadcast_to`, `narrow`                            |
//! | `select.rs`    | `concat`, `index_select`, `where`                                         |
//! | `scatter.rs`   | `pad_axis`, `scatter_add`: the adjoints of `narrow` and `index_select`    |
//! | `reduce.rs`    | `sum`, `sum_axes`, `max_axes`, `min_axes`, `logsumexp`                    |
//! | `softmax.rs`   | `softmax`, `log_softmax`                                                  |
//! | `norm.rs`      | `layer_norm` (normalisation, scale and shift in one node)                 |
//! | `attention.rs` | `attention_weights`, `attend`: multi-head attention on a packed `qkv`     |
//! | `loss.rs`      | `cross_entropy`, `nll_loss`, `bce_with_logits`                            |
//! | `conv/`        | `im2col`, `col2im`, `max_pool2d`, `avg_pool2d`; `conv2d` composed of them |
//!
//! Each op has three derivatives side by side: `backward`, the fast pass that accumulates
//! into buffers ([`Scope::backward`](crate::Scope::backward)); `grad`, which records the
//! same derivative as ops on the tape so that it can be differentiated again
//! ([`Scope::grad`](crate::Scope::grad)); and `jvp`, the forward-mode rule, which records
//! the tangent of the output from the tangents of the inputs
//! ([`Scope::forward`](crate::Scope::forward)). [`backward`], [`grad`] and [`jvp`] below
//! dispatch on the variant with exhaustive matches.
//!
//! Rules see the recording toolkit of `record/` (`Rec`, `BackwardCtx`, `GradCtx`), never
//! the engine: custom ops and checkpoints, which run user code and nested passes, are the
//! engine's (`engine/custom.rs`, `engine/checkpoint/`), reached through the type parameter
//! of the two matches (`record::ctx::EngineBackward`, `EngineGrad`).

pub(crate) mod accumulate;
pub(crate) mod attention;
pub(crate) mod binary;
pub(crate) mod conv;
pub(crate) mod loss;
pub(crate) mod matmul;
pub(crate) mod norm;
pub(crate) mod reduce;
pub(crate) mod scatter;
pub(crate) mod select;
pub(crate) mod softmax;
pub(crate) mod unary;
pub(crate) mod view;

use crate::dtype::Float;
use crate::error::Result;
use crate::record::ctx::{BackwardCtx, EngineBackward, EngineGrad, EngineJvp, GradCtx, JvpCtx};
use crate::record::handles::Var;
use crate::tape::id::NodeId;
use crate::tape::op::Op;

/// Adds node `out`'s contribution to its inputs' gradients, `op` being its op. A flat,
/// exhaustive match: a new variant does not compile until it has a backward. It inlines
/// into the walk, and with it only the elementwise unary rules and the short losses: every
/// other family's backward is `#[inline(never)]`, so that the walk's loop stays small and
/// shape-`[1]` backward of every op does not pay for the large ones (W3 under callgrind:
/// +10 instructions per op when the products, convolutions and selections inlined). Custom ops
/// and checkpoints run user code and nested passes: their arms call the engine's `E`.
#[inline(always)]
pub(crate) fn backward<'s, T: Float, E: EngineBackward<T>>(
    op: Op<'s, T>,
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
) -> Result<()> {
    use Op::*;
    match op {
        Leaf | Variable | Param(_) => Ok(()),
        Unary { f, x, c } => unary::backward(ctx, out, f, x, c),
        Binary { f, a, b } => binary::backward(ctx, out, f, a, b),
        MatMul { a, b, ta, tb } => matmul::backward(ctx, out, a, b, ta, tb),
        Linear { x, w, b } => matmul::backward_linear(ctx, out, x, w, b),
        LayerNorm { first, eps } => norm::backward(ctx, out, first, eps),
        AttentionWeights { qkv, heads } => attention::backward_weights(ctx, out, qkv, heads),
        Attend { p, qkv } => attention::backward_attend(ctx, out, p, qkv),
        Reshape { x } => view::backward_reshape(ctx, out, x),
        Permute { x, axes } => view::backward_permute(ctx, out, x, axes),
        BroadcastTo { x } => view::backward_broadcast(ctx, out, x),
        Narrow { x, axis, start } => view::backward_narrow(ctx, out, x, axis, start),
        Concat { first, count, axis } => select::backward_concat(ctx, out, first, count, axis),
        IndexSelect { x, axis, idx } => select::backward_index_select(ctx, out, x, axis, idx),
        Where { cond, a, b } => select::backward_where(ctx, out, cond, a, b),
        Sum { x } => reduce::backward_sum(ctx, out, x),
        SumAxis { x, axis } => reduce::backward_sum_axis(ctx, out, x, axis),
        MaxAxis { x, axis } | MinAxis { x, axis } => reduce::backward_select_axis(ctx, out, x, axis),
        LogSumExp { x, axis } => reduce::backward_logsumexp(ctx, out, x, axis),
        Softmax { x, axis } => softmax::backward(ctx, out, x, axis, false),
        LogSoftmax { x, axis } => softmax::backward(ctx, out, x, axis, true),
        CrossEntropy { logits, labels } => loss::backward_cross_entropy(ctx, out, logits, labels),
        NllLoss { logp, labels } => loss::backward_nll(ctx, out, logp, labels),
        BceWithLogits { x, y } => loss::backward_bce(ctx, out, x, y),
        Im2Col { x, geom } => conv::backward_im2col(ctx, out, x, geom),
        MaxPool2d { x, geom } => conv::backward_max_pool2d(ctx, out, x, geom),
        AvgPool2d { x, geom } => conv::backward_avg_pool2d(ctx, out, x, geom),
        Pad { x, axis, start } => scatter::backward_pad(ctx, out, x, axis, start),
        ScatterAdd { x, axis, idx } => scatter::backward_scatter_add(ctx, out, x, axis, idx),
        Col2Im { x, geom } => conv::backward_col2im(ctx, out, x, geom),
        Custom { table, first, count } => E::custom(ctx, out, (table, first, count)),
        Checkpoint { table, first, count } => E::checkpoint(ctx, out, (table, first, count)),
    }
}

/// Records node `out`'s derivative: adds `g`-weighted contributions (handles on the same
/// tape) to its inputs' gradients in `ctx`, for [`Scope::grad`](crate::Scope::grad). `g`
/// is the node's gradient. One function per op, beside its fast backward; no `_ =>` arm,
/// so a new variant does not compile until it has one. As in [`backward`], custom ops and
/// checkpoints are the engine's `E`.
#[track_caller]
pub(crate) fn grad<'s, T: Float, E: EngineGrad<T>>(
    op: Op<'s, T>,
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
) -> Result<()> {
    use Op::*;
    match op {
        Leaf | Variable | Param(_) => Ok(()),
        Unary { f, x, c } => unary::grad(ctx, out, g, f, x, c),
        Binary { f, a, b } => binary::grad(ctx, out, g, f, a, b),
        MatMul { a, b, ta, tb } => matmul::grad(ctx, g, a, b, ta, tb),
        Linear { x, w, b } => matmul::grad_linear(ctx, g, x, w, b),
        LayerNorm { first, eps } => norm::grad(ctx, g, first, eps),
        AttentionWeights { qkv, heads } => attention::grad_weights(ctx, out, g, qkv, heads),
        Attend { p, qkv } => attention::grad_attend(ctx, g, p, qkv),
        Reshape { x } => view::grad_reshape(ctx, g, x),
        Permute { x, axes } => view::grad_permute(ctx, g, x, axes),
        BroadcastTo { x } => view::grad_broadcast(ctx, g, x),
        Narrow { x, axis, start } => view::grad_narrow(ctx, g, x, axis, start),
        Concat { first, count, axis } => select::grad_concat(ctx, g, first, count, axis),
        IndexSelect { x, axis, idx } => select::grad_index_select(ctx, g, x, axis, idx),
        Where { cond, a, b } => select::grad_where(ctx, g, cond, a, b),
        Sum { x } | SumAxis { x, .. } => reduce::grad_sum(ctx, g, x),
        MaxAxis { x, axis } | MinAxis { x, axis } => reduce::grad_select_axis(ctx, out, g, x, axis),
        LogSumExp { x, .. } => reduce::grad_logsumexp(ctx, out, g, x),
        Softmax { x, axis } => softmax::grad(ctx, out, g, x, axis, false),
        LogSoftmax { x, axis } => softmax::grad(ctx, out, g, x, axis, true),
        CrossEntropy { logits, labels } => loss::grad_cross_entropy(ctx, g, logits, labels),
        NllLoss { logp, labels } => loss::grad_nll(ctx, g, logp, labels),
        BceWithLogits { x, y } => loss::grad_bce(ctx, g, x, y),
        Im2Col { x, geom } => conv::grad_im2col(ctx, g, x, geom),
        MaxPool2d { x, geom } => conv::grad_max_pool2d(ctx, out, g, x, geom),
        AvgPool2d { x, geom } => conv::grad_avg_pool2d(ctx, g, x, geom),
        Pad { x, axis, start } => scatter::grad_pad(ctx, g, x, axis, start),
        ScatterAdd { x, axis, idx } => scatter::grad_scatter_add(ctx, g, x, axis, idx),
        Col2Im { x, geom } => conv::grad_col2im(ctx, g, x, geom),
        Custom { table, first, count } => E::custom(ctx, out, g, (table, first, count)),
        Checkpoint { table, first, count } => E::checkpoint(ctx, out, g, (table, first, count)),
    }
}

/// Records node `out`'s tangent at `ctx`'s level from its inputs' tangents (forward mode):
/// the node's tangent, or `None` if it is zero (no input has one). One rule per op, beside
/// its two reverse rules, written in recorded ops so that tangents can be differentiated
/// again; no `_ =>` arm, so a new variant does not compile until it has one. Leaves have
/// no rule: their tangents are seeded (`Scope::dual`). As in [`backward`], custom ops and
/// checkpoints are the engine's `E`.
#[track_caller]
pub(crate) fn jvp<'s, T: Float, E: EngineJvp<T>>(
    op: Op<'s, T>,
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    use Op::*;
    match op {
        Leaf | Variable | Param(_) => Ok(None),
        Unary { f, x, c } => unary::jvp(ctx, out, f, x, c),
        Binary { f, a, b } => binary::jvp(ctx, out, f, a, b),
        MatMul { a, b, ta, tb } => matmul::jvp(ctx, out, a, b, ta, tb),
        Linear { x, w, b } => matmul::jvp_linear(ctx, out, x, w, b),
        LayerNorm { first, eps } => norm::jvp(ctx, out, first, eps),
        AttentionWeights { qkv, heads } => attention::jvp_weights(ctx, out, qkv, heads),
        Attend { p, qkv } => attention::jvp_attend(ctx, out, p, qkv),
        Reshape { x } => view::jvp_reshape(ctx, out, x),
        Permute { x, axes } => view::jvp_permute(ctx, x, axes),
        BroadcastTo { x } => view::jvp_broadcast(ctx, out, x),
        Narrow { x, axis, start } => view::jvp_narrow(ctx, out, x, axis, start),
        Concat { first, count, axis } => select::jvp_concat(ctx, first, count, axis),
        IndexSelect { x, axis, idx } => select::jvp_index_select(ctx, out, x, axis, idx),
        Where { cond, a, b } => select::jvp_where(ctx, out, cond, a, b),
        Sum { x } => reduce::jvp_sum(ctx, x, None),
        SumAxis { x, axis } => reduce::jvp_sum(ctx, x, Some(axis)),
        MaxAxis { x, axis } | MinAxis { x, axis } => reduce::jvp_select_axis(ctx, out, x, axis),
        LogSumExp { x, axis } => reduce::jvp_logsumexp(ctx, out, x, axis),
        Softmax { x, axis } => softmax::jvp(ctx, out, x, axis, false),
        LogSoftmax { x, axis } => softmax::jvp(ctx, out, x, axis, true),
        CrossEntropy { logits, labels } => loss::jvp_cross_entropy(ctx, out, logits, labels),
        NllLoss { logp, labels } => loss::jvp_nll(ctx, out, logp, labels),
        BceWithLogits { x, y } => loss::jvp_bce(ctx, out, x, y),
        Im2Col { x, geom } => conv::jvp_im2col(ctx, x, geom),
        MaxPool2d { x, geom } => conv::jvp_max_pool2d(ctx, out, x, geom),
        AvgPool2d { x, geom } => conv::jvp_avg_pool2d(ctx, out, x, geom),
        Pad { x, axis, start } => scatter::jvp_pad(ctx, out, x, axis, start),
        ScatterAdd { x, axis, idx } => scatter::jvp_scatter_add(ctx, out, x, axis, idx),
        Col2Im { x, geom } => conv::jvp_col2im(ctx, out, x, geom),
        Custom { table, first, count } => E::custom(ctx, out, (table, first, count)),
        Checkpoint { table, first, count } => E::checkpoint(ctx, out, (table, first, count)),
    }
}
