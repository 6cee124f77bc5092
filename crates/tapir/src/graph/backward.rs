//! The backward pass: one reverse loop over the tape and a flat, exhaustive `match`.
//!
//! The tape is in creation order, so walking it backwards visits every node after all of
//! its consumers: nothing sorts, hashes or recurses, and a chain of a million ops needs no
//! more stack than a chain of two. Gradients are allocated in the arena on first use,
//! zero-filled, and every op accumulates into them, so a node used twice (`x * x`) gets
//! both contributions.

use faer::Par;

use crate::error::{Error, Loc, Result};
use crate::graph::scope::alloc_error;
use crate::graph::tape::{recycle, Tape};
use crate::graph::NodeId;
use crate::ops::{self, Op};
use crate::shape::Shape;
use crate::storage::Arena;
use crate::Float;

/// What an op's backward function sees.
pub(crate) struct BackwardCtx<'a, 's, T> {
    tape: &'a Tape<'s, T>,
    grads: &'a mut [Option<&'s mut [T]>],
    arena: &'s Arena,
    pub par: Par,
    location: Loc,
}

impl<'a, 's, T: Float> BackwardCtx<'a, 's, T> {
    pub fn value(&self, id: NodeId<'s>) -> &'s [T] {
        self.tape.nodes[id.index()].value
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.tape.shape(id)
    }

    pub fn extra(&self, at: u32, len: usize) -> &'a [u32] {
        &self.tape.extra[at as usize..at as usize + len]
    }

    /// `∂L/∂out` and the (zero-initialised on first use) gradient buffer of `input`, or
    /// `None` if `input` requires no gradient.
    pub fn grad_pair(&mut self, out: NodeId<'s>, input: NodeId<'s>) -> Result<Option<(&[T], &mut [T])>> {
        let node = self.tape.node(input);
        if !node.requires_grad {
            return Ok(None);
        }
        // `out` comes after `input` on the tape, so its gradient never aliases input's.
        let (lo, hi) = self.grads.split_at_mut(out.index());
        let dout = hi[0].as_deref().expect("backward visits only nodes whose gradient exists");
        let slot = &mut lo[input.index()];
        if slot.is_none() {
            let g =
                self.arena.alloc_zeroed(node.shape.numel()).map_err(|e| alloc_error(e, "backward", self.location))?;
            *slot = Some(g);
        }
        Ok(slot.as_deref_mut().map(|g| (dout, g)))
    }
}

/// Runs backward from `loss` over `tape`, leaving the gradients in `tape.grads`.
pub(crate) fn run<'s, T: Float>(
    tape: &mut Tape<'s, T>,
    arena: &'s Arena,
    par: Par,
    loss: NodeId<'s>,
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    let node = tape.node(loss);
    if node.shape.numel() != 1 {
        return Err(Error::NotScalar { op: "backward", shape: node.shape, location });
    }
    let mut grads: Vec<Option<&'s mut [T]>> = recycle(std::mem::take(&mut tape.grads));
    grads.resize_with(tape.nodes.len(), || None);
    let result = walk(tape, &mut grads, arena, par, loss, location, anomaly);
    // Whether or not it failed, hand the buffer back: gradients computed so far stay readable.
    tape.grads = grads.into_iter().map(|g| g.map(|g| &*g)).collect();
    result
}

fn walk<'s, T: Float>(
    tape: &Tape<'s, T>,
    grads: &mut [Option<&'s mut [T]>],
    arena: &'s Arena,
    par: Par,
    loss: NodeId<'s>,
    location: Loc,
    anomaly: bool,
) -> Result<()> {
    if !tape.nodes[loss.index()].requires_grad {
        return Ok(());
    }
    grads[loss.index()] = Some(arena.alloc_fill(1, T::ONE).map_err(|e| alloc_error(e, "backward", location))?);
    let mut ctx = BackwardCtx { tape, grads, arena, par, location };
    for i in (0..=loss.index()).rev() {
        let node = tape.nodes[i];
        if !node.requires_grad || ctx.grads[i].is_none() {
            continue;
        }
        let id = NodeId::new(i as u32);
        dispatch(&mut ctx, id, node.op)?;
        if anomaly {
            check_finite(&ctx, tape, node.op, i)?;
        }
    }
    Ok(())
}

fn check_finite<'s, T: Float>(ctx: &BackwardCtx<'_, 's, T>, tape: &Tape<'s, T>, op: Op<'s, T>, i: usize) -> Result<()> {
    let mut bad = None;
    op.for_each_input(&tape.extra, |x| {
        if let Some(g) = ctx.grads[x.index()].as_deref() {
            if bad.is_none() && !g.iter().all(|v| v.is_finite()) {
                bad = Some(x);
            }
        }
    });
    match bad {
        None => Ok(()),
        Some(x) => {
            Err(Error::NonFinite { op: op.name(), phase: "backward", shape: tape.shape(x), location: tape.locs[i] })
        }
    }
}

