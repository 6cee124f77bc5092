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
use crate::graph::backward;
use crate::graph::tape::{NodeView, Spare, Tape};
use crate::graph::NodeId;
use crate::ops::Op;
use crate::params::{GradBuffer, ParamId, ParamStore};
use crate::shape::Shape;
use crate::storage::{AllocFail, Arena, ArenaStats};
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
    par: Par,
    anomaly: bool,
    last: GraphStats,
}

/// What a scope recorded and how much memory it used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GraphStats {
    /// Nodes on the tape.
    pub nodes: usize,
    /// Bytes of tape (nodes and index payloads), beyond the values in the arena.
    pub tape_bytes: usize,
    /// Arena use: bytes in use, high-water mark, capacity.
    pub arena: ArenaStats,
}

impl<T: Float> Default for Graph<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Float> Graph<T> {
    /// A graph with no arena limit, faer's global parallelism and anomaly detection off.
    pub fn new() -> Graph<T> {
        Graph {
            arena: Arena::new(),
            spare: Spare::default(),
            par: faer::get_global_parallelism(),
            anomaly: false,
            last: GraphStats::default(),
        }
    }

    /// Caps the bytes a scope may allocate in the arena; an op that would pass the cap
    /// fails with [`Error::ArenaLimit`]. `None` removes the cap.
    pub fn set_arena_limit(&mut self, bytes: Option<usize>) {
        self.arena.set_limit(bytes);
    }

    /// Threads for matrix products: 1 runs them on the calling thread, `n > 1` on `n`
    /// threads of rayon's global pool, 0 on all of them. Counts above
    /// [`MAX_THREADS`](crate::MAX_THREADS) are clamped to it. Returns the count in effect.
    pub fn set_threads(&mut self, threads: usize) -> usize {
        let (par, n) = crate::threads::par(threads);
        self.par = par;
        n
    }

    /// Threads used for matrix products.
    pub fn threads(&self) -> usize {
        self.par.degree()
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
        GraphStats { arena: self.arena.stats(), ..self.last }
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
        let out = {
            let scope = Scope {
                core: Core {
                    arena: &self.arena,
                    tape: RefCell::new(Tape::from_spare(&mut self.spare)),
                    par: self.par,
                    anomaly: self.anomaly,
                },
                _env: PhantomData,
            };
            let out = f(&scope);
            // `scope` stays borrowed for 's until it is dropped, so take the tape's
            // vectors out through the cell rather than moving the cell.
            let mut tape = scope.core.tape.borrow_mut();
            self.last = GraphStats { nodes: tape.nodes.len(), tape_bytes: tape.bytes(), arena: self.arena.stats() };
            tape.drain_into(&mut self.spare);
            out
        };
        self.arena.reset();
        out
    }
}

/// One iteration's recording. Made by [`Graph::scope`]; see there for the lifetimes.
pub struct Scope<'s, 'g: 's, T: Float = f32> {
    pub(crate) core: Core<'s, T>,
    _env: PhantomData<&'g mut &'g ()>,
}

/// The part of a scope that handles point at.
#[derive(Debug)]
pub struct Core<'s, T> {
    pub(crate) arena: &'s Arena,
    pub(crate) tape: RefCell<Tape<'s, T>>,
    pub(crate) par: Par,
    pub(crate) anomaly: bool,
}

/// A handle to a node of the scope `'s`: `Copy`, 16 bytes, usable with `+ - * /`.
///
/// Ops on handles never panic and never return `Result`: a caller's mistake (mismatched
/// shapes, a bad axis, an index out of range, the arena limit) is recorded as the scope's
/// first error, with the op, every shape and the caller's location, and every later op
/// returns a poisoned handle. The error comes out of [`Scope::backward`],
/// [`Var::value`], [`Var::item`] or [`Scope::check`]; see `docs/design.md` for why.
#[derive(Clone, Copy)]
pub struct Var<'s, T: Float = f32> {
    pub(crate) core: &'s Core<'s, T>,
    pub(crate) id: NodeId<'s>,
}

impl<T: Float> std::fmt::Debug for Var<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.id, self.shape())
    }
}

/// What an op's recording closure sees: the tape so far and the arena.
pub(crate) struct Rec<'a, 's, T> {
    pub tape: &'a mut Tape<'s, T>,
    arena: &'s Arena,
    pub op: &'static str,
    pub location: Loc,
}

