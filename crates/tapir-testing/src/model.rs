//! A reference model of the op set's shape rules, written from the documentation rather
//! than from the ops' code: for each [`Step`] it predicts the output shape, or the error
//! variant and op name that the engine must record.
//!
//! The harness compares the engine with this model after every step, so a shape rule
//! that drifts from its documentation, or an error reported under the wrong variant or
//! op name, is a finding.

use crate::program::{ReduceOp, Step, WindowOp};
use tapir::Error;
use tapir::MAX_RANK;

/// What a step must do, given its operands' shapes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Succeed with this shape.
    Ok(Vec<usize>),
    /// Record the error `variant` (the `Error` variant's name) under the op name `op`.
    Err { variant: &'static str, op: &'static str },
}

/// The name of `e`'s variant, as in [`Outcome::Err`].
pub(crate) fn variant(e: &Error) -> &'static str {
    match e {
        Error::ShapeMismatch { .. } => "ShapeMismatch",
        Error::Broadcast { .. } => "Broadcast",
        Error::MatMulShape { .. } => "MatMulShape",
        Error::BadAxis { .. } => "BadAxis",
        Error::InvalidShape { .. } => "InvalidShape",
        Error::ShapeList { .. } => "ShapeList",
        Error::IndexOutOfRange { .. } => "IndexOutOfRange",
        Error::DataLength { .. } => "DataLength",
        Error::NotScalar { .. } => "NotScalar",
        Error::NoGradient { .. } => "NoGradient",
        Error::SeedLength { .. } => "SeedLength",
        Error::BackwardTwice { .. } => "BackwardTwice",
        Error::ArenaLimit { .. } => "ArenaLimit",
        Error::OutOfMemory { .. } => "OutOfMemory",
        Error::TensorOutOfMemory { .. } => "TensorOutOfMemory",
        Error::WrongStore { .. } => "WrongStore",
        Error::TapeFull { .. } => "TapeFull",
        Error::NonFinite { .. } => "NonFinite",
        Error::InvalidArgument { .. } => "InvalidArgument",
        Error::UnknownParam { .. } => "UnknownParam",
        Error::Io { .. } => "Io",
        // `Error` is non-exhaustive: a variant added later has no name here until the
        // model learns it, so it never matches a prediction.
        _ => "unknown",
    }
}

fn err(variant: &'static str, op: &'static str) -> Outcome {
    Outcome::Err { variant, op }
}

/// `(B, T, C)` of a packed attention input `[B, T, 3C]` split into `heads` heads: `C` a
/// positive multiple of `heads`.
fn attention_dims(qkv: &[usize], heads: usize) -> Option<(usize, usize, usize)> {
    match *qkv {
        [b, t, c3] if c3 % 3 == 0 && c3 > 0 && heads > 0 && (c3 / 3) % heads == 0 => Some((b, t, c3 / 3)),
        _ => None,
    }
}

/// Whether `dims` make a valid shape: rank ≤ 6, each dimension fits in a `u32`, and the
/// element count fits in `isize::MAX / 8` (so an `f64` buffer of it is addressable).
pub(crate) fn valid_dims(dims: &[usize]) -> bool {
    dims.len() <= MAX_RANK
        && dims.iter().all(|&d| u32::try_from(d).is_ok())
        && (dims.contains(&0)
            || dims.iter().try_fold(1usize, |n, &d| n.checked_mul(d)).is_some_and(|n| n <= isize::MAX as usize / 8))
}

/// `axis` in `-rank..rank`, made non-negative.
pub(crate) fn resolve(rank: usize, axis: isize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

/// NumPy broadcasting: aligned from the right, each pair equal or containing a 1.
pub(crate) fn broadcast(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let rank = a.len().max(b.len());
    let at = |s: &[usize], i: usize| if i + s.len() >= rank { s[i + s.len() - rank] } else { 1 };
    (0..rank)
        .map(|i| match (at(a, i), at(b, i)) {
            (x, y) if x == y => Some(x),
            (1, y) => Some(y),
            (x, 1) => Some(x),
            _ => None,
        })
        .collect()
}

/// Elements of a shape: 0 with a zero dimension, whatever the others multiply to.
pub(crate) fn numel(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().fold(1usize, |n, &d| n.saturating_mul(d))
    }
}

