//! [`Graph`], [`Scope`] and [`Var`]: the per-iteration tape and its branded handles.
//!
//! `Graph::scope` hands the closure a `&'s Scope<'s, 'g, T>`. `'s` is a fresh lifetime
//! for each call (the closure must accept every `'s`), and every type that mentions it is
//! invariant in it, so a [`Var<'s>`](Var) can neither leave the closure nor meet a `Var`
//! of another scope. `'g` is the borrow of the graph and of whatever the closure borrows
//! from outside (parameters, inputs): those outlive the scope (`'g: 's`), so the scope can
//! read them without copying, and the borrow checker forbids changing them meanwhile.
//! The shape is the one `std::thread::scope` uses, for the same reasons.

use std::cell::RefCell;
use std::marker::PhantomData;
use std::panic::Location;

use faer::Par;

use crate::error::{Error, Loc, Result};
use crate::graph::backward::{self, Seed};
use crate::graph::core::Core;
use crate::graph::tape::{recycle, Spare, Tape};
use crate::graph::Var;
use crate::ops::checkpoint::{Checkpoint, Nest};
use crate::ops::Op;
use crate::params::{GradBuffer, ParamId, ParamStore};
use crate::shape::Shape;
use crate::storage::{Arena, ArenaStats};
use crate::tensor::Tensor;
use crate::Float;

/// Owns the arena and the tape's buffers, and runs one scope at a time.
///
/// Keep one `Graph` for a whole training run: each [`scope`](Graph::scope) reuses the
/// memory of the previous one, so a warmed-up step allocates nothing on the heap.
#[derive(Debug)]
pub struct Graph<T: Float = f32> {
    arena: Arena,
    spare: Spare<T>,
    /// Where checkpointed blocks record, reset after each block's forward and after each
    /// block's recomputation (see [`Scope::checkpoint`]).
    scratch: Scratch<T>,
    /// `None`: faer's global parallelism, read when a scope starts (reading it starts
    /// rayon's global pool, which [`init_threads`](crate::init_threads) must build first).
    par: Option<Par>,
    anomaly: bool,
    last: GraphStats,
    /// Scopes run so far (see [`Scope::next_draw`]).
    steps: u64,
    /// The scopes' lists of checkpointed blocks, emptied, kept for their capacity.
    spare_blocks: SpareBlocks<T>,
}

/// An empty list of blocks with the capacity of earlier scopes' ([`Scope`]'s `blocks`).
#[derive(Default)]
struct SpareBlocks<T: Float>(Vec<&'static (dyn Checkpoint<T> + 'static)>);

impl<T: Float> std::fmt::Debug for SpareBlocks<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SpareBlocks(capacity {})", self.0.capacity())
    }
}

/// What a scope recorded and how much memory it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphStats {
    /// Nodes on the tape.
    pub nodes: usize,
    /// Bytes of tape (nodes, index payloads, custom-op entries), beyond the values in the arena.
    pub tape_bytes: usize,
    /// Arena use: bytes in use, high-water mark, capacity.
    pub arena: ArenaStats,
    /// The scratch arena of checkpointed blocks (see [`Scope::checkpoint`]): its
    /// high-water mark is one block's forward, or one block's recomputation and backward.
    /// The graph's peak is at most `arena.high_water + scratch.high_water`.
    pub scratch: ArenaStats,
}

impl<T: Float> Default for Graph<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Float> Graph<T> {
    /// A graph with no arena limit, faer's global parallelism and anomaly detection off.
    /// The parallelism is read when each scope starts, not here, so creating a graph does
    /// not start rayon's global pool.
    pub fn new() -> Graph<T> {
        Graph {
            arena: Arena::new(),
            spare: Spare::default(),
            scratch: Scratch::default(),
            par: None,
            anomaly: false,
            last: GraphStats::default(),
            steps: 0,
            spare_blocks: SpareBlocks(Vec::new()),
        }
    }

