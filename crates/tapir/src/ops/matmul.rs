//! Matrix product `out = a · b` for `a: [..., m, k]`, `b: [..., k, n]`, batch dimensions
//! broadcast (NumPy `matmul` rules; both operands need rank ≥ 2).
//!
//! Backward, with `dout = ∂L/∂out` (`[..., m, n]`):
//! `da += dout · bᵀ` and `db += aᵀ · dout`, summed over broadcast batch dimensions.
//! Both products run through faer with transposed views (no transpose is materialised).
//! An input's first gradient is written (`Accum::Replace`, into a buffer that need not be
//! zeroed: `BackwardCtx::grad_pair_write`); a later one is added (`Accum::Add`), so
//! `x · x` gets both terms.
//!
//! `linear`: `out = x · w + b` for `x: [..., k]` (rank ≥ 2), `w: [k, n]`, `b: [n]`, one
//! node where `matmul` then `+` make two: the output starts as `b` in every row and faer
//! adds the product into it (`Accum::Add`), so there is no separate product value, no
//! second pass and no second gradient. With `x` seen as `[M, k]` (`M` its leading
//! elements) and `dout: [M, n]`: `dx += dout · wᵀ`, `dw += xᵀ · dout`,
//! `db += Σ_rows dout`, the bias sum by the same kernel as `+`'s broadcast gradient.
//! Recorded derivative: `matmul`'s, plus `g` summed to `[n]` for `b`.
//!
//! Recorded derivatives (`Scope::grad`) multiply by transposed operands through
//! `matmul_t`: a `matmul` node with a transpose flag per operand, which faer reads as a
//! transposed view, so no `permute` copy is recorded (for W7's Hessian-vector product
//! those copies were 4 MB transposes of the weights, several per call).

use crate::dtype::Float;
use crate::error::Result;
use crate::kernels;
use crate::kernels::matmul::{self as kmatmul, MatMulDims};
use crate::record::ctx::{plus, BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::Var;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};
use crate::tape::profile::{product, Profiler};
use faer::Par;

impl<'s, T: Float> Var<'s, T> {
    /// Matrix product (batched, with broadcast batch dimensions).
    ///
    /// # Errors
    /// [`Error::MatMulShape`](crate::Error::MatMulShape) (recorded) unless both ranks are ≥ 2, `a`'s last dimension
    /// equals `b`'s second-to-last, and the batch dimensions broadcast;
    /// [`Error::InvalidShape`](crate::Error::InvalidShape) if the output would not fit in memory.
    #[track_caller]
    pub fn matmul(self, b: Var<'s, T>) -> Var<'s, T> {
        self.matmul_t(b, false, false)
    }

    /// `op(self)·op(b)`, where `op` transposes the last two axes of `self` if `ta` and of
    /// `b` if `tb`, without copying either: the product the recorded derivatives of
    /// `matmul` and `linear` need (`g·bᵀ`, `aᵀ·g`). One node, `matmul`.
    #[track_caller]
    pub(crate) fn matmul_t(self, b: Var<'s, T>, ta: bool, tb: bool) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::MatMul, |r| {
            let (sa, sb) = (r.shape(self.id), r.shape(b.id));
            let (dims, so) =
                MatMulDims::new_t(&sa, &sb, ta, tb).map_err(|p| MatMulDims::error(r.op, sa, sb, p, r.location))?;
            // A product over an empty `k` writes nothing: its zeros are the fill's.
            let out = if dims.k > 0 { r.alloc_written(so.numel())? } else { r.alloc(so.numel())? };
            let (va, vb) = (r.value(self.id), r.value(b.id));
            product(r.tape.profile, || kmatmul::forward(&dims, va, vb, out, par));
            Ok((Op::MatMul { a: self.id, b: b.id, ta, tb }, so, out))
        })
    }

    /// `self · w + b`, a fully connected layer in one node: `self: [..., k]` (rank ≥ 2),
    /// `w: [k, n]`, `b: [n]`, output `[..., n]`. The value and gradients are those of
    /// `self.matmul(w) + b` up to rounding, with one node's memory instead of two.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) (recorded), naming the
    /// three shapes, unless `self` has rank ≥ 2, `w` is `[k, n]` with `k` `self`'s last
    /// dimension, and `b` is `[n]`; [`Error::InvalidShape`](crate::Error::InvalidShape) if
    /// the output would not fit in memory.
    #[track_caller]
    pub fn linear(self, w: Var<'s, T>, b: Var<'s, T>) -> Var<'s, T> {
        let par = self.core.par;
        self.core.record(OpKind::Linear, |r| {
            let (sx, sw, sb) = (r.shape(self.id), r.shape(w.id), r.shape(b.id));
            let r_x = sx.rank();
            let fits = r_x >= 2 && sw.rank() == 2 && sx.dim(r_x - 1) == sw.dim(0) && sb.dims() == &sw.dims()[1..];
            if !fits {
                return Err(
                    r.invalid(format!("x {sx}, w {sw}, b {sb}: needs x [..., k] of rank >= 2, w [k, n] and b [n]"))
                );
            }
            let (k, n) = (sw.dim(0), sw.dim(1));
            let mut dims = sx.to_array();
            dims[r_x - 1] = n;
            let so = r.shape_of(sx, &dims[..r_x])?;
            // Every row is the bias before the product adds into it.
            let out = r.alloc_written(so.numel())?;
            let profile = r.tape.profile;
            linear_into(out, r.value(self.id), r.value(w.id), r.value(b.id), (k, n), (par, profile));
            Ok((Op::Linear { x: self.id, w: w.id, b: b.id }, so, r.hold_for_reader(out)))
        })
    }
}