/// An axis list that names one axis twice is an error, as in PyTorch's "dim appears
/// multiple times" (`mean_axes` and `var` would otherwise divide by the wrong count).
const REPEATED_AXIS: &str = "InvalidArgument";

/// `Some(reduced shape)` or the error of a reduction over `axes` (in the given order).
fn reduce(op: &'static str, x: &[usize], axes: &[isize], keepdim: bool, nonempty: bool) -> Outcome {
    let mut picked = [false; MAX_RANK];
    for &a in axes {
        match resolve(x.len(), a) {
            Some(ax) if picked[ax] => return err(REPEATED_AXIS, op),
            Some(ax) => picked[ax] = true,
            None => return err("BadAxis", op),
        }
    }
    if nonempty && (0..x.len()).any(|ax| picked[ax] && x[ax] == 0) {
        return err("InvalidShape", op);
    }
    let out = (0..x.len()).filter_map(|ax| match (picked[ax], keepdim) {
        (false, _) => Some(x[ax]),
        (true, true) => Some(1),
        (true, false) => None,
    });
    // Reducing a zero-size axis away can leave an element count that does not fit.
    checked(op, Some(out.collect()))
}

/// `x` with a size-1 axis inserted, or the error of `op` (`unsqueeze`, or `stack`).
fn unsqueezed(op: &'static str, x: &[usize], axis: isize) -> Result<Vec<usize>, Outcome> {
    let ax = resolve(x.len() + 1, axis).ok_or(err("BadAxis", op))?;
    if x.len() + 1 > MAX_RANK {
        return Err(err("InvalidShape", op));
    }
    let mut d = x.to_vec();
    d.insert(ax, 1);
    Ok(d)
}

/// The shape of concatenating `xs`, or the error of `op` (`concat`, or `stack`).
fn concat(op: &'static str, xs: &[&[usize]], axis: isize) -> Outcome {
    let Some(first) = xs.first() else {
        return err("InvalidArgument", op);
    };
    let Some(ax) = resolve(first.len(), axis) else {
        return err("BadAxis", op);
    };
    let agree = |s: &&[usize]| s.len() == first.len() && (0..s.len()).all(|d| d == ax || s[d] == first[d]);
    if !xs.iter().all(agree) {
        return err("ShapeList", op);
    }
    let mut out = first.to_vec();
    out[ax] = xs.iter().fold(0usize, |t, s| t.saturating_add(s[ax]));
    if valid_dims(&out) {
        Outcome::Ok(out)
    } else {
        err("InvalidShape", op)
    }
}

fn labels(op: &'static str, x: &[usize], labels: &[usize]) -> Outcome {
    if x.len() != 2 || x[0] != labels.len() {
        return err("InvalidShape", op);
    }
    if labels.iter().any(|&l| l >= x[1]) {
        return err("IndexOutOfRange", op);
    }
    Outcome::Ok(vec![])
}

/// `(oh, ow)` of a window over `x` (4-D), or the error `op` records.
fn window(
    op: &'static str,
    x: &[usize],
    k: [usize; 2],
    st: [usize; 2],
    p: [usize; 2],
    pool: bool,
) -> Result<(usize, usize), Outcome> {
    if x.len() != 4 {
        return Err(err("InvalidShape", op));
    }
    if k.iter().chain(&st).chain(&p).any(|&v| u32::try_from(v).is_err()) {
        return Err(err("InvalidArgument", op));
    }
    if k.contains(&0) || st.contains(&0) || (pool && (p[0] > k[0] / 2 || p[1] > k[1] / 2)) {
        return Err(err("InvalidArgument", op));
    }
    let fits = |len: usize, k: usize, p: usize| len.checked_add(p.checked_mul(2)?)?.checked_sub(k);
    match (fits(x[2], k[0], p[0]), fits(x[3], k[1], p[1])) {
        (Some(h), Some(w)) => Ok((h / st[0] + 1, w / st[1] + 1)),
        _ => Err(err("InvalidShape", op)),
    }
}