    /// Caps the bytes a scope may allocate in the arena; an op that would pass the cap
    /// fails with [`Error::ArenaLimit`]. `None` removes the cap.
    pub fn set_arena_limit(&mut self, bytes: Option<usize>) {
        self.arena.set_limit(bytes);
        self.scratch.arena.borrow_mut().set_limit(bytes);
    }

    /// Threads for matrix products: 1 runs them on the calling thread, `n > 1` on `n`
    /// threads of rayon's global pool, 0 on all of them. Counts above
    /// [`MAX_THREADS`](crate::MAX_THREADS) are clamped to it. Returns the count in effect.
    pub fn set_threads(&mut self, threads: usize) -> usize {
        let (par, n) = crate::threads::par(threads);
        self.par = Some(par);
        n
    }

    /// Threads used for matrix products.
    pub fn threads(&self) -> usize {
        self.par().degree()
    }

    /// The parallelism in effect.
    fn par(&self) -> Par {
        self.par.unwrap_or_else(faer::get_global_parallelism)
    }

    /// Turns anomaly detection on or off. When on, the first op whose output (forward) or
    /// input gradient (backward) holds a NaN or an infinity fails with
    /// [`Error::NonFinite`], naming the op and where it was recorded. It costs a pass over
    /// every value, so it is meant for debugging.
    pub fn set_anomaly_detection(&mut self, on: bool) {
        self.anomaly = on;
    }

    /// Statistics of the last scope (nodes, tape bytes) and of the arena now.
    pub fn stats(&self) -> GraphStats {
        GraphStats { arena: self.arena.stats(), scratch: self.scratch.arena.borrow().stats(), ..self.last }
    }

