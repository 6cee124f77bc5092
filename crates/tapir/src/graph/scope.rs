//! [`Scope`]'s own methods: leaves, inputs and parameters, `no_grad`, the backward passes,
//! and the scope's error.

use std::cell::RefCell;
use std::panic::{catch_unwind, AssertUnwindSafe, Location};

use crate::dtype::Float;
use crate::engine::backward;
use crate::engine::checkpoint::replay::replayed_param;
use crate::engine::custom::panic_message;
use crate::error::{shape_at, Error, Loc, Result};
use crate::graph::graph::GraphStats;
use crate::params::{GradBuffer, ParamId, ParamStore};
use crate::record::ctx::alloc_error;
use crate::record::handles::{Lent, Scope, State, Var};
use crate::record::state::Seed;
use crate::shape::Shape;
use crate::storage::ArenaStats;
use crate::tape::op::{Op, OpKind};
use crate::tape::tape::recycle;
use crate::tensor::Tensor;

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// A constant that borrows `t`'s data without copying; it gets no gradient.
    #[track_caller]
    pub fn input(&'s self, t: &'g Tensor<T>) -> Var<'s, T> {
        self.core.leaf(Op::Leaf, t.shape(), t.data())
    }

    /// A gradient-requesting leaf that borrows `t`'s data without copying; after
    /// [`backward`](Scope::backward), [`Var::grad`] holds `∂loss/∂t`.
    #[track_caller]
    pub fn leaf(&'s self, t: &'g Tensor<T>) -> Var<'s, T> {
        self.core.leaf(Op::Variable, t.shape(), t.data())
    }

    /// Parameter `id` of `store`, borrowed without copying. Its gradient goes to
    /// [`backward_into`](Scope::backward_into)'s buffer as well as to [`Var::grad`].
    ///
    /// An id of another store poisons the scope with [`Error::WrongStore`], one past the
    /// store's end with [`Error::UnknownParam`].
    #[track_caller]
    pub fn param(&'s self, store: &'g ParamStore<T>, id: ParamId) -> Var<'s, T> {
        self.param_node(store, id, |t| Some(t.data()))
    }

    /// As [`param`](Scope::param), with the value copied into the arena: for a scope
    /// that cannot borrow the store for `'g` (a [`Session`](crate::Session)'s). The node
    /// is a parameter node all the same (its gradient goes to `backward_into`'s buffer).
    #[track_caller]
    pub fn param_copied(&'s self, store: &ParamStore<T>, id: ParamId) -> Var<'s, T> {
        self.param_node(store, id, |_| None)
    }

    /// A parameter node of `store`'s `id`, whose value `borrow` gives, or a copy if it
    /// gives `None`.
    #[track_caller]
    fn param_node<'a>(
        &'s self,
        store: &'a ParamStore<T>,
        id: ParamId,
        borrow: impl FnOnce(&'a Tensor<T>) -> Option<&'s [T]>,
    ) -> Var<'s, T> {
        match store.check("param", id) {
            // The node's payload is [index, store identity low, high], so that
            // `backward_into` can tell parameters of two stores apart.
            Ok(i) => {
                let payload = [i as u32, store.id() as u32, (store.id() >> 32) as u32];
                let t = store.at(i);
                let value = borrow(t);
                // A checkpointed block recomputed for a recorded derivative reads the
                // checkpoint's own parameter nodes.
                if let Some(v) = replayed_param(&self.core, payload, value, Location::caller()) {
                    return v;
                }
                self.core.record(OpKind::Param, |r| {
                    let at = r.extra(payload)?;
                    let value = match value {
                        Some(v) => v,
                        None => r.alloc_iter(t.data().iter().copied())?,
                    };
                    Ok((Op::Param(at), t.shape(), value))
                })
            }
            Err(e) => self.core.fail(e),
        }
    }

    /// A gradient-requesting leaf copied into the arena from `data`, with shape `dims`:
    /// [`leaf`](Scope::leaf) for data that does not outlive the scope.
    #[track_caller]
    pub fn variable(&'s self, data: &[T], dims: &[usize]) -> Var<'s, T> {
        self.copied("variable", Op::Variable, data, dims)
    }

    /// A constant copied into the arena from `data`, with shape `dims`.
    #[track_caller]
    pub fn tensor(&'s self, data: &[T], dims: &[usize]) -> Var<'s, T> {
        self.copied("tensor", Op::Leaf, data, dims)
    }

    #[track_caller]
    fn copied(&'s self, op: &'static str, node: Op<'s, T>, data: &[T], dims: &[usize]) -> Var<'s, T> {
        self.core.record_as(op, |r| {
            let shape = r.shape_of(Shape::scalar(), dims)?;
            if data.len() != shape.numel() {
                return Err(Error::DataLength { op, len: data.len(), shape, location: r.location });
            }
            Ok((node, shape, r.alloc_iter(data.iter().copied())?))
        })
    }

    /// A scalar constant (shape `[]`).
    #[track_caller]
    pub fn scalar(&'s self, v: T) -> Var<'s, T> {
        self.full(&[], v)
    }

    /// A constant filled with `v`.
    #[track_caller]
    pub fn full(&'s self, dims: &[usize], v: T) -> Var<'s, T> {
        self.core.record_as("full", |r| {
            let shape = r.shape_of(Shape::scalar(), dims)?;
            let value = r.alloc(shape.numel())?;
            value.fill(v);
            Ok((Op::Leaf, shape, value))
        })
    }

    /// A constant of zeros.
    #[track_caller]
    pub fn zeros(&'s self, dims: &[usize]) -> Var<'s, T> {
        self.full(dims, T::ZERO)
    }

    /// A constant drawn from `N(0, 1)` with `rng`, in the arena.
    ///
    /// `rng` is the caller's code and runs while nothing of the scope is borrowed: a
    /// generator that records on this scope itself records before the draw's node, and one
    /// that panics makes [`Error::Callback`] the scope's error.
    #[track_caller]
    pub fn randn<R: rand::Rng + ?Sized>(&'s self, dims: &[usize], rng: &mut R) -> Var<'s, T> {
        let (op, location) = (self.core.op_name("randn"), Location::caller());
        if self.core.tape.borrow().error.is_some() {
            return self.core.poison();
        }
        let drawn = shape_at(op, Shape::scalar(), dims, location).and_then(|shape| {
            let value = self.core.arena.alloc_zeroed::<T>(shape.numel());
            let value = value.map_err(|e| alloc_error(e, op, location))?;
            let fill = catch_unwind(AssertUnwindSafe(|| crate::tensor::fill_normal(value, rng)));
            fill.map_err(|payload| Error::Callback {
                op,
                callback: "the random number generator".into(),
                detail: panic_message(&*payload),
                location,
            })?;
            Ok((shape, value))
        });
        match drawn {
            Ok((shape, value)) => self.core.record_at("randn", location, |_| Ok((Op::Leaf, shape, &*value))),
            Err(e) => self.core.fail(e),
        }
    }

    /// Runs `f` with recording of gradients off: ops inside still compute values, but
    /// their results require no gradient, so backward never visits them.
    pub fn no_grad<R>(&'s self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a, 's, T>(&'a RefCell<State<'s, T>>);
        impl<T> Drop for Restore<'_, '_, T> {
            fn drop(&mut self) {
                self.0.borrow_mut().no_grad -= 1;
            }
        }
        self.core.tape.borrow_mut().no_grad += 1;
        let _restore = Restore(&self.core.tape);
        f()
    }

    /// Computes the gradient of `loss` (one element) with respect to every node that
    /// requires one, then marks the tape consumed: a second `backward` is an error.
    /// Read gradients with [`Var::grad`].
    ///
    /// # Errors
    /// The scope's first recording error, if any; [`Error::NotScalar`] if `loss` has more
    /// than one element; [`Error::NoGradient`] if no gradient-requesting leaf reaches
    /// `loss` (a forgotten `leaf`/`param`, or a loss recorded under `no_grad`);
    /// [`Error::BackwardTwice`] after a consuming backward; [`Error::ArenaLimit`] if the
    /// gradients do not fit under the limit; [`Error::NonFinite`] from anomaly detection.
    #[track_caller]
    pub fn backward(&'s self, loss: Var<'s, T>) -> Result<()> {
        self.run_backward("backward", (loss, Seed::One), false, Location::caller())
    }

    /// As [`backward`](Scope::backward), but leaves the tape usable for another backward
    /// (each pass computes fresh gradients; they are not added to the previous ones).
    #[track_caller]
    pub fn backward_retain(&'s self, loss: Var<'s, T>) -> Result<()> {
        self.run_backward("backward_retain", (loss, Seed::One), true, Location::caller())
    }

    /// A vector-Jacobian product, like PyTorch's `out.backward(gradient=dout)`: backward
    /// from `out` (any shape) seeded with `∂L/∂out = dout`, which holds `out`'s elements
    /// in row-major order. Consumes the tape as [`backward`](Scope::backward) does.
    /// Anomaly detection checks what backward computes, not the seed itself.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::from_vec(vec![1.0f64, 2.0], &[2])?;
    /// let mut g = tapir::Graph::<f64>::new();
    /// let dx = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     s.backward_with(x.square(), &[10.0, 1.0])?; // dx = dout ⊙ 2x
    ///     Ok::<_, tapir::Error>(x.grad().unwrap().to_vec())
    /// })?;
    /// assert_eq!(dx, [20.0, 4.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for `backward`, with [`Error::SeedLength`] instead of `NotScalar` if `dout`
    /// does not have `out`'s element count.
    #[track_caller]
    pub fn backward_with(&'s self, out: Var<'s, T>, dout: &[T]) -> Result<()> {
        self.run_backward("backward_with", (out, Seed::Given(dout)), false, Location::caller())
    }

    /// As [`backward`](Scope::backward), adding every parameter's gradient into `grads`
    /// (`grads[p] += ∂loss/∂p`), which the caller allocates once with
    /// [`ParamStore::zeros_like`] and clears with [`GradBuffer::zero`].
    ///
    /// `grads` stays borrowed for the rest of the scope: when it is zeroed (fresh, or
    /// [`zero`](GradBuffer::zero) called since it was last written), each parameter that
    /// one node reads gets its gradient computed straight into the buffer's slot, which is
    /// that node's gradient buffer for the pass ([`Var::grad`] reads it), instead of into
    /// the arena and then added: a step then holds one copy of the parameter gradients,
    /// not two. A parameter read by several nodes (a layer applied twice), and every
    /// parameter when `grads` already holds gradients (accumulation over micro-batches),
    /// take the arena and are added after the pass. Either way each node's [`Var::grad`]
    /// is its own share of the gradient.
    ///
    /// As PyTorch's `loss.backward()` keeps `.grad` on leaves only, the pass keeps the
    /// gradients of leaves and parameters, and releases each other node's gradient buffer
    /// once its backward has consumed it; a later node's first gradient of the same length
    /// reuses it, so a deep network holds a few activation gradients at a time, not one
    /// per layer. [`Var::grad`] of an intermediate node then reads `None`; use
    /// [`backward`](Scope::backward) to keep them all.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut store = tapir::ParamStore::<f64>::new();
    /// let w = store.add("w", tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?)?;
    /// let mut grads = store.zeros_like()?;
    /// let mut g = tapir::Graph::new();
    /// for _ in 0..2 {
    ///     g.scope(|s| s.backward_into(s.param(&store, w).square().sum(), &mut grads))?;
    /// }
    /// assert_eq!(grads.get(w)?.data(), [4.0, 8.0]); // two steps of 2w, accumulated
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As for `backward`; [`Error::WrongStore`] if `grads` was made for another store
    /// than a parameter's, [`Error::UnknownParam`] if its shapes do not match the store's.
    /// Every check runs before the tape is consumed: on error `grads` is unchanged and the
    /// tape can still be used. An error during the pass itself (anomaly detection, the
    /// arena limit, a custom op) leaves `grads` as it was too: the slots written directly
    /// are zeroed again (what they held), and those nodes read no gradient.
    #[track_caller]
    pub fn backward_into(&'s self, loss: Var<'s, T>, grads: &'s mut GradBuffer<T>) -> Result<()> {
        let (op, location) = ("backward_into", Location::caller());
        let mut tape = self.core.tape.borrow_mut();
        Self::ready_into(&tape, loss, grads, op, location)?;
        let params = tape.nodes.iter().enumerate().filter_map(|(i, n)| match n.op {
            Op::Param(at) if n.requires_grad => Some((param_of(&tape, at).0, i as u32)),
            _ => None,
        });
        if !grads.plan(params) {
            // The buffer holds gradients already: compute in the arena, then add.
            return self.add_into(&mut tape, loss, grads, location);
        }
        let (arena, par, anomaly) = (self.core.arena, self.core.par, self.core.anomaly);
        let lent = grads.address_range();
        let is_lent = |g: &[T]| lent.contains(&(g.as_ptr() as usize));
        tape.lent = lent.clone();
        let (zeroed, slots) = grads.lend();
        let mut shared = recycle(std::mem::take(&mut tape.shared_grads));
        let result = backward::run_with(
            &mut tape,
            arena,
            par,
            (loss.id, Seed::One),
            location,
            (anomaly, true),
            |tape, lent| {
                for (slot, to, data) in slots {
                    // The loss's own gradient is the seed, so a parameter that is the
                    // loss takes the arena like a shared one.
                    match tape.id_at(to).filter(|&id| to != crate::params::SHARED && id != loss.id) {
                        Some(id) => lent.push(Lent { node: id, slot: Some(data).into() }),
                        None => shared.push((slot, data)),
                    }
                }
            },
            |tape, map| {
                // Put back what the buffer held: zeros.
                for id in tape.ids() {
                    if let Some(g) = map[id].take_if(|g| is_lent(g)) {
                        g.fill(T::ZERO);
                    }
                }
                *zeroed = true;
            },
        );
        if result.is_ok() {
            tape.consumed = true;
            for (node, g) in tape.nodes.iter().zip(tape.grads.values()) {
                if let (Op::Param(at), Some(g)) = (node.op, g) {
                    if let Ok(k) = shared.binary_search_by_key(&param_of(&tape, at).0, |e| e.0) {
                        crate::kernels::add_assign(shared[k].1, g);
                    }
                }
            }
        } else {
            tape.lent = 0..0;
        }
        tape.shared_grads = recycle(shared);
        result
    }

    /// As [`backward_into`](Scope::backward_into), but `grads` is borrowed for this call
    /// only: the gradients are computed in the arena and then added into it, so a step
    /// holds two copies of the parameter gradients where `backward_into` may hold one. For
    /// a scope that cannot lend the buffer for `'s` (a [`Session`](crate::Session)'s).
    ///
    /// # Errors
    /// As for `backward_into`; on error `grads` is unchanged.
    #[track_caller]
    pub fn backward_add(&'s self, loss: Var<'s, T>, grads: &mut GradBuffer<T>) -> Result<()> {
        let (op, location) = ("backward_add", Location::caller());
        let mut tape = self.core.tape.borrow_mut();
        Self::ready_into(&tape, loss, grads, op, location)?;
        self.add_into(&mut tape, loss, grads, location)
    }

    /// The checks [`backward_into`](Scope::backward_into) runs before it changes anything
    /// (the loss, the tape's state, `grads` against every parameter node), on their own:
    /// for a caller that must know whether the buffer will be lent.
    #[track_caller]
    pub(crate) fn check_into(&'s self, loss: Var<'s, T>, grads: &GradBuffer<T>) -> Result<()> {
        Self::ready_into(&self.core.tape.borrow(), loss, grads, "backward_into", Location::caller())
    }

    /// [`ready`](Scope::ready), then checks that `grads` suits every parameter node.
    fn ready_into(
        tape: &State<'s, T>,
        loss: Var<'s, T>,
        grads: &GradBuffer<T>,
        op: &'static str,
        location: Loc,
    ) -> Result<()> {
        Self::ready(tape, (loss, Seed::One), op, location)?;
        for node in tape.nodes.iter().map(|n| tape.view(n)) {
            if let Op::Param(at) = node.op {
                let (p, store) = param_of(tape, at);
                if store != grads.store() {
                    let (expected, found) = (grads.store(), store);
                    return Err(Error::WrongStore {
                        op,
                        what: "the gradient buffer".into(),
                        expected,
                        found,
                        location,
                    });
                }
                if grads.shape(p) != Some(node.shape) {
                    let held = grads.shape(p).map_or("no such parameter".to_string(), |s| s.to_string());
                    let detail =
                        format!("parameter #{p} has shape {} but the gradient buffer holds {held}", node.shape);
                    return Err(Error::UnknownParam { op, detail, location });
                }
            }
        }
        Ok(())
    }

    /// A releasing backward pass in the arena, then every parameter's gradient added
    /// into `grads`.
    fn add_into(
        &'s self,
        tape: &mut State<'s, T>,
        loss: Var<'s, T>,
        grads: &mut GradBuffer<T>,
        location: Loc,
    ) -> Result<()> {
        let (arena, par, flags) = (self.core.arena, self.core.par, (self.core.anomaly, true));
        backward::run_with(tape, arena, par, (loss.id, Seed::One), location, flags, |_, _| {}, |_, _| {})?;
        tape.consumed = true;
        for (node, g) in tape.nodes.iter().zip(tape.grads.values()) {
            if let (Op::Param(at), Some(g)) = (node.op, g) {
                crate::kernels::add_assign(grads.slot_mut(param_of(tape, at).0), g);
            }
        }
        Ok(())
    }

    /// The checks every backward pass runs first, so that a failed one leaves the tape
    /// as it was: the scope's error, a consumed tape, the seed.
    pub(crate) fn ready(
        tape: &State<'s, T>,
        (out, seed): (Var<'s, T>, Seed<'_, T>),
        op: &'static str,
        location: Loc,
    ) -> Result<()> {
        if let Some(e) = &tape.error {
            return Err(e.clone());
        }
        if tape.consumed {
            return Err(Error::BackwardTwice { location });
        }
        backward::check(tape, out.id, seed, op, location)
    }

    /// Runs every check (see [`ready`](Scope::ready)) before the pass.
    pub(crate) fn run_backward(
        &'s self,
        op: &'static str,
        (out, seed): (Var<'s, T>, Seed<'_, T>),
        retain: bool,
        location: Loc,
    ) -> Result<()> {
        let mut tape = self.core.tape.borrow_mut();
        Self::ready(&tape, (out, seed), op, location)?;
        let (arena, par, flags) = (self.core.arena, self.core.par, (self.core.anomaly, false));
        backward::run_with(&mut tape, arena, par, (out.id, seed), location, flags, |_, _| {}, |_, _| {})?;
        tape.consumed = !retain;
        Ok(())
    }

    /// A key for one random draw: `[step, call]`, where `step` counts the scopes this
    /// graph ran before this one and `call` counts the earlier calls in this scope. A
    /// random op seeds a counter-based stream with it (and a seed of its own), so that it
    /// draws afresh at every call and every step, yet the same when a checkpointed block
    /// is recomputed in backward: the block's scope replays the keys of its forward.
    /// `tapir_nn::Dropout` draws its masks this way.
    pub fn next_draw(&self) -> [u64; 2] {
        let mut tape = self.core.tape.borrow_mut();
        tape.draws += 1;
        [tape.step, tape.draws - 1]
    }

    /// The node recorded `index`-th in this scope, as a handle: the way back from
    /// [`Var::index`] for a binding that holds nodes between calls (see
    /// [`Session`](crate::Session)). `None` if the tape has no such node.
    pub fn var_at(&'s self, index: usize) -> Option<Var<'s, T>> {
        let id = u32::try_from(index).ok().and_then(|raw| self.core.tape.borrow().id_at(raw))?;
        Some(Var { core: &self.core, id })
    }

    /// The scope's first error, if an op failed.
    ///
    /// # Errors
    /// That error.
    pub fn check(&self) -> Result<()> {
        match &self.core.tape.borrow().error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    /// Records [`Error::InvalidArgument`](crate::Error::InvalidArgument) naming `op`, the
    /// caller's location and `detail` as the scope's error (unless it already holds one,
    /// which is kept), and returns a poisoned handle: a layer's or a user's own argument
    /// check, reported like an op's.
    #[track_caller]
    pub fn invalid(&'s self, op: &'static str, detail: String) -> Var<'s, T> {
        let location = std::panic::Location::caller();
        self.core.fail_as(op, |op| Error::InvalidArgument { op, detail, location })
    }

    /// Records `e` as the scope's error (unless it already holds one, which is kept) and
    /// returns a poisoned handle, as a failed op does: every later op on the handle is
    /// skipped, and `value`, `item` and `backward` return the scope's first error. This is
    /// [`invalid`](Scope::invalid) for a typed error other than `InvalidArgument`, for
    /// example `tapir_nn::Ctx::with_params` reporting a parameter id of another store
    /// with the [`Error::WrongStore`] that [`ParamStore::check`](crate::ParamStore::check)
    /// returned.
    ///
    /// ```
    /// use tapir::{Error, Graph, ParamStore, Tensor};
    /// # fn main() -> Result<(), Error> {
    /// let (ours, mut theirs) = (ParamStore::<f32>::new(), ParamStore::<f32>::new());
    /// let id = theirs.add("w", Tensor::zeros(&[2])?)?;
    /// let mut g = Graph::new();
    /// let e = g.scope(|s| {
    ///     let w = match ours.check("my_layer", id) {
    ///         Ok(_) => s.param(&ours, id),
    ///         Err(e) => s.fail(e), // the check's own error, not a later op's
    ///     };
    ///     (w * 2.0).sum().item()
    /// });
    /// assert!(matches!(e, Err(Error::WrongStore { op: "my_layer", .. })));
    /// # Ok(()) }
    /// ```
    pub fn fail(&'s self, e: Error) -> Var<'s, T> {
        self.core.fail(e)
    }

    /// Nodes recorded so far, tape bytes and arena use, now.
    pub fn stats(&self) -> GraphStats {
        let tape = self.core.tape.borrow();
        let scratch = tape.nest.map_or_else(ArenaStats::default, |n| n.scratch::<T>().arena.borrow().stats());
        GraphStats { nodes: tape.nodes.len(), tape_bytes: tape.bytes(), arena: self.core.arena.stats(), scratch }
    }
}

/// A parameter node's store index and store identity, from its payload `[index, store
/// identity low, high]` (see `Scope::param_node`).
pub(crate) fn param_of<T>(tape: &State<'_, T>, at: u32) -> (usize, u64) {
    let e = &tape.extra[at as usize..at as usize + 3];
    (e[0] as usize, u64::from(e[1]) | (u64::from(e[2]) << 32))
}