/// `out = x·w + b` for `w: [k, n]`, `out` of `m·n` elements; the product's time counts in
/// the profile if there is one.
fn linear_into<T: Float>(
    out: &mut [T],
    x: &[T],
    w: &[T],
    b: &[T],
    (k, n): (usize, usize),
    (par, profile): (Par, Option<&Profiler>),
) {
    // Empty outputs skip both passes (a leading dimension may be huge beside a 0).
    if !out.is_empty() {
        kernels::par::fill_rows(par, out, b);
        if k > 0 {
            let m = out.len() / n;
            product(profile, || T::gemm(out, x, false, w, false, (m, k, n), true, par));
        }
    }
}

/// Computes the value of `linear` node `id` again from its inputs into a fresh buffer
/// and makes it the node's value: for a read of a value that a checkpointed block's
/// forward overwrote in place (see [`InPlace`](crate::tape::in_place::InPlace)).
pub(crate) fn relinear<'s, T: Float>(r: &mut Rec<'_, 's, T>, id: NodeId<'s>, par: Par) -> Result<()> {
    let Op::Linear { x, w, b } = r.node(id).op else {
        unreachable!("only linear outputs are overwritten in place");
    };
    let (k, n) = (r.shape(w).dim(0), r.shape(w).dim(1));
    let out = r.alloc(r.shape(id).numel())?;
    let profile = r.tape.profile;
    linear_into(out, r.value(x), r.value(w), r.value(b), (k, n), (par, profile));
    r.tape.nodes[id.index()].value = out;
    r.tape.in_place.restored(id.raw());
    Ok(())
}

#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
    ta: bool,
    tb: bool,
) -> Result<()> {
    let dims = MatMulDims::new_t(&ctx.shape(a), &ctx.shape(b), ta, tb)
        .expect("shapes were checked when matmul was recorded")
        .0;
    let (va, vb, par, profile) = (ctx.value(a), ctx.value(b), ctx.par, ctx.tape.profile);
    // A matrix broadcast over the batch (a convolution's weights) sums its gradient in
    // groups of products, each group's sum in scratch of its own (`sum_groups`).
    let (m, k, n) = (dims.m, dims.k, dims.n);
    if ctx.requires_grad(a) {
        let scratch = sum_scratch(ctx, kmatmul::sum_groups(&dims, &dims.a_batch), m * k)?;
        if let Some((dout, da, first)) = ctx.grad_pair_write(out, a)? {
            product(profile, || kmatmul::backward_a(&dims, dout, vb, da, first, par, scratch));
        }
    }
    if ctx.requires_grad(b) {
        let scratch = sum_scratch(ctx, kmatmul::sum_groups(&dims, &dims.b_batch), k * n)?;
        if let Some((dout, db, first)) = ctx.grad_pair_write(out, b)? {
            product(profile, || kmatmul::backward_b(&dims, dout, va, db, first, par, scratch));
        }
    }
    Ok(())
}