impl<'s, T: Float> Rec<'_, 's, T> {
    pub fn node(&self, id: NodeId<'s>) -> NodeView<'s, T> {
        self.tape.node(id)
    }

    pub fn value(&self, id: NodeId<'s>) -> &'s [T] {
        self.tape.node(id).value
    }

    pub fn shape(&self, id: NodeId<'s>) -> Shape {
        self.tape.shape(id)
    }

    fn alloc_err(&self, e: AllocFail) -> Error {
        alloc_error(e, self.op, self.location)
    }

    /// A zeroed slice of `n` elements in the arena.
    pub fn alloc(&self, n: usize) -> Result<&'s mut [T]> {
        self.arena.alloc_zeroed(n).map_err(|e| self.alloc_err(e))
    }

    /// A slice filled from an exact-size iterator, in one pass.
    pub fn alloc_iter<I>(&self, iter: I) -> Result<&'s mut [T]>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        self.arena.alloc_iter(iter).map_err(|e| self.alloc_err(e))
    }

    /// Appends `items` to the tape's payload list and returns their offset.
    pub fn extra(&mut self, items: impl IntoIterator<Item = u32>) -> Result<u32> {
        let at = self.tape.extra.len();
        let at = u32::try_from(at).map_err(|_| Error::TapeFull { op: self.op, len: at, location: self.location })?;
        self.tape.extra.extend(items);
        Ok(at)
    }

    /// Resolves a possibly negative axis against `shape`.
    pub fn axis(&self, shape: Shape, axis: isize) -> Result<usize> {
        resolve_axis(shape.rank(), axis).ok_or(Error::BadAxis { op: self.op, axis, shape, location: self.location })
    }

    /// A shape from dimensions, or the `InvalidShape` error naming this op and `input`.
    pub fn shape_of(&self, input: Shape, dims: &[usize]) -> Result<Shape> {
        crate::error::shape_at(self.op, input, dims, self.location)
    }

    pub fn invalid(&self, detail: String) -> Error {
        Error::InvalidArgument { op: self.op, detail, location: self.location }
    }
}