fn dispatch<'s, T: Float>(ctx: &mut BackwardCtx<'_, 's, T>, id: NodeId<'s>, op: Op<'s, T>) -> Result<()> {
    use ops::{binary, conv, loss, matmul, reduce, shape_ops, softmax, unary};
    match op {
        Op::Leaf | Op::Variable | Op::Param(_) => Ok(()),
        Op::Add { a, b } => binary::backward_add(ctx, id, a, b),
        Op::Sub { a, b } => binary::backward_sub(ctx, id, a, b),
        Op::Mul { a, b } => binary::backward_mul(ctx, id, a, b),
        Op::Div { a, b } => binary::backward_div(ctx, id, a, b),
        Op::Pow { a, b } => binary::backward_pow(ctx, id, a, b),
        Op::Maximum { a, b } => binary::backward_select(ctx, id, a, b, true),
        Op::Minimum { a, b } => binary::backward_select(ctx, id, a, b, false),
        Op::AddScalar { x } | Op::Reshape { x } => shape_ops::backward_identity(ctx, id, x),
        Op::MulScalar { x, c } => unary::backward_scale(ctx, id, x, c),
        Op::PowScalar { x, p } => unary::backward(ctx, id, x, |x, _| p * x.powf(p - T::ONE)),
        Op::Neg { x } => unary::backward_scale(ctx, id, x, -T::ONE),
        Op::Exp { x } => unary::backward(ctx, id, x, |_, y| y),
        Op::Log { x } => unary::backward(ctx, id, x, |x, _| T::ONE / x),
        Op::Sqrt { x } => unary::backward(ctx, id, x, |_, y| T::from_f64(0.5) / y),
        Op::Square { x } => unary::backward(ctx, id, x, |x, _| x + x),
        Op::Recip { x } => unary::backward(ctx, id, x, |_, y| -(y * y)),
        Op::Abs { x } => unary::backward(ctx, id, x, unary::sign),
        Op::Sin { x } => unary::backward(ctx, id, x, |x, _| x.cos()),
        Op::Cos { x } => unary::backward(ctx, id, x, |x, _| -x.sin()),
        Op::Tanh { x } => unary::backward(ctx, id, x, |_, y| T::ONE - y * y),
        Op::Sigmoid { x } => unary::backward(ctx, id, x, |_, y| y * (T::ONE - y)),
        Op::Relu { x } => unary::backward(ctx, id, x, |x, _| if x > T::ZERO { T::ONE } else { T::ZERO }),
        Op::LeakyRelu { x, slope } => unary::backward(ctx, id, x, |x, _| if x > T::ZERO { T::ONE } else { slope }),
        Op::GeluTanh { x } => unary::backward(ctx, id, x, |x, _| unary::gelu_tanh_grad(x)),
        Op::GeluErf { x } => unary::backward(ctx, id, x, |x, _| unary::gelu_erf_grad(x)),
        Op::Softplus { x } => unary::backward(ctx, id, x, |x, _| unary::sigmoid(x)),
        Op::Clamp { x, lo, hi } => {
            unary::backward(ctx, id, x, |x, _| if x >= lo && x <= hi { T::ONE } else { T::ZERO })
        }
        Op::MatMul { a, b } => matmul::backward(ctx, id, a, b),
        Op::Permute { x, axes } => shape_ops::backward_permute(ctx, id, x, axes),
        Op::BroadcastTo { x } => shape_ops::backward_broadcast(ctx, id, x),
        Op::Slice { x, axis, start } => shape_ops::backward_slice(ctx, id, x, axis, start),
        Op::Concat { first, count, axis } => shape_ops::backward_concat(ctx, id, first, count, axis),
        Op::IndexSelect { x, axis, idx } => shape_ops::backward_index_select(ctx, id, x, axis, idx),
        Op::Where { cond, a, b } => shape_ops::backward_where(ctx, id, cond, a, b),
        Op::Sum { x } => reduce::backward_sum(ctx, id, x),
        Op::SumAxis { x, axis } => reduce::backward_sum_axis(ctx, id, x, axis),
        Op::MaxAxis { x, axis } | Op::MinAxis { x, axis } => reduce::backward_select_axis(ctx, id, x, axis),
        Op::LogSumExp { x, axis } => reduce::backward_logsumexp(ctx, id, x, axis),
        Op::Softmax { x, axis } => softmax::backward(ctx, id, x, axis, false),
        Op::LogSoftmax { x, axis } => softmax::backward(ctx, id, x, axis, true),
        Op::CrossEntropy { logits, labels } => loss::backward_cross_entropy(ctx, id, logits, labels),
        Op::Nll { logp, labels } => loss::backward_nll(ctx, id, logp, labels),
        Op::BceWithLogits { x, y } => loss::backward_bce(ctx, id, x, y),
        Op::Im2Col { x, geom } => conv::backward_im2col(ctx, id, x, geom),
        Op::MaxPool2d { x, geom } => conv::backward_max_pool2d(ctx, id, x, geom),
        Op::AvgPool2d { x, geom } => conv::backward_avg_pool2d(ctx, id, x, geom),
    }
}