    /// Records one iteration: runs `f` with a fresh scope, then frees everything it
    /// allocated in O(1). Whatever `f` returns must not mention the scope's lifetime.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut graph = tapir::Graph::<f64>::new();
    /// let w = tapir::Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
    /// let grad = graph.scope(|s| {
    ///     let w = s.leaf(&w);
    ///     let loss = (w * w).sum(); // L = Σ w², so dL/dw = 2w
    ///     s.backward(loss)?;
    ///     Ok::<_, tapir::Error>(w.grad().unwrap().to_vec())
    /// })?;
    /// assert_eq!(grad, [2.0, 4.0, 6.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// A handle cannot leave its scope:
    ///
    /// ```compile_fail
    /// let mut g = tapir::Graph::<f32>::new();
    /// let escaped = g.scope(|s| s.scalar(1.0)); // Var<'s> cannot outlive 's
    /// ```
    ///
    /// and handles of two scopes cannot be mixed:
    ///
    /// ```compile_fail
    /// let (mut g1, mut g2) = (tapir::Graph::<f32>::new(), tapir::Graph::<f32>::new());
    /// g1.scope(|a| {
    ///     let x = a.scalar(1.0);
    ///     g2.scope(|b| {
    ///         let y = b.scalar(2.0);
    ///         let _ = x + y; // different brands
    ///     });
    /// });
    /// ```
    ///
    /// Each `compile_fail` block above and below has a twin that compiles once the
    /// offending line is gone, so the blocks fail for the reason they show:
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut g = tapir::Graph::<f32>::new();
    /// let value = g.scope(|s| s.scalar(1.0).item())?; // a plain f32 may leave
    /// let (mut g1, mut g2) = (tapir::Graph::<f32>::new(), tapir::Graph::<f32>::new());
    /// g1.scope(|a| {
    ///     let x = a.scalar(1.0);
    ///     g2.scope(|b| {
    ///         let y = b.scalar(2.0);
    ///         let _ = (x + x, y + y); // each scope's handles among themselves
    ///     });
    /// });
    /// let mut store = tapir::ParamStore::<f32>::new();
    /// let w = store.add("w", tapir::Tensor::ones(&[2])?)?;
    /// g.scope(|s| {
    ///     let _ = s.param(&store, w).sum();
    /// });
    /// store.get_mut(w).unwrap().data_mut()[0] = 5.0; // after the scope: fine
    /// # assert_eq!(value, 1.0);
    /// # Ok(()) }
    /// ```
    ///
    /// and parameters cannot change while a scope reads them:
    ///
    /// ```compile_fail
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut store = tapir::ParamStore::<f32>::new();
    /// let w = store.add("w", tapir::Tensor::ones(&[2])?)?;
    /// let mut g = tapir::Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let wv = s.param(&store, w);
    ///     store.get_mut(w).unwrap().data_mut()[0] = 5.0; // store is borrowed by the scope
    ///     let _ = wv.sum();
    /// });
    /// # Ok(()) }
    /// ```
    pub fn scope<'g, R>(&'g mut self, f: impl for<'s> FnOnce(&'s Scope<'s, 'g, T>) -> R) -> R {
        self.arena.reset();
        // Normally empty already: each block resets it; a block that panicked did not.
        self.scratch.arena.get_mut().reset();
        let out = {
            let par = self.par();
            let mut tape = Tape::from_spare(&mut self.spare);
            tape.nest = Some(Nest { scratch: &self.scratch, par, anomaly: self.anomaly });
            tape.step = self.steps;
            self.steps += 1;
            let blocks = RefCell::new(recycle(std::mem::take(&mut self.spare_blocks.0)));
            let scope = Scope { core: Core::new(&self.arena, tape, par, self.anomaly), blocks, _env: PhantomData };
            let out = f(&scope);
            // `scope` stays borrowed for 's until it is dropped, so take the tape's
            // vectors out through the cell rather than moving the cell.
            let mut tape = scope.core.tape.borrow_mut();
            self.last = GraphStats {
                nodes: tape.nodes.len(),
                tape_bytes: tape.bytes(),
                arena: self.arena.stats(),
                scratch: self.scratch.arena.borrow().stats(),
            };
            tape.drain_into(&mut self.spare);
            let mut blocks = std::mem::take(&mut *scope.blocks.borrow_mut());
            blocks.clear();
            self.spare_blocks.0 = recycle(blocks);
            out
        };
        if self.arena.end_scope() {
            Tape::shrink(&mut self.spare);
        }
        out
    }

    /// Gives the memory this graph keeps between scopes (the arena's chunks and the tape's
    /// vectors) back to the system; the next scope allocates what it needs anew.
    ///
    /// The graph also releases memory by itself, with hysteresis: after 64 consecutive
    /// scopes that each used under a quarter of the arena's capacity, it shrinks to what
    /// the largest of them used (if that frees at least 1 MiB). A large scope among them
    /// starts the count over, so alternating a training step and a smaller evaluation step
    /// never shrinks and regrows. [`ArenaStats::releases`] counts the releases.
    pub fn shrink_to_fit(&mut self) {
        self.arena.shrink_to_fit();
        Tape::shrink(&mut self.spare);
        self.scratch.arena.get_mut().shrink_to_fit();
        Tape::shrink(self.scratch.spare.get_mut());
    }
}

