//! The per-example rules: what one boundary (an op reading the examples and a parameter,
//! see the [module](super)) contributes to the parameter's gradient from a run of
//! consecutive examples (a [`Lane`]), and how a gradient follows the parameter back
//! through `reshape` and `permute`. Every rule is the op's backward kernel run on the
//! examples' slices, so a lane of all `B` examples gives the ordinary gradient and a lane
//! of one example that example's gradient. The rules are linear in the output's gradient:
//! a weighted sum of per-example gradients is one lane over all examples with each
//! example's slice of the output gradient scaled.

use faer::Par;

use crate::dtype::Float;
use crate::engine::per_example::{aligned, Boundary, Plan};
use crate::kernels::matmul::{self as kmatmul, MatMulDims};
use crate::kernels::{layout, norm};
use crate::record::handles::State;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::Op;
use crate::tape::tape::Tape;

/// Whether a parameter-only operand of shape `p` is broadcast over the batch axis of an
/// output of rank `out_rank` (not aligned with it row by row).
fn broadcast(p: Shape, out_rank: usize) -> bool {
    p.rank() < out_rank || p.rank() == 0 || p.dim(0) == 1
}

/// Whether op `op` has a per-example rule for its parameter-only input `p`.
pub(crate) fn has_rule<'s, T: Float>(tape: &State<'s, T>, op: &Op<'s, T>, out: Shape, p: NodeId<'s>) -> bool {
    let sp = tape.shape(p);
    match *op {
        Op::Linear { w, b, .. } => p == w || p == b,
        // A 2-D parameter is one matrix for every product; a batched one must be broadcast.
        Op::MatMul { a, b, .. } => (p == a) != (p == b) && (sp.rank() == 2 || broadcast(sp, out.rank())),
        Op::Binary { a, b, .. } => (p == a) != (p == b) && broadcast(sp, out.rank()),
        Op::LayerNorm { first, .. } => tape.stored_ids(first, 3).skip(1).any(|x| x == p),
        Op::IndexSelect { axis, .. } => axis == 0,
        _ => false,
    }
}

/// A run of `n` consecutive examples from `e0`, of `batch`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lane {
    pub e0: usize,
    pub n: usize,
    pub batch: usize,
}

impl Lane {
    /// The lane's part of a batch-major value.
    pub(crate) fn slice<'a, T>(&self, v: &'a [T]) -> &'a [T] {
        let per = v.len() / self.batch;
        &v[self.e0 * per..(self.e0 + self.n) * per]
    }

    /// The lane's part of a batch-major shape.
    fn shape(&self, s: Shape) -> Shape {
        s.with_dim(0, s.dim(0) / self.batch * self.n).expect("no larger than the shape")
    }
}