/// Scratch for `groups` group sums of `len` elements each (none for one group), from the
/// scope's arena.
fn sum_scratch<'s, T: Float>(ctx: &BackwardCtx<'_, 's, T>, groups: usize, len: usize) -> Result<&'s mut [T]> {
    if groups <= 1 {
        return Ok(&mut []);
    }
    ctx.scratch(groups * len)
}

#[inline(never)]
pub(crate) fn backward_linear<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    w: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let (sw, sb, so) = (ctx.shape(w), ctx.shape(b), ctx.shape(out));
    // An empty output or inner dimension contributes empty sums: the slots are made (as
    // zeros) but no product runs (a leading dimension may be huge beside a 0).
    let (k, n) = (sw.dim(0), sw.dim(1));
    let products = so.numel() > 0 && k > 0;
    let m = if so.numel() > 0 { so.numel() / n } else { 0 };
    let (vx, vw, vb, par, profile) = (ctx.value(x), ctx.value(w), ctx.value(b), ctx.par, ctx.tape.profile);
    // A first gradient is written, not added (`grad_pair_write`); without a product it
    // is zero.
    if let Some((dout, dx, first)) = ctx.grad_pair_write(out, x)? {
        if products {
            product(profile, || T::gemm(dx, dout, false, vw, true, (m, n, k), !first, par));
        } else if first {
            dx.fill(T::ZERO);
        }
    }
    if let Some((dout, dw, first)) = ctx.grad_pair_write(out, w)? {
        if products {
            product(profile, || T::gemm(dw, vx, true, dout, false, (k, m, n), !first, par));
        } else if first {
            dw.fill(T::ZERO);
        }
    }
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        if so.numel() > 0 {
            // `+`'s gradient for a bias broadcast over rows: column blocks, rows in order.
            let rows = crate::shape::Shape::new(&[m, n]).expect("no larger than the output's shape");
            kernels::par::binary_grad(par, (dout, &rows), (vb, &sb), (dout, &rows), db, |g, _, _| g);
        }
    }
    Ok(())
}

/// Recorded derivative of `linear`: `matmul`'s for `x` and `w`, and `g` summed over the
/// rows for `b`.
#[track_caller]
pub(crate) fn grad_linear<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    x: NodeId<'s>,
    w: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    grad(ctx, g, x, w, false, false)?;
    if ctx.wants(b) {
        ctx.add_reduced(b, g);
    }
    Ok(())
}

/// Recorded derivative of `out = op(a)·op(b)`, as products of the stored operands with
/// transpose flags (no transpose is materialised), each summed over broadcast batch
/// dimensions: `da = g·op(b)ᵀ`, or `op(b)·gᵀ` if `a` is used transposed; `db = op(a)ᵀ·g`,
/// or `gᵀ·op(a)` if `b` is. The products of these derivatives are again of this form, so
/// every order of derivative is copy-free.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    g: Var<'s, T>,
    a: NodeId<'s>,
    b: NodeId<'s>,
    ta: bool,
    tb: bool,
) -> Result<()> {
    let (va, vb) = (ctx.var(a), ctx.var(b));
    if ctx.wants(a) {
        let da = if ta { vb.matmul_t(g, tb, true) } else { g.matmul_t(vb, false, !tb) };
        ctx.add_reduced(a, da);
    }
    if ctx.wants(b) {
        let db = if tb { g.matmul_t(va, true, ta) } else { va.matmul_t(g, !ta, false) };
        ctx.add_reduced(b, db);
    }
    Ok(())
}