/// `axis` in `-rank..rank`, made non-negative.
pub(crate) fn resolve_axis(rank: usize, axis: isize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

pub(crate) fn alloc_error(e: AllocFail, op: &'static str, location: Loc) -> Error {
    match e {
        AllocFail::Limit { requested, in_use, limit } => Error::ArenaLimit { op, requested, in_use, limit, location },
        AllocFail::Oom { requested } => Error::OutOfMemory { op, requested, location },
    }
}

impl<'s, T: Float> Core<'s, T> {
    fn poison(&'s self) -> Var<'s, T> {
        Var { core: self, id: NodeId::POISON }
    }

    /// Records one op: `f` checks the arguments, computes the value in the arena and
    /// returns the node's op, shape and value. Errors poison the scope.
    #[track_caller]
    #[inline]
    pub(crate) fn record(
        &'s self,
        op: &'static str,
        f: impl FnOnce(&mut Rec<'_, 's, T>) -> Result<(Op<'s, T>, Shape, &'s [T])>,
    ) -> Var<'s, T> {
        let location = Location::caller();
        let mut tape = self.tape.borrow_mut();
        if tape.error.is_some() {
            return self.poison();
        }
        let result = f(&mut Rec { tape: &mut tape, arena: self.arena, op, location });
        let pushed = result.and_then(|(kind, shape, value)| {
            // Gradient-requesting leaves ask for one themselves (even under `no_grad`, as
            // the caller said so explicitly); every other node inherits it from its inputs.
            let mut requires_grad = matches!(kind, Op::Variable | Op::Param(_));
            if tape.no_grad == 0 {
                kind.for_each_input(&tape.extra, |i| requires_grad |= tape.nodes[i.index()].requires_grad);
            }
            if self.anomaly {
                if !value.iter().all(|v| v.is_finite()) {
                    return Err(Error::NonFinite { op, phase: "forward", shape, location });
                }
                tape.locs.push(location);
            }
            tape.push(NodeView { value, op: kind, shape, requires_grad }, op, location)
        });
        match pushed {
            Ok(id) => Var { core: self, id },
            Err(e) => {
                tape.error = Some(e);
                self.poison()
            }
        }
    }

    /// Records a leaf whose value is already in place.
    #[track_caller]
    pub(crate) fn leaf(&'s self, kind: Op<'s, T>, shape: Shape, value: &'s [T]) -> Var<'s, T> {
        self.record("leaf", |_| Ok((kind, shape, value)))
    }

    /// Records the error `e` unless the scope already holds one, and returns a poisoned handle.
    pub(crate) fn fail(&'s self, e: Error) -> Var<'s, T> {
        let mut tape = self.tape.borrow_mut();
        if tape.error.is_none() {
            tape.error = Some(e);
        }
        self.poison()
    }
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
            Ok(i) => self.core.record("param", |r| {
                let t = store.at(i);
                let at = r.extra([i as u32, store.id() as u32, (store.id() >> 32) as u32])?;
                Ok((Op::Param(at), t.shape(), t.data()))
            }),
            Err(e) => self.core.fail(e),
        }
    }

    /// A constant copied into the arena from `data`, with shape `dims`.
    #[track_caller]
    pub fn tensor(&'s self, data: &[T], dims: &[usize]) -> Var<'s, T> {
        self.core.record("tensor", |r| {
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
        self.core.record("full", |r| {
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
        self.core.record("randn", |r| {
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
    /// than one element; [`Error::BackwardTwice`] after a consuming backward;
    /// [`Error::ArenaLimit`] if the gradients do not fit under the limit;
    /// [`Error::NonFinite`] from anomaly detection.
    #[track_caller]
    pub fn backward(&'s self, loss: Var<'s, T>) -> Result<()> {
        self.run_backward(loss, false, Location::caller())
    }

    /// As [`backward`](Scope::backward), but leaves the tape usable for another backward
    /// (each pass computes fresh gradients; they are not added to the previous ones).
    #[track_caller]
    pub fn backward_retain(&'s self, loss: Var<'s, T>) -> Result<()> {
        self.run_backward(loss, true, Location::caller())
    }

    /// As [`backward`](Scope::backward), then adds every parameter's gradient into
    /// `grads` (`grads[p] += ∂loss/∂p`), which the caller allocates once with
    /// [`ParamStore::zeros_like`] and clears with [`GradBuffer::zero`].
    ///
    /// # Errors
    /// As for `backward`; [`Error::WrongStore`] if `grads` was made for another store
    /// than a parameter's, [`Error::UnknownParam`] if its shapes do not match the store's.
    /// On error `grads` is unchanged.
    #[track_caller]
    pub fn backward_into(&'s self, loss: Var<'s, T>, grads: &mut GradBuffer<T>) -> Result<()> {
        let location = Location::caller();
        self.run_backward(loss, false, location)?;
        let tape = self.core.tape.borrow();
        // A parameter node's payload is [index, store identity low, high] (see `param`).
        let decode = |at: u32| {
            let e = &tape.extra[at as usize..at as usize + 3];
            (e[0] as usize, u64::from(e[1]) | (u64::from(e[2]) << 32))
        };
        // Check every parameter first, so that a mismatch changes nothing.
        for node in tape.nodes.iter().map(|n| tape.view(n)) {
            if let Op::Param(at) = node.op {
                let (p, store) = decode(at);
                if store != grads.store() {
                    return Err(Error::WrongStore {
                        op: "backward_into",
                        what: "the gradient buffer".into(),
                        expected: grads.store(),
                        found: store,
                        location,
                    });
                }
                if grads.shape(p) != Some(node.shape) {
                    return Err(Error::UnknownParam {
                        op: "backward_into",
                        detail: format!(
                            "parameter #{p} has shape {} but the gradient buffer holds {}",
                            node.shape,
                            grads.shape(p).map_or("no such parameter".to_string(), |s| s.to_string())
                        ),
                        location,
                    });
                }
            }
        }
        for (node, g) in tape.nodes.iter().zip(&tape.grads) {
            if let (Op::Param(at), Some(g)) = (node.op, g) {
                crate::kernels::add_assign(grads.slot_mut(decode(at).0), g);
            }
        }
        Ok(())
    }

    fn run_backward(&'s self, loss: Var<'s, T>, retain: bool, location: Loc) -> Result<()> {
        let mut tape = self.core.tape.borrow_mut();
        if let Some(e) = &tape.error {
            return Err(e.clone());
        }
        if tape.consumed {
            return Err(Error::BackwardTwice { location });
        }
        backward::run(&mut tape, self.core.arena, self.core.par, loss.id, location, self.core.anomaly)?;
        tape.consumed = !retain;
        Ok(())
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

    /// Nodes recorded so far, tape bytes and arena use, now.
    pub fn stats(&self) -> GraphStats {
        let tape = self.core.tape.borrow();
        GraphStats { nodes: tape.nodes.len(), tape_bytes: tape.bytes(), arena: self.core.arena.stats() }
    }

    /// The tape as text, one node a line, like SSA: `%7 = mul %3 %5 : [2, 3]`.
    pub fn dump(&self) -> String {
        use std::fmt::Write;
        let tape = self.core.tape.borrow();
        let mut s = String::new();
        for (i, n) in tape.nodes.iter().map(|n| tape.view(n)).enumerate() {
            let _ = write!(s, "%{i} = {}", n.op.name());
            n.op.for_each_input(&tape.extra, |x| {
                let _ = write!(s, " {x:?}");
            });
            let _ = writeln!(s, " : {}{}", n.shape, if n.requires_grad { " grad" } else { "" });
        }
        s
    }

    /// The tape in Graphviz DOT: one box per node with its op and shape; nodes that
    /// require a gradient are filled.
    pub fn to_dot(&self) -> String {
        use std::fmt::Write;
        let tape = self.core.tape.borrow();
        let mut s = String::from("digraph tape {\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n");
        for (i, n) in tape.nodes.iter().map(|n| tape.view(n)).enumerate() {
            let style = if n.requires_grad { ", style=filled, fillcolor=lightblue" } else { "" };
            let _ = writeln!(s, "  n{i} [label=\"%{i} {}\\n{}\"{style}];", n.op.name(), n.shape);
            n.op.for_each_input(&tape.extra, |x| {
                let _ = writeln!(s, "  n{} -> n{i};", x.index());
            });
        }
        s.push_str("}\n");
        s
    }
}

impl<'s, T: Float> Var<'s, T> {
    /// The node's id on the tape (`%poison` after a failed op).
    pub fn id(self) -> NodeId<'s> {
        self.id
    }

    fn with_node<R>(self, f: impl FnOnce(&NodeView<'s, T>) -> R) -> Result<R> {
        let tape = self.core.tape.borrow();
        if let Some(e) = &tape.error {
            return Err(e.clone());
        }
        Ok(f(&tape.node(self.id)))
    }

    /// The shape (`[]` for a poisoned handle).
    pub fn shape(self) -> Shape {
        self.with_node(|n| n.shape).unwrap_or(Shape::scalar())
    }

    /// Whether backward will compute a gradient for this node.
    pub fn requires_grad(self) -> bool {
        self.with_node(|n| n.requires_grad).unwrap_or(false)
    }

    /// The value, borrowed from the arena for the rest of the scope.
    ///
    /// # Errors
    /// The scope's first error, if any op failed.
    pub fn value(self) -> Result<&'s [T]> {
        self.with_node(|n| n.value)
    }

    /// The single element of a one-element value.
    ///
    /// # Errors
    /// The scope's first error; [`Error::NotScalar`] if the value has another size.
    #[track_caller]
    pub fn item(self) -> Result<T> {
        let location = Location::caller();
        let (shape, value) = self.with_node(|n| (n.shape, n.value))?;
        match value {
            [v] => Ok(*v),
            _ => Err(Error::NotScalar { op: "item", shape, location }),
        }
    }

    /// An owned copy of the value.
    ///
    /// # Errors
    /// The scope's first error, if any op failed.
    pub fn to_tensor(self) -> Result<Tensor<T>> {
        let (shape, value) = self.with_node(|n| (n.shape, n.value))?;
        Ok(Tensor::from_parts(value.to_vec(), shape))
    }

    /// The gradient from the last backward pass, or `None` if there was none, the node
    /// requires no gradient, or no path from the loss reached it.
    pub fn grad(self) -> Option<&'s [T]> {
        let tape = self.core.tape.borrow();
        if tape.error.is_some() {
            return None;
        }
        tape.grads.get(self.id.index()).copied().flatten()
    }

    /// The gradient as an owned tensor of this node's shape (see [`grad`](Var::grad)).
    pub fn grad_tensor(self) -> Option<Tensor<T>> {
        let g = self.grad()?;
        Some(Tensor::from_parts(g.to_vec(), self.shape()))
    }

    /// A leaf that shares this value (no copy) and requires no gradient.
    #[track_caller]
    pub fn detach(self) -> Var<'s, T> {
        self.core.record("detach", |r| {
            let n = r.node(self.id);
            Ok((Op::Leaf, n.shape, n.value))
        })
    }

    /// A new leaf that shares this value (no copy) and requests a gradient, like
    /// PyTorch's `x.detach().requires_grad_()`.
    #[track_caller]
    pub fn with_grad(self) -> Var<'s, T> {
        self.core.record("with_grad", |r| {
            let n = r.node(self.id);
            Ok((Op::Variable, n.shape, n.value))
        })
    }
}