/// Adds boundary `b`'s contribution from `lane` to `dst` (the gradient of `b.p`), `dout`
/// being the lane's slice of `b.v`'s gradient; with `write`, `dst`'s elements are
/// unspecified and are overwritten instead (a fresh output is then written once, not
/// read first). `stats` is scratch for layer norms.
pub(crate) fn contribute<'s, T: Float>(
    tape: &Tape<'s, T>,
    b: &Boundary<'s>,
    (lane, write): (Lane, bool),
    dout: &[T],
    dst: &mut [T],
    (par, stats): (Par, &mut Vec<T>),
) {
    let op = tape.nodes[b.v.index()].op;
    let writes = match op {
        Op::Linear { w, x, .. } => b.p == w && tape.shape(x).numel() > 0 && tape.shape(w).numel() > 0,
        _ => false,
    };
    if write && !writes {
        dst.fill(T::ZERO);
    }
    let add = !(write && writes);
    let out = tape.shape(b.v);
    let so = lane.shape(out);
    // An operand aligned with the output row by row is sliced too; a broadcast one is whole.
    let part = |x: NodeId<'s>| {
        let s = tape.shape(x);
        if aligned(s, out) {
            (lane.slice(tape.value(x)), lane.shape(s))
        } else {
            (tape.value(x), s)
        }
    };
    match op {
        Op::Linear { x, w, b: bias } => {
            let (k, cols) = (tape.shape(w).dim(0), tape.shape(w).dim(1));
            let m = so.numel().checked_div(cols).unwrap_or(0);
            if b.p == w && m == 1 && cols > 0 {
                // One row per example: an outer product, faster as a loop than as a GEMM.
                for (row, &xa) in dst.chunks_exact_mut(cols).zip(lane.slice(tape.value(x))) {
                    if add {
                        row.iter_mut().zip(dout).for_each(|(d, &g)| *d += xa * g);
                    } else {
                        row.iter_mut().zip(dout).for_each(|(d, &g)| *d = xa * g);
                    }
                }
            } else if b.p == w && m > 0 && k > 0 && cols > 0 {
                T::gemm(dst, lane.slice(tape.value(x)), true, dout, false, (k, m, cols), add, par);
            } else if b.p == w && !add {
                dst.fill(T::ZERO);
            }
            if b.p == bias && cols > 0 {
                for row in dout.chunks_exact(cols) {
                    crate::kernels::add_assign(dst, row);
                }
            }
        }
        Op::MatMul { a, b: rhs, ta, tb } => {
            let ((va, sa), (vb, sb)) = (part(a), part(rhs));
            let dims = MatMulDims::new_t(&sa, &sb, ta, tb).expect("a slice of a recorded product").0;
            if b.p == a {
                kmatmul::backward_a(&dims, dout, vb, dst, false, par, &mut []);
            } else {
                kmatmul::backward_b(&dims, dout, va, dst, false, par, &mut []);
            }
        }
        Op::Binary { f, a, b: rhs } => {
            let ((va, sa), (vb, sb)) = (part(a), part(rhs));
            if b.p == a {
                f.grad_a(par, (dout, &so), (va, &sa), (vb, &sb), (dst, false));
            } else {
                f.grad_b(par, (dout, &so), (va, &sa), (vb, &sb), (dst, false));
            }
        }
        Op::LayerNorm { first, eps } => {
            let mut ids = tape.stored_ids(first, 3);
            let (x, w) = (ids.next().expect("three ids"), ids.next().expect("three ids"));
            let c = tape.shape(w).numel();
            let vx = lane.slice(tape.value(x));
            if c == 0 || vx.is_empty() {
                return;
            }
            if b.p == w {
                stats.clear();
                stats.resize(2 * (vx.len() / c), T::ZERO);
                norm::row_stats(par, vx, c, eps, stats);
                norm::backward_w(dout, vx, stats, dst);
            } else {
                norm::backward_b(dout, dst);
            }
        }
        Op::IndexSelect { idx, .. } => {
            let k = out.dim(0);
            if k == 0 || out.numel() == 0 {
                return;
            }
            let (inner, per) = (out.numel() / k, k / lane.batch);
            let at = idx as usize + lane.e0 * per;
            for (j, &i) in tape.extra[at..at + lane.n * per].iter().enumerate() {
                let i = i as usize;
                crate::kernels::add_assign(&mut dst[i * inner..(i + 1) * inner], &dout[j * inner..(j + 1) * inner]);
            }
        }
        // `has_rule` admitted no other op as a boundary.
        _ => debug_assert!(false, "no per-example rule"),
    }
}

/// Moves the gradients of the parameter-only nodes in `plan.free` (latest first) to their
/// inputs, down to the parameters.
pub(crate) fn follow<'s, T: Float>(tape: &State<'s, T>, plan: &Plan<'s>, bufs: &mut [Option<&'s mut [T]>]) {
    for &f in &plan.free {
        let Some(g) = bufs[f.index()].take() else { continue };
        match tape.nodes[f.index()].op {
            Op::Reshape { x } => {
                if let Some(dx) = bufs[x.index()].as_deref_mut() {
                    crate::kernels::add_assign(dx, g);
                }
            }
            Op::Permute { x, axes } => {
                let (sx, so) = (tape.shape(x), tape.shape(f));
                let axes: Vec<usize> = axes[..sx.rank()].iter().map(|&a| a as usize).collect();
                if let Some(dx) = bufs[x.index()].as_deref_mut() {
                    layout::permute_grad(g, &sx, &axes, &so, dx);
                }
            }
            _ => debug_assert!(false, "the plan follows reshape and permute only"),
        }
        bufs[f.index()] = Some(g);
    }
}

