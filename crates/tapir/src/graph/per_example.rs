//! Per-example gradients at scope level: [`Scope::per_example`] and [`PerExample`], what
//! DP-SGD, per-sample gradient norms, influence functions and K-FAC-style statistics need
//! (PyTorch's `torch.func.vmap(grad(f))`, Opacus's per-sample gradients). How it works is
//! `engine/per_example`: one ordinary backward walk over the examples, then each op where
//! a parameter meets the examples runs its backward kernel one example at a time.

use std::panic::Location;

use faer::Par;

use crate::dtype::Float;
use crate::engine::per_example::plan::plan;
use crate::engine::per_example::rules::{self, Lane};
use crate::engine::per_example::{Flow, Plan};
use crate::error::{try_vec, try_zeros, Error, Loc, Result};
use crate::graph::scope::param_of;
use crate::params::ParamStore;
use crate::record::ctx::alloc_error;
use crate::record::handles::{Core, Scope, State, Var};
use crate::record::state::Seed;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::Op;
use crate::tape::tape::Tape;
use crate::tensor::Tensor;

const OP: &str = "per_example";

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Per-example gradients of `loss`, a sum or mean over `batch` examples, with respect
    /// to `params` (leaves or parameters). `examples` are the values where the examples
    /// enter the program, each holding them on axis 0 with a whole number of rows per
    /// example: the batch's inputs, and for a token model the embedding lookup of the
    /// batch's tokens (`[B·T, D]`, `T` rows per example).
    ///
    /// Runs one backward pass that leaves the parameters out (it consumes the tape, as
    /// [`backward`](Scope::backward) does) and returns a [`PerExample`], from which
    /// [`grads`](PerExample::grads) materialises each parameter's `[B, ...]` gradients,
    /// [`norms`](PerExample::norms) gives each example's gradient norm without forming the
    /// gradients where a closed form exists, and [`weighted_sum`](PerExample::weighted_sum)
    /// and [`clipped_sum`](PerExample::clipped_sum) give `Σₑ cₑ gₑ` at the cost of about one
    /// parameter gradient (DP-SGD). Example `e`'s gradient is that of its own term of the
    /// loss: the per-example gradients sum to the ordinary gradient. With a mean loss each
    /// carries the mean's `1/B`.
    ///
    /// The program must keep examples apart until the loss, as a per-example model does:
    /// example `e` owns the `e`-th `B`-th of every value computed from the examples
    /// (reshapes that keep the batch leading, permutes that keep axis 0 first). Random
    /// draws of the shape of a value (`tapir_nn::Dropout`'s masks) are drawn per example.
    /// Parameters meet the examples in `linear`, `matmul` (hence `conv2d`), elementwise
    /// binary ops (biases, gains), `layer_norm` and `index_select` on axis 0 (embeddings),
    /// directly or through `reshape` and `permute`.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3, 1])?; // 3 examples
    /// let w = tapir::Tensor::from_vec(vec![0.5f64], &[1, 1])?;
    /// let mut g = tapir::Graph::new();
    /// let per = g.scope(|s| {
    ///     let (xv, wv) = (s.input(&x), s.leaf(&w));
    ///     let loss = xv.matmul(wv).square().sum(); // Σₑ (w xₑ)²: gₑ = 2 w xₑ²
    ///     s.per_example(loss, (3, &[xv]), &[wv])?.grads()
    /// })?;
    /// assert_eq!(per[0].data(), &[1.0, 4.0, 9.0]);
    /// assert_eq!(per[0].shape().dims(), &[3, 1, 1]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::PerExampleUnsupported`] naming the op and its input shapes, before the tape
    /// is consumed, if an op combines examples before the loss (a reduction, softmax,
    /// product, concatenation or broadcast over the batch axis), a parameter meets the
    /// examples in an op with no per-example rule (a custom op, a checkpointed block), a
    /// loss term depends on parameters and no example, an example value's axis 0 is not a
    /// multiple of `batch`, or a parameter is not a gradient-requesting leaf; and what
    /// [`backward`](Scope::backward) returns.
    #[track_caller]
    pub fn per_example(
        &'s self,
        loss: Var<'s, T>,
        (batch, examples): (usize, &[Var<'s, T>]),
        params: &[Var<'s, T>],
    ) -> Result<PerExample<'s, T>> {
        let location = Location::caller();
        let roots: Vec<_> = params.iter().enumerate().map(|(i, v)| (v.id, i)).collect();
        let shapes = params.iter().map(|v| v.shape()).collect();
        self.run_per_example(loss, (batch, examples), (roots, shapes), location)
    }

    /// As [`per_example`](Scope::per_example), with respect to every parameter of
    /// `store`, in the store's order: each parameter's gradient sums over every node that
    /// reads it (a layer applied twice), and a parameter the loss does not read has zero
    /// gradients.
    ///
    /// # Errors
    /// As for [`per_example`](Scope::per_example).
    #[track_caller]
    pub fn per_example_store(
        &'s self,
        loss: Var<'s, T>,
        (batch, examples): (usize, &[Var<'s, T>]),
        store: &ParamStore<T>,
    ) -> Result<PerExample<'s, T>> {
        let location = Location::caller();
        let roots = {
            let tape = self.core.tape.borrow();
            tape.ids()
                .filter_map(|id| match tape.nodes[id.index()].op {
                    Op::Param(at) if tape.nodes[id.index()].requires_grad => {
                        let (index, owner) = param_of(&tape, at);
                        (owner == store.id() && index < store.len()).then_some((id, index))
                    }
                    _ => None,
                })
                .collect()
        };
        let shapes = store.iter().map(|(_, _, t)| t.shape()).collect();
        self.run_per_example(loss, (batch, examples), (roots, shapes), location)
    }

    /// The pass of [`per_example`](Scope::per_example) over `roots`, each a node with the
    /// index of the parameter it holds, and the parameters' `shapes`.
    fn run_per_example(
        &'s self,
        loss: Var<'s, T>,
        (batch, examples): (usize, &[Var<'s, T>]),
        roots: (Vec<(NodeId<'s>, usize)>, Vec<Shape>),
        location: Loc,
    ) -> Result<PerExample<'s, T>> {
        let (plan, cut) = {
            let mut tape = self.core.tape.borrow_mut();
            Self::ready(&tape, (loss, Seed::One), OP, location)?;
            let examples: Vec<_> = examples.iter().map(|v| v.id).collect();
            let plan = plan(&tape, loss.id, (batch, &examples), roots, location)?;
            // The walk leaves out what is computed from parameters alone.
            let cut: Vec<usize> = (0..plan.flows.len()).filter(|&i| plan.flows[i] == Flow::Free).collect();
            for &i in &cut {
                tape.nodes[i].requires_grad = false;
            }
            (plan, cut)
        };
        // `backward`'s own pass (the same instance of the walk: a second one cost every
        // backward op 10 instructions through code layout, W3 under callgrind).
        let result = self.run_backward(OP, (loss, Seed::One), false, location);
        let mut tape = self.core.tape.borrow_mut();
        for &i in &cut {
            tape.nodes[i].requires_grad = true;
        }
        drop(tape);
        result?;
        Ok(PerExample { core: &self.core, plan })
    }
}

/// The per-example gradients of one loss, ready to be read in the ways DP-SGD and
/// per-sample analyses need; made by [`Scope::per_example`]. Each method computes from the
/// backward pass already run, in the scope's arena.
#[derive(Debug)]
pub struct PerExample<'s, T: Float> {
    core: &'s Core<'s, T>,
    plan: Plan<'s>,
}

impl<'s, T: Float> PerExample<'s, T> {
    /// `B`, the number of examples.
    pub fn batch(&self) -> usize {
        self.plan.batch
    }

    /// Each parameter's per-example gradients, `[B, ...the parameter's shape]`, in the
    /// order of `params`.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] or the arena's errors if they do not fit;
    /// [`Error::InvalidShape`] if a parameter already has [`MAX_RANK`](crate::MAX_RANK) axes.
    #[track_caller]
    pub fn grads(&self) -> Result<Vec<Tensor<T>>> {
        let mut out = vec![];
        self.grads_into(&mut out)?;
        Ok(out)
    }

    /// As [`grads`](PerExample::grads), into `out`, reusing its tensors where they have
    /// the right shapes (a training loop allocates them once; fresh memory costs a page
    /// fault per 4 KiB on first write, which at these sizes is a third of the time).
    /// Tensors of other shapes are replaced, and `out` is resized to one per parameter.
    ///
    /// # Errors
    /// As [`grads`](PerExample::grads); on error `out` holds tensors of unspecified values.
    #[track_caller]
    pub fn grads_into(&self, out: &mut Vec<Tensor<T>>) -> Result<()> {
        let location = Location::caller();
        let tape = self.core.tape.borrow();
        let batch = self.plan.batch;
        out.truncate(self.plan.shapes.len());
        for (i, s) in self.plan.shapes.iter().enumerate() {
            let mut dims = vec![batch];
            dims.extend(s.dims().iter().map(|&d| d as usize));
            if out.get(i).is_none_or(|t| t.dims() != dims) {
                let data = try_zeros(OP, *s, s.numel().saturating_mul(batch), location)?;
                let t = Tensor::from_vec(data, &dims)?;
                if i < out.len() {
                    out[i] = t;
                } else {
                    out.push(t);
                }
            }
        }
        let mut bufs = self.buffers(&tape, location)?;
        let douts = douts(&tape, &self.plan);
        let mut stats = vec![];
        // A parameter read by one node, whose boundaries all read that node, is written
        // straight into its output; the others go through the lane's buffers.
        let direct: Vec<bool> = (0..self.plan.shapes.len())
            .map(|i| {
                let mut roots = self.plan.roots.iter().filter(|r| r.1 == i);
                match (roots.next(), roots.next()) {
                    (Some(&(r, _)), None) => self.plan.boundaries.iter().all(|b| b.param != i || b.p == r),
                    _ => false,
                }
            })
            .collect();
        let rest: Vec<bool> = direct.iter().map(|d| !d).collect();
        // Examples write disjoint blocks: spread them over the threads, each contribution
        // on one thread (the bits do not depend on the thread count).
        let threads = crate::kernels::par::threads(self.core.par);
        for (i, t) in out.iter_mut().enumerate().filter(|(i, _)| direct[*i]) {
            let n = self.plan.shapes[i].numel();
            let mine: Vec<_> =
                self.plan.boundaries.iter().zip(&douts).filter(|(b, d)| b.param == i && !d.is_empty()).collect();
            if mine.is_empty() || n == 0 {
                t.data_mut().fill(T::ZERO);
                continue;
            }
            let tape: &Tape<'s, T> = &tape.tape;
            crate::kernels::par::for_chunks(threads, t.data_mut(), n, &|start, dst: &mut [T]| {
                let lane = Lane { e0: start / n, n: 1, batch };
                let mut stats = vec![];
                for (j, (b, d)) in mine.iter().enumerate() {
                    rules::contribute(tape, b, (lane, j == 0), lane.slice(d), dst, (Par::Seq, &mut stats));
                }
            });
        }
        if rest.iter().any(|&r| r) {
            for e in 0..batch {
                self.lane(&tape, Lane { e0: e, n: 1, batch }, &douts, &mut bufs, Some(&rest), &mut stats);
                for (i, t) in out.iter_mut().enumerate().filter(|(i, _)| rest[*i]) {
                    let n = self.plan.shapes[i].numel();
                    let dst = &mut t.data_mut()[e * n..(e + 1) * n];
                    dst.fill(T::ZERO);
                    for &(p, _) in self.plan.roots.iter().filter(|r| r.1 == i) {
                        crate::kernels::add_assign(
                            dst,
                            bufs[p.index()].as_deref().expect("every parameter has a buffer"),
                        );
                    }
                }
            }
        }
        Ok(())
    }

    /// Each example's gradient norm over all the parameters, `‖(∂ℓₑ/∂θ₁, ..., ∂ℓₑ/∂θₖ)‖₂`.
    /// A parameter used once in `linear` or as the right factor of a product gets its
    /// norms in closed form, with no per-example gradient formed (`‖xₑ‖·‖gₑ‖` for a row per
    /// example); the others are formed one example at a time in one parameter-sized buffer.
    ///
    /// # Errors
    /// The arena's errors if the buffers do not fit.
    #[track_caller]
    pub fn norms(&self) -> Result<Vec<T>> {
        let location = Location::caller();
        let tape = self.core.tape.borrow();
        let (batch, par) = (self.plan.batch, self.core.par);
        let mut sq = vec![T::ZERO; batch];
        let ghost: Vec<bool> = (0..self.plan.shapes.len()).map(|i| rules::has_ghost(&tape, &self.plan, i)).collect();
        let douts = douts(&tape, &self.plan);
        let mut scratch = vec![];
        for (b, d) in self.plan.boundaries.iter().zip(&douts) {
            if ghost[b.param] && !d.is_empty() {
                rules::ghost(&tape, b, (batch, d), &mut sq, (par, &mut scratch));
            }
        }
        if ghost.iter().any(|g| !g) {
            let mut bufs = self.buffers(&tape, location)?;
            let rest: Vec<bool> = ghost.iter().map(|g| !g).collect();
            let mut sums: Vec<Vec<T>> = self.plan.shapes.iter().map(|s| vec![T::ZERO; s.numel()]).collect();
            for (e, s) in sq.iter_mut().enumerate() {
                self.lane(&tape, Lane { e0: e, n: 1, batch }, &douts, &mut bufs, Some(&rest), &mut scratch);
                self.gather(&bufs, &mut sums);
                for (i, g) in sums.iter().enumerate() {
                    if rest[i] {
                        *s += g.iter().fold(T::ZERO, |a, &v| a + v * v);
                    }
                }
            }
        }
        Ok(sq.into_iter().map(|v| v.sqrt()).collect())
    }

    /// `Σₑ weights[e] · gₑ` for each parameter, in the order of `params`: one pass over all
    /// the examples with each example's output gradients scaled, about the cost of the
    /// parameters' part of an ordinary backward pass.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `weights` has `B` elements; the arena's errors.
    #[track_caller]
    pub fn weighted_sum(&self, weights: &[T]) -> Result<Vec<Tensor<T>>> {
        let location = Location::caller();
        let batch = self.plan.batch;
        if weights.len() != batch {
            return Err(Error::InvalidArgument {
                op: "weighted_sum",
                detail: format!("needs one weight per example: {batch}, got {}", weights.len()),
                location,
            });
        }
        let tape = self.core.tape.borrow();
        let arena = self.core.arena;
        let mut scaled: Vec<&[T]> = vec![];
        let mut done: Vec<(usize, usize)> = vec![];
        for (i, d) in douts(&tape, &self.plan).into_iter().enumerate() {
            let v = self.plan.boundaries[i].v.index();
            // A node that is several boundaries' output is scaled once.
            if let Some(&(_, j)) = done.iter().find(|(w, _)| *w == v) {
                scaled.push(scaled[j]);
                continue;
            }
            let per = d.len() / batch;
            let it = d.iter().enumerate().map(|(k, &g)| g * weights[k / per.max(1)]);
            let s: &[T] = arena.alloc_iter(it).map_err(|e| alloc_error(e, "weighted_sum", location))?;
            done.push((v, i));
            scaled.push(s);
        }
        let mut bufs = self.buffers(&tape, location)?;
        self.lane(&tape, Lane { e0: 0, n: batch, batch }, &scaled, &mut bufs, None, &mut vec![]);
        let mut sums = vec![];
        for &s in &self.plan.shapes {
            sums.push(try_vec("weighted_sum", s, s.numel(), T::ZERO, location)?);
        }
        self.gather(&bufs, &mut sums);
        sums.into_iter()
            .zip(&self.plan.shapes)
            .map(|(data, s)| Tensor::from_vec(data, &s.dims().iter().map(|&d| d as usize).collect::<Vec<_>>()))
            .collect()
    }

    /// Each parameter's gradient in `sums`: the sum of its nodes' buffers.
    fn gather(&self, bufs: &[Option<&'s mut [T]>], sums: &mut [Vec<T>]) {
        for s in sums.iter_mut() {
            s.fill(T::ZERO);
        }
        for &(p, i) in &self.plan.roots {
            crate::kernels::add_assign(&mut sums[i], bufs[p.index()].as_deref().expect("every parameter has a buffer"));
        }
    }

    /// DP-SGD's clipped sum: each example's gradient scaled to norm at most `max_norm`,
    /// `Σₑ min(1, max_norm / ‖gₑ‖) · gₑ` (an example with a zero gradient is not
    /// scaled), with the norms it used ([`norms`](PerExample::norms)). Noise is the
    /// caller's to add.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] unless `max_norm` is positive and finite; as
    /// [`weighted_sum`](PerExample::weighted_sum).
    #[track_caller]
    pub fn clipped_sum(&self, max_norm: T) -> Result<(Vec<T>, Vec<Tensor<T>>)> {
        let location = Location::caller();
        if !(max_norm > T::ZERO && max_norm.is_finite()) {
            return Err(Error::InvalidArgument {
                op: "clipped_sum",
                detail: format!("max_norm must be positive and finite, got {max_norm:?}"),
                location,
            });
        }
        let norms = self.norms()?;
        let weights: Vec<T> = norms.iter().map(|&n| if n > max_norm { max_norm / n } else { T::ONE }).collect();
        Ok((norms, self.weighted_sum(&weights)?))
    }

    /// One zeroed buffer per parameter and per node between a boundary and its parameter.
    fn buffers(&self, tape: &State<'s, T>, location: Loc) -> Result<Vec<Option<&'s mut [T]>>> {
        let mut bufs: Vec<Option<&'s mut [T]>> = (0..self.plan.flows.len()).map(|_| None).collect();
        let roots = self.plan.roots.iter().map(|r| &r.0);
        let ids = roots.chain(self.plan.free.iter()).chain(self.plan.boundaries.iter().map(|b| &b.p));
        for &id in ids {
            if bufs[id.index()].is_none() {
                let n = tape.shape(id).numel();
                bufs[id.index()] = Some(self.core.arena.alloc_zeroed(n).map_err(|e| alloc_error(e, OP, location))?);
            }
        }
        Ok(bufs)
    }

    /// Zeroes `bufs`, then runs every boundary (of the parameters `only` selects) over
    /// `lane`, `douts` holding each boundary's output gradient, and follows the gradients
    /// down to the parameters.
    fn lane(
        &self,
        tape: &State<'s, T>,
        lane: Lane,
        douts: &[&[T]],
        bufs: &mut [Option<&'s mut [T]>],
        only: Option<&[bool]>,
        stats: &mut Vec<T>,
    ) {
        for b in bufs.iter_mut().flatten() {
            b.fill(T::ZERO);
        }
        for (b, d) in self.plan.boundaries.iter().zip(douts) {
            if d.is_empty() || only.is_some_and(|o| !o[b.param]) {
                continue;
            }
            let dst = bufs[b.p.index()].as_deref_mut().expect("every boundary has a buffer");
            rules::contribute(&tape.tape, b, (lane, false), lane.slice(d), dst, (self.core.par, stats));
        }
        rules::follow(tape, &self.plan, bufs);
    }
}

/// Each boundary's output gradient from the walk (empty if none reached it).
fn douts<'s, T: Float>(tape: &State<'s, T>, plan: &Plan<'s>) -> Vec<&'s [T]> {
    plan.boundaries.iter().map(|b| tape.grads.get(b.v).copied().flatten().unwrap_or(&[])).collect()
}
