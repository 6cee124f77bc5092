//! [`Graph`]: the arena and the tape's buffers between scopes, and [`Graph::scope`], which
//! runs one scope. The handles ([`Scope`], [`Var`]) are declared in `record/handles.rs`.
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

use faer::Par;

use crate::dtype::Float;
use crate::record::handles::{Checkpoint, Core, Nest, Scope, State};
use crate::record::state::{Scratch, Spare};
use crate::storage::{Arena, ArenaStats};
use crate::tape::profile::{Profile, Profiler};
use crate::tape::tape::recycle;

/// Owns the arena and the tape's buffers, and runs one scope at a time.
///
/// Keep one `Graph` for a whole training run: each [`scope`](Graph::scope) reuses the
/// memory of the previous one, so a warmed-up step allocates nothing on the heap.
#[derive(Debug)]
pub struct Graph<T: Float = f32> {
    arena: Arena,
    /// Where checkpointed blocks record, reset after each block's forward and after each
    /// block's recomputation (see [`Scope::checkpoint`]).
    scratch: Scratch<T>,
    /// `None`: faer's global parallelism, read when a scope starts (reading it starts
    /// rayon's global pool, which [`init_threads`](crate::init_threads) must build first).
    par: Option<Par>,
    anomaly: bool,
    /// The per-op profile, made when profiling is first turned on; counted into while
    /// `profiling` is set.
    profiler: Option<Box<Profiler>>,
    profiling: bool,
    keep: Keep<T>,
}

/// What a scope is run with: the parallelism, anomaly detection, the profile if on.
pub(crate) type Settings<'a> = (Par, bool, Option<&'a Profiler>);