/// Whether parameter `param`'s per-example norms have a closed form (see [`ghost`]): its
/// one boundary is `linear` or a product with it as the right, untransposed-left factor.
pub(crate) fn has_ghost<'s, T: Float>(tape: &State<'s, T>, plan: &Plan<'s>, param: usize) -> bool {
    let mut it = plan.boundaries.iter().filter(|b| b.param == param);
    let (Some(b), None) = (it.next(), it.next()) else { return false };
    match tape.nodes[b.v.index()].op {
        Op::Linear { .. } => true,
        Op::MatMul { a, b: rhs, ta, .. } => b.p == rhs && b.p != a && !ta && tape.shape(rhs).rank() == 2,
        _ => false,
    }
}

/// Adds each example's squared norm of boundary `b`'s contribution to `sq`, without
/// forming it where that is cheaper: for a weight, `‖Xₑᵀ Gₑ‖² = ‖xₑ‖²‖gₑ‖²` for one row
/// per example and `Σ (XₑXₑᵀ) ⊙ (GₑGₑᵀ)` for a few rows; for a bias `‖Σ_rows Gₑ‖²`.
/// `dout` is `b.v`'s whole gradient, `scratch` reusable memory.
pub(crate) fn ghost<'s, T: Float>(
    tape: &State<'s, T>,
    b: &Boundary<'s>,
    (batch, dout): (usize, &[T]),
    sq: &mut [T],
    (par, scratch): (Par, &mut Vec<T>),
) {
    let (x, k, is_bias) = match tape.nodes[b.v.index()].op {
        Op::Linear { x, w, .. } => (x, tape.shape(w).dim(0), b.p != w),
        Op::MatMul { a, .. } => (a, *tape.shape(a).dims().last().expect("a matrix") as usize, false),
        _ => return,
    };
    let cols = *tape.shape(b.v).dims().last().expect("a matrix") as usize;
    let (vx, rows) = (tape.value(x), dout.len().checked_div(cols).unwrap_or(0) / batch);
    if rows == 0 || cols == 0 {
        return;
    }
    let dot = |a: &[T], b: &[T]| a.iter().zip(b).fold(T::ZERO, |s, (&x, &y)| s + x * y);
    for (e, s) in sq.iter_mut().enumerate() {
        let lane = Lane { e0: e, n: 1, batch };
        let g = lane.slice(dout);
        if is_bias {
            scratch.clear();
            scratch.resize(cols, T::ZERO);
            for row in g.chunks_exact(cols) {
                crate::kernels::add_assign(scratch, row);
            }
            *s += dot(scratch, scratch);
            continue;
        }
        let xe = lane.slice(vx);
        if rows == 1 {
            *s += dot(xe, xe) * dot(g, g);
        } else if rows * (k + cols) <= k * cols {
            scratch.clear();
            scratch.resize(2 * rows * rows, T::ZERO);
            let (gx, gg) = scratch.split_at_mut(rows * rows);
            T::gemm(gx, xe, false, xe, true, (rows, k, rows), false, par);
            T::gemm(gg, g, false, g, true, (rows, cols, rows), false, par);
            *s += dot(gx, gg);
        } else {
            scratch.clear();
            scratch.resize(k * cols, T::ZERO);
            T::gemm(scratch, xe, true, g, false, (k, rows, cols), false, par);
            *s += dot(scratch, scratch);
        }
    }
}