/// `dims` if they make a valid shape, else `InvalidShape` for `op`.
fn checked(op: &'static str, dims: Option<Vec<usize>>) -> Outcome {
    match dims {
        Some(d) if valid_dims(&d) => Outcome::Ok(d),
        _ => err("InvalidShape", op),
    }
}

/// The outcome of `step` when value `i` has shape `shapes[i]` and the scope holds no error.
pub(crate) fn outcome(step: &Step, shapes: &[Vec<usize>]) -> Outcome {
    let s = |i: usize| shapes[i].as_slice();
    let same = |i: usize| Outcome::Ok(shapes[i].clone());
    match step {
        Step::Binary { op, a, b } => broadcast(s(*a), s(*b)).map_or(err("Broadcast", op.name()), Outcome::Ok),
        Step::Compare { op, a, b } => broadcast(s(*a), s(*b)).map_or(err("Broadcast", op.name()), Outcome::Ok),
        Step::Scalar { x, .. } | Step::Unary { x, .. } | Step::Detach { x } | Step::WithGrad { x } => same(*x),
        Step::Clamp { x, lo, hi } => {
            if lo <= hi {
                same(*x)
            } else {
                err("InvalidArgument", "clamp")
            }
        }
        Step::MatMul { a, b } => {
            let (a, b) = (s(*a), s(*b));
            let (ra, rb) = (a.len(), b.len());
            if ra < 2 || rb < 2 || a[ra - 1] != b[rb - 2] {
                return err("MatMulShape", "matmul");
            }
            match broadcast(&a[..ra - 2], &b[..rb - 2]) {
                Some(mut out) => {
                    out.extend([a[ra - 2], b[rb - 1]]);
                    // A contracted zero leaves `m × n`, which may not be addressable: an
                    // output too large is a shape error of its own, not a rank problem.
                    if out.len() > MAX_RANK {
                        err("MatMulShape", "matmul")
                    } else if valid_dims(&out) {
                        Outcome::Ok(out)
                    } else {
                        err("InvalidShape", "matmul")
                    }
                }
                None => err("MatMulShape", "matmul"),
            }
        }
        Step::Linear { x, w, b } => {
            let (x, w, b) = (s(*x), s(*w), s(*b));
            let r = x.len();
            if r < 2 || w.len() != 2 || x[r - 1] != w[0] || b != [w[1]] {
                return err("InvalidArgument", "linear");
            }
            let mut out = x.to_vec();
            out[r - 1] = w[1];
            checked("linear", Some(out))
        }
        Step::LayerNorm { x, w, b, eps } => {
            let (x, w, b) = (s(*x), s(*w), s(*b));
            match x.last() {
                Some(&c) if w == [c] && b == [c] && eps.is_finite() && *eps >= 0.0 => {
                    checked("layer_norm", Some(x.to_vec()))
                }
                _ => err("InvalidArgument", "layer_norm"),
            }
        }
        Step::AttentionWeights { qkv, heads, .. } => match attention_dims(s(*qkv), *heads) {
            Some((b, t, _)) if u32::try_from(*heads).is_ok() => {
                checked("attention_weights", Some(vec![b, *heads, t, t]))
            }
            _ => err("InvalidArgument", "attention_weights"),
        },
        Step::Attend { p, qkv } => {
            let sp = s(*p);
            let heads = if sp.len() == 4 { sp[1] } else { 0 };
            match attention_dims(s(*qkv), heads) {
                Some((b, t, c)) if sp == [b, heads, t, t] => checked("attend", Some(vec![b, t, c])),
                _ => err("InvalidArgument", "attend"),
            }
        }
        Step::Reshape { x, dims } => {
            if valid_dims(dims) && numel(dims) == numel(s(*x)) {
                Outcome::Ok(dims.clone())
            } else {
                err("InvalidShape", "reshape")
            }
        }
        Step::Permute { x, axes } => {
            let x = s(*x);
            let mut sorted = axes.clone();
            sorted.sort_unstable();
            if sorted.iter().copied().eq(0..x.len()) {
                Outcome::Ok(axes.iter().map(|&a| x[a]).collect())
            } else {
                err("InvalidShape", "permute")
            }
        }
        Step::Transpose { x, a0, a1 } => {
            let x = s(*x);
            match (resolve(x.len(), *a0), resolve(x.len(), *a1)) {
                (Some(p), Some(q)) => {
                    let mut out = x.to_vec();
                    out.swap(p, q);
                    Outcome::Ok(out)
                }
                _ => err("BadAxis", if (*a0, *a1) == (-2, -1) { "t" } else { "transpose" }),
            }
        }
        Step::BroadcastTo { x, dims } => {
            if !valid_dims(dims) {
                return err("InvalidShape", "broadcast_to");
            }
            let x = s(*x);
            if x.len() <= dims.len() && broadcast(x, dims).as_deref() == Some(dims.as_slice()) {
                Outcome::Ok(dims.clone())
            } else {
                err("Broadcast", "broadcast_to")
            }
        }
        Step::Squeeze { x, axis } => {
            let x = s(*x);
            match resolve(x.len(), *axis) {
                Some(ax) if x[ax] == 1 => {
                    let mut out = x.to_vec();
                    out.remove(ax);
                    Outcome::Ok(out)
                }
                Some(_) => err("InvalidShape", "squeeze"),
                None => err("BadAxis", "squeeze"),
            }
        }
        Step::Unsqueeze { x, axis } => unsqueezed("unsqueeze", s(*x), *axis).map_or_else(|e| e, Outcome::Ok),
        Step::Narrow { x, axis, start, len } => {
            let x = s(*x);
            let Some(ax) = resolve(x.len(), *axis) else {
                return err("BadAxis", "narrow");
            };
            if start.checked_add(*len).is_none_or(|end| end > x[ax]) {
                return err("IndexOutOfRange", "narrow");
            }
            let mut out = x.to_vec();
            out[ax] = *len;
            checked("scatter_add", Some(out))
        }
        Step::Concat { xs, axis } => concat("concat", &xs.iter().map(|&i| s(i)).collect::<Vec<_>>(), *axis),
        Step::Stack { xs, axis } => {
            let mut expanded = Vec::with_capacity(xs.len());
            for &i in xs {
                match unsqueezed("stack", s(i), *axis) {
                    Ok(d) => expanded.push(d),
                    Err(e) => return e,
                }
            }
            concat("stack", &expanded.iter().map(Vec::as_slice).collect::<Vec<_>>(), *axis)
        }
        Step::IndexSelect { x, axis, indices } => {
            let x = s(*x);
            let Some(ax) = resolve(x.len(), *axis) else {
                return err("BadAxis", "index_select");
            };
            if indices.iter().any(|&i| i >= x[ax]) {
                return err("IndexOutOfRange", "index_select");
            }
            let mut out = x.to_vec();
            out[ax] = indices.len();
            Outcome::Ok(out)
        }
        Step::PadAxis { x, axis, before, after } => {
            let x = s(*x);
            let Some(ax) = resolve(x.len(), *axis) else {
                return err("BadAxis", "pad_axis");
            };
            let mut out = x.to_vec();
            out[ax] += before + after;
            checked("pad_axis", Some(out))
        }
        Step::ScatterAdd { x, axis, indices, len } => {
            let x = s(*x);
            let Some(ax) = resolve(x.len(), *axis) else {
                return err("BadAxis", "scatter_add");
            };
            if indices.len() != x[ax] {
                return err("InvalidShape", "scatter_add");
            }
            if indices.iter().any(|&i| i >= *len) {
                return err("IndexOutOfRange", "scatter_add");
            }
            let mut out = x.to_vec();
            out[ax] = *len;
            checked("scatter_add", Some(out))
        }
        Step::Where { cond, a, b } => match broadcast(s(*cond), s(*a)).and_then(|ca| broadcast(&ca, s(*b))) {
            Some(out) => Outcome::Ok(out),
            None => err("Broadcast", "where"),
        },
        Step::Reduce { op, x, axes, keepdim } => {
            let x = s(*x);
            let nonempty = matches!(op, ReduceOp::Max | ReduceOp::Min);
            match axes {
                Some(axes) => reduce(op.axes_name(), x, axes, *keepdim, nonempty),
                None if nonempty && numel(x) == 0 => err("InvalidShape", op.whole_name()),
                None => Outcome::Ok(vec![]),
            }
        }
        Step::Var { x, axes, keepdim, .. } => reduce("var", s(*x), axes, *keepdim, false),
        Step::LogSumExp { x, axis, keepdim } => reduce("logsumexp", s(*x), &[*axis], *keepdim, true),
        Step::Softmax { x, axis, log } => match resolve(s(*x).len(), *axis) {
            Some(_) => same(*x),
            None => err("BadAxis", if *log { "log_softmax" } else { "softmax" }),
        },
        Step::CrossEntropy { x, labels: l } => labels("cross_entropy", s(*x), l),
        Step::Nll { x, labels: l } => labels("nll_loss", s(*x), l),
        Step::Bce { x, y } => {
            if s(*x) == s(*y) {
                Outcome::Ok(vec![])
            } else {
                err("ShapeMismatch", "bce_with_logits")
            }
        }
        Step::Mse { a, b } => match broadcast(s(*a), s(*b)) {
            Some(_) => Outcome::Ok(vec![]),
            None => err("Broadcast", "mse_loss"),
        },
        Step::NoGrad(inner) => outcome(inner, shapes),
        Step::Const { dims, data } => {
            if !valid_dims(dims) {
                err("InvalidShape", "tensor")
            } else if data.len() != numel(dims) {
                err("DataLength", "tensor")
            } else {
                Outcome::Ok(dims.clone())
            }
        }
        Step::Full { dims, .. } => {
            if valid_dims(dims) {
                Outcome::Ok(dims.clone())
            } else {
                err("InvalidShape", "full")
            }
        }
        Step::Window { op, x, kernel, stride, padding } => {
            let x = s(*x);
            let pool = *op != WindowOp::Im2Col;
            let (oh, ow) = match window(op.name(), x, *kernel, *stride, *padding, pool) {
                Ok(o) => o,
                Err(e) => return e,
            };
            let dims = if pool {
                Some(vec![x[0], x[1], oh, ow])
            } else {
                let k = x[1].checked_mul(kernel[0]).and_then(|k| k.checked_mul(kernel[1]));
                k.zip(oh.checked_mul(ow)).map(|(k, l)| vec![x[0], k, l])
            };
            checked(op.name(), dims)
        }
        Step::Nop { .. } => Outcome::Ok(shapes[shapes.len() - 1].clone()),
        // Any operands: the others are summed (`program/custom.rs`).
        Step::Custom { xs, .. } => same(xs[0]),
        Step::Conv2d { x, w, stride, padding } => {
            let (x, w) = (s(*x), s(*w));
            if x.len() != 4 || w.len() != 4 || x[1] != w[1] {
                return err("InvalidShape", "conv2d");
            }
            let (oh, ow) = match window("conv2d", x, [w[2], w[3]], *stride, *padding, false) {
                Ok(o) => o,
                Err(e) => return e,
            };
            match checked(
                "conv2d",
                oh.checked_mul(ow).map(|l| vec![x[0], w[1].saturating_mul(w[2]).saturating_mul(w[3]), l]),
            ) {
                Outcome::Ok(_) => checked("conv2d", Some(vec![x[0], w[0], oh, ow])),
                e => e,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_and_dims_follow_the_documented_rules() {
        assert_eq!(broadcast(&[4, 1, 3], &[5, 1]), Some(vec![4, 5, 3]));
        assert_eq!(broadcast(&[2], &[3]), None);
        assert_eq!(broadcast(&[], &[2, 2]), Some(vec![2, 2]));
        assert!(!valid_dims(&[1; 7]));
        assert!(!valid_dims(&[1 << 32]));
        assert!(!valid_dims(&[1 << 31, 1 << 31, 4]));
        assert!(valid_dims(&[0, 1 << 31]));
        assert_eq!(resolve(2, -1), Some(1));
        assert_eq!(resolve(0, 0), None);
    }
}