/// One iteration's recording. Made by [`Graph::scope`]; see there for the lifetimes.
pub struct Scope<'s, 'g: 's, T: Float = f32> {
    pub(crate) core: Core<'s, T>,
    /// The blocks of this scope's checkpoints, borrowed for `'g`, by table index (the
    /// tape's entries hold them for `'s` only, which is enough to recompute them on a
    /// nested scope). A checkpoint's recorded derivative runs its block on this scope
    /// itself, a `Scope<'s, 'g>`, and [`Checkpoint::forward`] asks for the block borrowed
    /// for the scope's `'g` (see `ops/checkpoint.rs`, `Replay`). Empty, and never pushed
    /// to, on a nested scope, whose checkpoints run inline.
    pub(crate) blocks: RefCell<Vec<&'g (dyn Checkpoint<T> + 'g)>>,
    /// Invariant in `'g`, so that nothing borrowed for less than the graph's borrow (the
    /// arena's values, a leaked object holding the scope) can pass for a `'g` borrow.
    _env: PhantomData<&'g mut &'g ()>,
}

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
        match store.check("param", id) {
            // The node's payload is [index, store identity low, high], so that
            // `backward_into` can tell parameters of two stores apart.
            Ok(i) => {
                let payload = [i as u32, store.id() as u32, (store.id() >> 32) as u32];
                // A checkpointed block recomputed for a recorded derivative reads the
                // checkpoint's own parameter nodes.
                let value = Some(store.at(i).data());
                if let Some(v) = crate::ops::checkpoint::replayed_param(&self.core, payload, value, Location::caller())
                {
                    return v;
                }
                self.core.record(crate::ops::OpKind::Param, |r| {
                    let t = store.at(i);
                    let at = r.extra(payload)?;
                    Ok((Op::Param(at), t.shape(), t.data()))
                })
            }
            Err(e) => self.core.fail(e),
        }
    }

    /// A constant copied into the arena from `data`, with shape `dims`.
    #[track_caller]
    pub fn tensor(&'s self, data: &[T], dims: &[usize]) -> Var<'s, T> {
        self.core.record_as("tensor", |r| {
            let shape = r.shape_of(Shape::scalar(), dims)?;
            if data.len() != shape.numel() {
                return Err(Error::DataLength { op: "tensor", len: data.len(), shape, location: r.location });
            }
            Ok((Op::Leaf, shape, r.alloc_iter(data.iter().copied())?))
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
    #[track_caller]
    pub fn randn<R: rand::Rng + ?Sized>(&'s self, dims: &[usize], rng: &mut R) -> Var<'s, T> {
        self.core.record_as("randn", |r| {
            let shape = r.shape_of(Shape::scalar(), dims)?;
            let value = r.alloc(shape.numel())?;
            crate::tensor::fill_normal(value, rng);
            Ok((Op::Leaf, shape, value))
        })
    }

    /// Runs `f` with recording of gradients off: ops inside still compute values, but
    /// their results require no gradient, so backward never visits them.
    pub fn no_grad<R>(&'s self, f: impl FnOnce() -> R) -> R {
        struct Restore<'a, 's, T>(&'a RefCell<Tape<'s, T>>);
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
        // A parameter node's payload is [index, store identity low, high] (see `param`).
        let decode = |tape: &Tape<'s, T>, at: u32| {
            let e = &tape.extra[at as usize..at as usize + 3];
            (e[0] as usize, u64::from(e[1]) | (u64::from(e[2]) << 32))
        };
        let mut tape = self.core.tape.borrow_mut();
        Self::ready(&tape, (loss, Seed::One), op, location)?;
        for node in tape.nodes.iter().map(|n| tape.view(n)) {
            if let Op::Param(at) = node.op {
                let (p, store) = decode(&tape, at);
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
        let params = tape.nodes.iter().enumerate().filter_map(|(i, n)| match n.op {
            Op::Param(at) if n.requires_grad => Some((decode(&tape, at).0, i as u32)),
            _ => None,
        });
        let (arena, par, anomaly) = (self.core.arena, self.core.par, self.core.anomaly);
        if !grads.plan(params) {
            // The buffer holds gradients already: compute in the arena, then add.
            let (seed, flags) = ((loss.id, Seed::One), (anomaly, true));
            backward::run_with(&mut tape, arena, par, seed, location, flags, |_, _| {}, |_, _| {})?;
            tape.consumed = true;
            for (node, g) in tape.nodes.iter().zip(tape.grads.values()) {
                if let (Op::Param(at), Some(g)) = (node.op, g) {
                    crate::kernels::add_assign(grads.slot_mut(decode(&tape, at).0), g);
                }
            }
            return Ok(());
        }
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
                        Some(id) => lent.push(backward::Lent { node: id, slot: Some(data).into() }),
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
                    if let Ok(k) = shared.binary_search_by_key(&decode(&tape, at).0, |e| e.0) {
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

    /// The checks every backward pass runs first, so that a failed one leaves the tape
    /// as it was: the scope's error, a consumed tape, the seed.
    fn ready(
        tape: &Tape<'s, T>,
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
    fn run_backward(
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
        self.core.fail_as(op, |op| crate::Error::InvalidArgument { op, detail, location })
    }

    /// Nodes recorded so far, tape bytes and arena use, now.
    pub fn stats(&self) -> GraphStats {
        let tape = self.core.tape.borrow();
        let scratch = tape.nest.map_or_else(ArenaStats::default, |n| n.scratch::<T>().arena.borrow().stats());
        GraphStats { nodes: tape.nodes.len(), tape_bytes: tape.bytes(), arena: self.core.arena.stats(), scratch }
    }
}

/// The scratch arena and the tape buffers that checkpointed blocks record on, kept by the
/// graph between scopes like the main ones.
pub(crate) struct Scratch<T: 'static> {
    arena: RefCell<Arena>,
    spare: RefCell<Spare<T>>,
}

impl<T: Float> Default for Scratch<T> {
    fn default() -> Self {
        Scratch { arena: RefCell::new(Arena::new()), spare: RefCell::default() }
    }
}

impl<T> std::fmt::Debug for Scratch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("arena", &self.arena).finish_non_exhaustive()
    }
}

/// Runs `f` on a fresh scope nested in a scope `'s`: its own tape, on the scratch arena
/// of `nest`, with `inputs` entering as leaves that borrow their values (a gradient-
/// requesting leaf where `inputs` says so). When `f` returns, the nested tape goes back
/// to the scratch buffers and the scratch arena is reset, so nothing the block made
/// survives: `f`'s result cannot mention `'c`.
///
/// The nested scope's environment lifetime is `'s`: what it borrows must outlive the
/// outer scope, not only the nested one.
pub(crate) fn nested<'s, T: Float, R>(
    nest: Nest<'s>,
    inputs: impl Iterator<Item = (bool, Shape, &'s [T])>,
    f: impl for<'c> FnOnce(&'c Scope<'c, 's, T>, &[Var<'c, T>]) -> R,
) -> R {
    let scratch = nest.scratch::<T>();
    let arena = scratch.arena.borrow();
    let tape = Tape::from_spare(&mut scratch.spare.borrow_mut());
    let out = {
        // A nested scope has no `nest` of its own: a checkpoint inside it runs inline.
        let scope = Scope {
            core: Core::new(&arena, tape, nest.par, nest.anomaly),
            blocks: RefCell::default(),
            _env: PhantomData,
        };
        let leaves = inputs.map(|(grad, shape, value)| {
            let kind = if grad { Op::Variable } else { Op::Leaf };
            scope.core.leaf(kind, shape, value)
        });
        let out = with_slice(scope.core.poison(), leaves, |vars| f(&scope, vars));
        scope.core.tape.borrow_mut().drain_into(&mut scratch.spare.borrow_mut());
        out
    };
    drop(arena);
    scratch.arena.borrow_mut().reset();
    out
}

/// Calls `f` with `items` as a slice: on the stack for up to 16 (a block's or a
/// checkpoint's few inputs), else in a `Vec`, so the common case allocates nothing.
/// `fill` pads the unused stack slots.
pub(crate) fn with_slice<V: Copy, R>(fill: V, items: impl Iterator<Item = V>, f: impl FnOnce(&[V]) -> R) -> R {
    const SMALL: usize = 16;
    let (mut small, mut spill, mut n) = ([fill; SMALL], Vec::new(), 0);
    for v in items {
        if n < SMALL {
            small[n] = v;
        } else {
            if spill.is_empty() {
                spill.extend_from_slice(&small);
            }
            spill.push(v);
        }
        n += 1;
    }
    f(if n <= SMALL { &small[..n] } else { &spill })
}
