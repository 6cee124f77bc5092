//! The interpreter: records a [`Step`] on a scope through the public API, and calls
//! backward. Every call the engine sees comes from this file, so the errors the engine
//! records must be located here ([`FILE`]).

use tapir::{Error, Float, GradBuffer, Scope, Var};

use crate::program::{BinOp, CmpOp, Ending, ReduceOp, ScalarOp, Step, WindowOp};

/// This file: where the errors of a program's steps and backward calls must be located.
pub(crate) const FILE: &str = file!();

/// The sum of a loss that is not a scalar.
pub(crate) fn sum<T: Float>(loss: Var<'_, T>) -> Var<'_, T> {
    loss.sum()
}

/// A later `backward` call.
pub(crate) fn backward<'s, T: Float>(s: &'s Scope<'s, '_, T>, loss: Var<'s, T>) -> Result<(), Error> {
    s.backward(loss)
}

/// `backward_into` a caller's buffer.
pub(crate) fn backward_into<'s, T: Float>(
    s: &'s Scope<'s, '_, T>,
    loss: Var<'s, T>,
    grads: &'s mut GradBuffer<T>,
) -> Result<(), Error> {
    s.backward_into(loss, grads)
}

/// The first backward call of an ending: `backward_retain` for `RetainThenOnce`.
pub(crate) fn backward_first<'s, T: Float>(
    s: &'s Scope<'s, '_, T>,
    ending: Ending,
    loss: Var<'s, T>,
) -> Result<(), Error> {
    match ending {
        Ending::RetainThenOnce => s.backward_retain(loss),
        Ending::Once | Ending::Twice => s.backward(loss),
    }
}