/// Forward rule of `matmul`: `op(ta)·op(b) + op(a)·op(tb)` (the product rule, transpose
/// flags kept).
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
    ta: bool,
    tb: bool,
) -> Result<Option<Var<'s, T>>> {
    let (va, vb) = (ctx.var(a), ctx.var(b));
    let left = ctx.tangent(a).map(|t| t.matmul_t(vb, ta, tb));
    let right = ctx.tangent(b).map(|t| va.matmul_t(t, ta, tb));
    Ok(plus(left, right).map(|t| ctx.fit(out, t)))
}

/// Forward rule of `linear`: `tx·w + x·tw + tb`.
#[track_caller]
pub(crate) fn jvp_linear<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    x: NodeId<'s>,
    w: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    let (vx, vw) = (ctx.var(x), ctx.var(w));
    let product = plus(ctx.tangent(x).map(|t| t.matmul(vw)), ctx.tangent(w).map(|t| vx.matmul(t)));
    Ok(plus(product, ctx.tangent(b)).map(|t| ctx.fit(out, t)))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use rand::{RngExt, SeedableRng};

    // A unit test drives the rule through the public API (test modules are outside the
    // layering: docs/architecture.md, invariant 1).
    use crate::graph::graph::Graph;
    use crate::tensor::Tensor;
    use crate::testing::{gradcheck, gradgradcheck, GradcheckOptions};

    fn tensor(dims: &[usize], seed: u64) -> Tensor<f64> {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let n: usize = dims.iter().product();
        Tensor::from_vec((0..n).map(|_| rng.random_range(-2.0..2.0)).collect(), dims).unwrap()
    }

    /// The stored shapes of `a` and `b` for `op(a): [..., m, k]`, `op(b): [..., k, n]`:
    /// plain, `a` batched, `b` batched with a broadcast batch axis.
    fn stored(
        which: u8,
        batch: usize,
        (m, k, n): (usize, usize, usize),
        ta: bool,
        tb: bool,
    ) -> (Vec<usize>, Vec<usize>) {
        let a = if ta { vec![k, m] } else { vec![m, k] };
        let b = if tb { vec![n, k] } else { vec![k, n] };
        let lead = |x: Vec<usize>, l: &[usize]| l.iter().copied().chain(x).collect::<Vec<_>>();
        match which {
            0 => (a, b),
            1 => (lead(a, &[batch]), b),
            _ => (lead(a, &[1]), lead(b, &[2, batch])),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]

        /// `matmul_t` equals `matmul` of explicitly transposed operands; its fast backward
        /// and its recorded derivative match central differences.
        #[test]
        fn transposed_operands(which in 0u8..3, batch in 1usize..=2, m in 1usize..=3, k in 1usize..=3, n in 1usize..=3, ta: bool, tb: bool, seed: u64) {
            let (sa, sb) = stored(which, batch, (m, k, n), ta, tb);
            let inputs = [tensor(&sa, seed), tensor(&sb, seed ^ 1)];
            let mut g = Graph::<f64>::new();
            let (fused, explicit) = g.scope(|s| {
                let (a, b) = (s.input(&inputs[0]), s.input(&inputs[1]));
                let (oa, ob) = (if ta { a.t() } else { a }, if tb { b.t() } else { b });
                (a.matmul_t(b, ta, tb).value().unwrap().to_vec(), oa.matmul(ob).value().unwrap().to_vec())
            });
            prop_assert_eq!(fused.len(), explicit.len());
            for (x, y) in fused.iter().zip(&explicit) {
                prop_assert!((x - y).abs() <= 1e-12 * (1.0 + y.abs()), "{x} vs {y}");
            }
            let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
            gradcheck(&inputs, opts, |_, v| v[0].matmul_t(v[1], ta, tb)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            gradgradcheck(&inputs, opts, |_, v| v[0].matmul_t(v[1], ta, tb).tanh())
                .map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }

    /// `backward` through a recorded gradient, whose products are transposed ones: the
    /// Hessian-vector product of `L = Σ tanh(x·w)` by `backward` of `⟨∂L/∂(x, w), v⟩` equals
    /// the one by a second recorded gradient.
    #[test]
    fn backward_through_recorded_products() {
        let (x, w) = (tensor(&[3, 4], 1), tensor(&[4, 2], 2));
        let (vx, vw) = (tensor(&[3, 4], 3), tensor(&[4, 2], 4));
        let mut g = Graph::<f64>::new();
        g.scope(|s| {
            let (x, w) = (s.leaf(&x), s.leaf(&w));
            let l = x.matmul(w).tanh().sum();
            let [gx, gw] = s.grad(l, [x, w]).unwrap();
            let dot = (gx * s.input(&vx)).sum() + (gw * s.input(&vw)).sum();
            let [hx, hw] = s.grad(dot, [x, w]).unwrap();
            s.backward(dot).unwrap();
            for (h, p) in [(hx, x), (hw, w)] {
                for (a, b) in h.value().unwrap().iter().zip(p.grad().unwrap()) {
                    assert!((a - b).abs() <= 1e-12 * (1.0 + b.abs()), "{a} vs {b}");
                }
            }
        });
    }

    /// A matrix broadcast over a batch large enough that its gradient sums in groups of
    /// products (`kernels::matmul::sum_groups`; 64 items of 16×24×32 make 11 groups, the
    /// last one shorter): both operands' gradients, transposed or not, written first and
    /// then accumulated (the product is used twice), at 1 and 3 threads, against the sums
    /// written out in f64.
    #[test]
    fn broadcast_gradients_summed_in_groups_match_the_closed_form() {
        let (batch, m, k, n) = (64, 16, 24, 32);
        let c = tensor(&[batch, m, n], 9);
        for (shared_a, ta, tb) in [(true, false, false), (true, true, true), (false, false, false), (false, true, true)]
        {
            let (sa, sb) = {
                let a = if ta { vec![k, m] } else { vec![m, k] };
                let b = if tb { vec![n, k] } else { vec![k, n] };
                if shared_a {
                    (a, [vec![batch], b].concat())
                } else {
                    ([vec![batch], a].concat(), b)
                }
            };
            let (a, b) = (tensor(&sa, 1), tensor(&sb, 2));
            let (va, vb, vc) = (a.data(), b.data(), c.data());
            // op(a)[i] (r, j) and op(b)[i] (j, q) read from the stored operands.
            let (ia, ib) = (if shared_a { 0 } else { m * k }, if shared_a { k * n } else { 0 });
            let at = |i: usize, r: usize, j: usize| if ta { va[i * ia + j * m + r] } else { va[i * ia + r * k + j] };
            let bt = |i: usize, j: usize, q: usize| if tb { vb[i * ib + q * k + j] } else { vb[i * ib + j * n + q] };
            // ∂L/∂op(a)[i] = 1.5 c[i]·op(b)[i]ᵀ, ∂L/∂op(b)[i] = 1.5 op(a)[i]ᵀ·c[i], summed
            // over the batch for the shared operand, stored transposed where it is used so.
            let (mut da, mut db) = (vec![0.0; va.len()], vec![0.0; vb.len()]);
            for i in 0..batch {
                for r in 0..m {
                    for q in 0..n {
                        let g = 1.5 * vc[(i * m + r) * n + q];
                        for j in 0..k {
                            let sa_at = i * ia + if ta { j * m + r } else { r * k + j };
                            let sb_at = i * ib + if tb { q * k + j } else { j * n + q };
                            da[sa_at] += g * bt(i, j, q);
                            db[sb_at] += g * at(i, r, j);
                        }
                    }
                }
            }
            for threads in [1, 3] {
                let mut g = Graph::<f64>::new();
                g.set_threads(threads);
                g.scope(|s| {
                    let (x, y, w) = (s.leaf(&a), s.leaf(&b), s.input(&c));
                    let l = (x.matmul_t(y, ta, tb) * w).sum() + (x.matmul_t(y, ta, tb) * w).sum() * 0.5;
                    s.backward(l).unwrap();
                    for (name, got, want) in [("a", x.grad().unwrap(), &da), ("b", y.grad().unwrap(), &db)] {
                        for (u, v) in got.iter().zip(want) {
                            assert!(
                                (u - v).abs() <= 1e-11 * (1.0 + v.abs()),
                                "{name} ({shared_a} {ta} {tb}, {threads} threads): {u} vs {v}"
                            );
                        }
                    }
                });
            }
        }
    }
}