/// What a graph keeps from one scope to the next, apart from its arenas.
#[derive(Debug, Default)]
pub(crate) struct Keep<T: Float> {
    spare: Spare<T>,
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
            scratch: Scratch::default(),
            par: None,
            anomaly: false,
            profiler: None,
            profiling: false,
            keep: Keep::default(),
        }
    }

    /// Caps the bytes a scope may allocate in the arena; an op that would pass the cap
    /// fails with [`Error::ArenaLimit`](crate::Error::ArenaLimit). `None` removes the cap.
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
    /// [`Error::NonFinite`](crate::Error::NonFinite), naming the op and where it was recorded. It costs a pass over
    /// every value, so it is meant for debugging.
    pub fn set_anomaly_detection(&mut self, on: bool) {
        self.anomaly = on;
    }

    /// Turns the per-op profile on or off. While it is on, every scope counts, per op kind,
    /// the nodes it records and the time recording them took (the forward kernels), the
    /// backward rules it runs and their time, and the time inside matrix products, adding
    /// to what earlier scopes counted until [`reset_profile`](Graph::reset_profile);
    /// [`profile`](Graph::profile) reads it. Times are wall-clock
    /// ([`Instant`](std::time::Instant)), taken only while profiling is on; off (the
    /// default), recording and backward test one flag they test anyway. Turning it on the
    /// first time allocates the counters (a fixed table); nothing allocates per op.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::<f32>::ones(&[64, 64])?;
    /// let mut g = tapir::Graph::new();
    /// g.set_profiling(true);
    /// g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     s.backward(x.matmul(x).tanh().sum())
    /// })?;
    /// let profile = g.profile();
    /// let matmul = profile.ops.iter().find(|o| o.op == "matmul").unwrap();
    /// assert_eq!((matmul.calls, matmul.backward_calls), (1, 1));
    /// println!("{profile}"); // op, calls, forward ms, backward calls and ms, GEMM ms, share
    /// # Ok(()) }
    /// ```
    pub fn set_profiling(&mut self, on: bool) {
        if on && self.profiler.is_none() {
            self.profiler = Some(Box::default());
        }
        self.profiling = on;
    }

    /// The per-op profile counted so far (see [`set_profiling`](Graph::set_profiling)):
    /// one entry per op kind seen, most time first; empty if profiling was never on or
    /// since [`reset_profile`](Graph::reset_profile). Allocates the report.
    pub fn profile(&self) -> Profile {
        self.profiler.as_ref().map(|p| p.report()).unwrap_or_default()
    }

    /// Zeroes the per-op profile; profiling stays on or off as it was.
    pub fn reset_profile(&mut self) {
        if let Some(p) = self.profiler.as_mut() {
            p.reset();
        }
    }

    /// Statistics of the last scope (nodes, tape bytes) and of the arena now.
    pub fn stats(&self) -> GraphStats {
        GraphStats { arena: self.arena.stats(), scratch: self.scratch.arena.borrow().stats(), ..self.keep.last }
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
        let out = {
            let (arena, scratch, keep, settings) = self.parts();
            let scope = Self::begin(arena, scratch, keep, settings);
            let out = f(&scope);
            // `scope` stays borrowed for 's until it is dropped, so take the tape's
            // vectors out through the cells rather than moving them.
            Self::finish(arena, scratch, keep, &mut scope.core.tape.borrow_mut(), &mut scope.blocks.borrow_mut());
            out
        };
        self.end();
        out
    }

    /// Resets the arenas for a new scope and lends out the parts a scope reads apart
    /// from the parts it returns to at its end.
    /// The settings come with them: the parallelism, whether anomaly detection is on, and
    /// the profile if profiling is.
    pub(crate) fn parts(&mut self) -> (&Arena, &Scratch<T>, &mut Keep<T>, Settings<'_>) {
        self.arena.reset();
        // Normally empty already: each block resets it; a block that panicked did not.
        self.scratch.arena.get_mut().reset();
        let profile = if self.profiling { self.profiler.as_deref() } else { None };
        let settings = (self.par(), self.anomaly, profile);
        (&self.arena, &self.scratch, &mut self.keep, settings)
    }

    /// Starts a scope on the parts [`parts`](Graph::parts) lent: the tape's vectors come
    /// from the spares.
    pub(crate) fn begin<'s, 'g>(
        arena: &'s Arena,
        scratch: &'s Scratch<T>,
        keep: &mut Keep<T>,
        (par, anomaly, profile): Settings<'s>,
    ) -> Scope<'s, 'g, T> {
        let threads = crate::kernels::par::threads(par);
        arena.set_fill_threads(threads);
        crate::threads::keep_awake(threads);
        let mut tape = State::from_spare(&mut keep.spare);
        tape.nest = Some(Nest { scratch, par, anomaly, profile });
        tape.step = keep.steps;
        keep.steps += 1;
        let blocks = RefCell::new(recycle(std::mem::take(&mut keep.spare_blocks.0)));
        Scope { core: Core::new(arena, tape, par, anomaly, profile), blocks, _env: PhantomData }
    }

    /// Ends a scope's recording: its statistics, and its vectors back to the spares.
    pub(crate) fn finish(
        arena: &Arena,
        scratch: &Scratch<T>,
        keep: &mut Keep<T>,
        tape: &mut State<'_, T>,
        blocks: &mut Vec<&(dyn Checkpoint<T> + '_)>,
    ) {
        keep.last = GraphStats {
            nodes: tape.nodes.len(),
            tape_bytes: tape.bytes(),
            arena: arena.stats(),
            scratch: scratch.arena.borrow().stats(),
        };
        tape.drain_into(&mut keep.spare);
        blocks.clear();
        keep.spare_blocks.0 = recycle(std::mem::take(blocks));
    }

    /// Ends a scope whose parts were taken apart (a [`Session`](crate::Session)'s).
    pub(crate) fn finish_parts(&mut self, tape: &mut State<'_, T>, blocks: &mut Vec<&(dyn Checkpoint<T> + '_)>) {
        Self::finish(&self.arena, &self.scratch, &mut self.keep, tape, blocks);
        self.end();
    }

    /// After the scope is gone: the arena's hysteresis (see [`shrink_to_fit`](Graph::shrink_to_fit)).
    pub(crate) fn end(&mut self) {
        if self.arena.end_scope() {
            State::shrink(&mut self.keep.spare);
        }
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
        State::shrink(&mut self.keep.spare);
        self.scratch.arena.get_mut().shrink_to_fit();
        State::shrink(self.scratch.spare.get_mut());
    }
}