/// Records `step` on `s`, with operands from `values`.
pub(crate) fn step_on<'s, 'g: 's, T: Float>(s: &'s Scope<'s, 'g, T>, values: &[Var<'s, T>], step: &Step) -> Var<'s, T> {
    let v = |i: usize| values[i];
    let c = |x: f64| T::from_f64(x);
    match step {
        Step::Binary { op, a, b } => {
            let (a, b) = (v(*a), v(*b));
            match op {
                BinOp::Add => a + b,
                BinOp::Sub => a - b,
                BinOp::Mul => a * b,
                BinOp::Div => a / b,
                BinOp::Pow => a.pow(b),
                BinOp::Maximum => a.maximum(b),
                BinOp::Minimum => a.minimum(b),
            }
        }
        Step::Compare { op, a, b } => {
            let (a, b) = (v(*a), v(*b));
            match op {
                CmpOp::Gt => a.gt(b),
                CmpOp::Ge => a.ge(b),
                CmpOp::Lt => a.lt(b),
                CmpOp::Le => a.le(b),
                CmpOp::Equal => a.equal(b),
            }
        }
        Step::Scalar { op, x, c: k } => {
            let (x, k) = (v(*x), c(*k));
            match op {
                ScalarOp::Add => x + k,
                ScalarOp::Sub => x - k,
                ScalarOp::Mul => x * k,
                ScalarOp::Div => x / k,
                ScalarOp::Powf => x.powf(k),
                ScalarOp::LeakyRelu => x.leaky_relu(k),
                ScalarOp::RSub => (-x).add_scalar(k),
                ScalarOp::RDiv => x.recip().mul_scalar(k),
            }
        }
        Step::Clamp { x, lo, hi } => v(*x).clamp(c(*lo), c(*hi)),
        Step::Unary { op, x } => op.apply(v(*x)),
        Step::MatMul { a, b } => v(*a).matmul(v(*b)),
        Step::Linear { x, w, b } => v(*x).linear(v(*w), v(*b)),
        Step::LayerNorm { x, w, b, eps } => v(*x).layer_norm(v(*w), v(*b), *eps),
        Step::AttentionWeights { qkv, heads, causal } => v(*qkv).attention_weights(*heads, *causal),
        Step::Attend { p, qkv } => v(*p).attend(v(*qkv)),
        Step::Reshape { x, dims } => v(*x).reshape(dims),
        Step::Permute { x, axes } => v(*x).permute(axes),
        Step::Transpose { x, a0, a1 } => {
            if (*a0, *a1) == (-2, -1) {
                v(*x).t()
            } else {
                v(*x).transpose(*a0, *a1)
            }
        }
        Step::BroadcastTo { x, dims } => v(*x).broadcast_to(dims),
        Step::Squeeze { x, axis } => v(*x).squeeze(*axis),
        Step::Unsqueeze { x, axis } => v(*x).unsqueeze(*axis),
        Step::Narrow { x, axis, start, len } => v(*x).narrow(*axis, *start, *len),
        Step::Concat { xs, axis } => s.concat(&xs.iter().map(|&i| v(i)).collect::<Vec<_>>(), *axis),
        Step::Stack { xs, axis } => s.stack(&xs.iter().map(|&i| v(i)).collect::<Vec<_>>(), *axis),
        Step::IndexSelect { x, axis, indices } => v(*x).index_select(*axis, indices),
        Step::PadAxis { x, axis, before, after } => v(*x).pad_axis(*axis, *before, *after),
        Step::ScatterAdd { x, axis, indices, len } => v(*x).scatter_add(*axis, indices, *len),
        Step::Where { cond, a, b } => s.where_(v(*cond), v(*a), v(*b)),
        Step::Reduce { op, x, axes, keepdim } => {
            let x = v(*x);
            match (op, axes) {
                (ReduceOp::Sum, None) => x.sum(),
                (ReduceOp::Mean, None) => x.mean(),
                (ReduceOp::Max, None) => x.max(),
                (ReduceOp::Min, None) => x.min(),
                (ReduceOp::Sum, Some(a)) => x.sum_axes(a, *keepdim),
                (ReduceOp::Mean, Some(a)) => x.mean_axes(a, *keepdim),
                (ReduceOp::Max, Some(a)) => x.max_axes(a, *keepdim),
                (ReduceOp::Min, Some(a)) => x.min_axes(a, *keepdim),
            }
        }
        Step::Var { x, axes, keepdim, correction } => v(*x).var(axes, *keepdim, *correction),
        Step::LogSumExp { x, axis, keepdim } => v(*x).logsumexp(*axis, *keepdim),
        Step::Softmax { x, axis, log: false } => v(*x).softmax(*axis),
        Step::Softmax { x, axis, log: true } => v(*x).log_softmax(*axis),
        Step::CrossEntropy { x, labels } => v(*x).cross_entropy(labels),
        Step::Nll { x, labels } => v(*x).nll_loss(labels),
        Step::Bce { x, y } => v(*x).bce_with_logits(v(*y)),
        Step::Mse { a, b } => v(*a).mse_loss(v(*b)),
        Step::Detach { x } => v(*x).detach(),
        Step::WithGrad { x } => v(*x).with_grad(),
        Step::NoGrad(inner) => s.no_grad(|| step_on(s, values, inner)),
        Step::Const { dims, data } => s.tensor(&data.iter().map(|&x| c(x)).collect::<Vec<_>>(), dims),
        Step::Full { dims, v: x } => s.full(dims, c(*x)),
        Step::Conv2d { x, w, stride, padding } => v(*x).conv2d(v(*w), *stride, *padding),
        Step::Window { op, x, kernel, stride, padding } => match op {
            WindowOp::Im2Col => v(*x).im2col(*kernel, *stride, *padding),
            WindowOp::MaxPool2d => v(*x).max_pool2d(*kernel, *stride, *padding),
            WindowOp::AvgPool2d => v(*x).avg_pool2d(*kernel, *stride, *padding),
        },
        Step::Custom { xs, mode } => s.custom(mode.op(), &xs.iter().map(|&i| v(i)).collect::<Vec<_>>()),
        Step::Nop { .. } => values[values.len() - 1],
    }
}
