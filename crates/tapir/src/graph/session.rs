//! [`Session`]: a graph whose scope is opened and closed by calls instead of by a
//! closure, for bindings whose blocks cannot hold a Rust closure open (Python's `with`).
//!
//! `Graph::scope` ties a scope's lifetime to a stack frame. A `with` block in Python is a
//! sequence of separate calls into Rust, so between two of them no Rust frame can stay
//! open. A session keeps the open scope in a struct instead, and hands it to each call
//! through [`Session::with`], which brands it afresh (`for<'s>`), exactly as
//! `Graph::scope` does: a [`Var`] cannot leave one call, so between calls a binding holds
//! nodes by index ([`Var::index`]) and turns them back into handles with
//! [`Scope::var_at`], which checks the index against the tape.
//!
//! The open scope's references into the graph (its arenas) are typed `'static` while the
//! scope is stored, and are valid until [`Session::close`]: this file holds the `unsafe`
//! blocks that say so, and nothing else in the crate knows. The same holds for what a
//! session lends its scope without a copy: parameter stores ([`Session::with_param`],
//! which holds an `Arc` of the store until `close`) and a gradient buffer
//! ([`Session::backward_into`], which keeps the buffer until [`Session::take_grads`]).

use std::cell::{Cell, RefCell, UnsafeCell};
use std::ptr::NonNull;
use std::sync::Arc;

use crate::dtype::Float;
use crate::error::Result;
use crate::graph::graph::Graph;
use crate::params::{GradBuffer, ParamId, ParamStore};
use crate::record::handles::{Scope, Var};

/// A [`Graph`] whose scope is opened and closed by calls: [`open`](Session::open),
/// [`with`](Session::with) for each piece of work, [`close`](Session::close). Closing
/// does what the end of [`Graph::scope`]'s closure does (the arena is reset in O(1) at the
/// next open, and the tape's vectors are kept), so a warmed-up session allocates nothing
/// per scope either.
///
/// Anything the open scope borrows must outlive the session: its scope is a
/// `Scope<'s, 'static, T>`, so [`Scope::input`], [`Scope::leaf`] and [`Scope::param`]
/// take `'static` data. Use the copying forms instead ([`Scope::tensor`],
/// [`Scope::variable`]), or let the session hold what is lent: [`Session::with_param`]
/// borrows a parameter from an `Arc<ParamStore>` without a copy, and
/// [`Session::backward_into`] writes parameter gradients straight into a buffer the
/// session keeps until the scope closes.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut session = tapir::Session::new(tapir::Graph::<f64>::new());
/// session.open();
/// let x = session.with(|s| s.variable(&[3.0], &[]).index()).unwrap();
/// let y = session.with(|s| s.var_at(x).map(|x| (x * x).index())).unwrap().unwrap();
/// let dx = session.with(|s| {
///     s.backward(s.var_at(y).unwrap())?;
///     Ok::<_, tapir::Error>(s.var_at(x).unwrap().grad().unwrap()[0])
/// });
/// assert_eq!(dx, Some(Ok(6.0)));
/// session.close();
/// assert_eq!(session.with(|s| s.stats().nodes), None); // closed
/// # Ok(()) }
/// ```
///
/// A handle cannot leave the call that made it, so it cannot outlive the scope:
///
/// ```compile_fail
/// let mut session = tapir::Session::new(tapir::Graph::<f32>::new());
/// session.open();
/// let x = session.with(|s| s.variable(&[1.0], &[])).unwrap(); // the Var escapes
/// session.close();
/// ```
pub struct Session<T: Float = f32> {
    /// The graph, from `Box::into_raw`, freed in `Drop`. A raw pointer rather than a
    /// `Box`, so that moving the session does not assert unique access to the graph while
    /// the open scope holds references into it.
    graph: NonNull<Graph<T>>,
    /// The open scope, if any. Boxed once, in `new`, so that its address stays put when
    /// the session moves.
    scope: Box<Option<Scope<'static, 'static, T>>>,
    /// Scopes opened so far.
    opened: u64,
    /// `no_grad` regions of the open scope entered by [`Session::enter_no_grad`] and not
    /// yet exited: the tape's depth counts these and [`Scope::no_grad`]'s own, and
    /// `exit_no_grad` removes only these, so it cannot end a closure's region.
    no_grad: Cell<u32>,
    /// The stores the open scope borrows parameters from ([`Session::with_param`]), held
    /// until `close` so that their `'static` borrows stay valid and no one can change them
    /// (`Arc::get_mut` fails while a clone is here).
    held: RefCell<Vec<Arc<ParamStore<T>>>>,
    /// The gradient buffer lent to the open (or last) scope by [`Session::backward_into`],
    /// boxed once in `new` so that its address stays put. Written through a shared borrow
    /// only while `lending` is false (nothing refers into it then); read back by
    /// [`Session::take_grads`] once the scope is closed.
    lent: Box<UnsafeCell<Option<GradBuffer<T>>>>,
    /// Whether `lent` holds a buffer the scope may refer into.
    lending: Cell<bool>,
}

impl<T: Float> Session<T> {
    /// A session over `graph`, closed.
    pub fn new(graph: Graph<T>) -> Session<T> {
        let graph = NonNull::from(Box::leak(Box::new(graph)));
        Session {
            graph,
            scope: Box::new(None),
            opened: 0,
            no_grad: Cell::new(0),
            held: RefCell::default(),
            lent: Box::new(UnsafeCell::new(None)),
            lending: Cell::new(false),
        }
    }

    /// Opens a scope, as [`Graph::scope`] does before calling its closure; `false` (and
    /// nothing changes) if one is open already.
    pub fn open(&mut self) -> bool {
        if self.scope.is_some() {
            return false;
        }
        // SAFETY: `graph` is the live allocation of `new`, freed only in `Drop`. With no
        // scope open nothing else refers into it (`graph`/`graph_mut` borrow `self`, and
        // so have ended), so this is the only reference; it lasts until `close` takes
        // the scope apart, although it is typed `'static`. `with` lends the scope only
        // under a lifetime no longer than its borrow of `self`, and `close` runs before
        // the graph is touched again and before `Drop` frees it.
        let graph: &'static mut Graph<T> = unsafe { &mut *self.graph.as_ptr() };
        let (arena, scratch, keep, settings) = graph.parts();
        *self.scope = Some(Graph::begin(arena, scratch, keep, settings));
        self.opened += 1;
        self.no_grad.set(0);
        true
    }

    /// Whether a scope is open.
    pub fn is_open(&self) -> bool {
        self.scope.is_some()
    }

    /// Scopes opened so far: the number of the open (or last) one, from 1. A binding's
    /// handle keeps it, so that a handle of an earlier scope is told apart.
    pub fn scopes_opened(&self) -> u64 {
        self.opened
    }

    /// Runs `f` on the open scope, or returns `None` if none is open. As with
    /// [`Graph::scope`], `'s` is fresh for each call, so no [`Var`] leaves it; keep
    /// [`Var::index`] and come back with [`Scope::var_at`].
    pub fn with<R>(&self, f: impl for<'s> FnOnce(&'s Scope<'s, 'static, T>) -> R) -> Option<R> {
        let scope: &Scope<'static, 'static, T> = self.scope.as_ref().as_ref()?;
        Some(f(shorten(scope)))
    }

    /// Runs `f` on the open scope with parameter `id` of `store` recorded as a node that
    /// borrows the store's data without a copy ([`Scope::param`]); `None` if no scope is
    /// open. The session holds a clone of the `Arc` until [`close`](Session::close), so
    /// the store cannot change while the scope reads it: `Arc::get_mut` on it fails until
    /// then. An id of another store poisons the scope, as with `Scope::param`.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut store = tapir::ParamStore::<f64>::new();
    /// let w = store.add("w", tapir::Tensor::from_vec(vec![3.0], &[])?)?;
    /// let mut store = Arc::new(store);
    /// let mut session = tapir::Session::new(tapir::Graph::new());
    /// session.open();
    /// let wi = session.with_param(&store, w, |_, w| w.index()).unwrap();
    /// assert!(Arc::get_mut(&mut store).is_none(), "read by the open scope");
    /// let dw = session.with(|s| {
    ///     let w = s.var_at(wi).unwrap();
    ///     s.backward(w * w)?;
    ///     Ok::<_, tapir::Error>(w.grad().unwrap()[0])
    /// });
    /// assert_eq!(dw, Some(Ok(6.0)));
    /// session.close();
    /// assert!(Arc::get_mut(&mut store).is_some(), "free again");
    /// # Ok(()) }
    /// ```
    #[track_caller]
    pub fn with_param<R>(
        &self,
        store: &Arc<ParamStore<T>>,
        id: ParamId,
        f: impl for<'s> FnOnce(&'s Scope<'s, 'static, T>, Var<'s, T>) -> R,
    ) -> Option<R> {
        let scope = shorten(self.scope.as_ref().as_ref()?);
        let mut held = self.held.borrow_mut();
        if !held.iter().any(|h| Arc::ptr_eq(h, store)) {
            held.push(Arc::clone(store));
        }
        drop(held);
        // SAFETY: `held` keeps a clone of this `Arc` until `close` has taken the scope
        // apart, so the store lives as long as any node that borrows it; an `Arc` hands
        // out shared references only (and `ParamStore` has no interior mutability), so no
        // `&mut` to it can exist meanwhile. The `'static` reference goes only into the
        // stored scope, whose `'g` borrows all end at `close`.
        let store: &'static ParamStore<T> = unsafe { &*Arc::as_ptr(store) };
        let param = scope.param(store, id);
        Some(f(scope, param))
    }

    /// Backward from the scalar node `loss` (a [`Var::index`]) into `grads`, without the
    /// copy that [`Scope::backward_add`] makes: the session keeps the buffer, lent to the
    /// scope as [`Scope::backward_into`] lends it, and hands it back through
    /// [`take_grads`](Session::take_grads) once the scope is closed, whether the pass
    /// succeeded or not (on error it is unchanged, as `Scope::backward_into` promises).
    ///
    /// `Err`, with the buffer untouched, if nothing was lent: no scope is open, a buffer is
    /// lent already (one per scope: the first pass consumes the tape anyway), `loss` is not
    /// a node of the open scope, or the checks `Scope::backward_into` runs before it
    /// changes anything fail ([`NotLent::error`]: a non-scalar loss, a consumed tape, a
    /// buffer of another store). Otherwise `Ok` with the pass's result.
    ///
    /// ```
    /// # use std::sync::Arc;
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut store = tapir::ParamStore::<f64>::new();
    /// let w = store.add("w", tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?)?;
    /// let (store, mut grads) = (Arc::new(store.clone()), store.zeros_like()?);
    /// let mut session = tapir::Session::new(tapir::Graph::new());
    /// for _ in 0..2 {
    ///     session.open();
    ///     let (w, loss) = session.with_param(&store, w, |_, w| (w.index(), w.square().sum().index())).unwrap();
    ///     let refused = session.backward_into(w, grads).unwrap_err(); // not a scalar
    ///     assert!(refused.error.is_some());
    ///     session.backward_into(loss, refused.grads).map_err(|_| "refused").unwrap()?;
    ///     assert!(session.take_grads().is_none(), "lent until the scope closes");
    ///     session.close();
    ///     grads = session.take_grads().unwrap();
    /// }
    /// assert_eq!(grads.get(w)?.data(), [4.0, 8.0]); // two steps of 2w, accumulated
    /// # Ok(()) }
    /// ```
    #[track_caller]
    // The `Err` side hands the caller's buffer back by value, as `Ok` would have lent it:
    // its size is the buffer's (a few `Vec`s) and an engine error, on a cold path.
    #[allow(clippy::result_large_err)]
    pub fn backward_into(&self, loss: usize, grads: GradBuffer<T>) -> std::result::Result<Result<()>, NotLent<T>> {
        let Some(scope) = self.scope.as_ref().as_ref() else {
            return Err(NotLent { grads, error: None });
        };
        let scope = shorten(scope);
        let Some(loss) = scope.var_at(loss).filter(|_| !self.lending.get()) else {
            return Err(NotLent { grads, error: None });
        };
        if let Err(error) = scope.check_into(loss, &grads) {
            return Err(NotLent { grads, error: Some(error) });
        }
        self.lending.set(true);
        // SAFETY: `lending` was false, so nothing refers into `lent` (it is set here and
        // cleared only by `take_grads`, through `&mut self` with no scope open), and the
        // session is not `Sync`, so this is the only reference to the slot. The buffer
        // stays in the slot, at a fixed address, until `take_grads` or `Drop`, both after
        // `close` has taken the scope apart: so whatever the pass leaves in the tape that
        // points into the buffer (its lent gradient slots, typed `'s`) is valid as long as
        // the scope is, exactly as `Scope::backward_into` requires of a `&'s mut`.
        let grads: &mut GradBuffer<T> = unsafe { &mut *self.lent.get() }.insert(grads);
        Ok(scope.backward_into(loss, grads))
    }

    /// The buffer lent by [`backward_into`](Session::backward_into), once the scope that
    /// used it is closed; `None` while a scope is open or if none is lent.
    pub fn take_grads(&mut self) -> Option<GradBuffer<T>> {
        if self.is_open() {
            return None;
        }
        self.lending.set(false);
        self.lent.get_mut().take()
    }

    /// Turns gradient recording off in the open scope until the matching
    /// [`exit_no_grad`](Session::exit_no_grad): [`Scope::no_grad`] for a region that is two
    /// calls rather than a closure (Python's `with s.no_grad():`). Ops recorded meanwhile
    /// compute values, but their results require no gradient; gradient-requesting leaves
    /// still request one. Regions nest, and closing the scope ends them all.
    ///
    /// Returns the number of regions now entered this way, or `None` (and nothing
    /// changes) if no scope is open, the count is at `u32::MAX`, or the tape is in use by
    /// an op that is running (a callback of the engine calling back into the session).
    ///
    /// ```
    /// let mut session = tapir::Session::new(tapir::Graph::<f64>::new());
    /// assert_eq!(session.enter_no_grad(), None); // no scope is open
    /// session.open();
    /// let x = session.with(|s| s.variable(&[2.0], &[]).index()).unwrap();
    /// assert_eq!(session.enter_no_grad(), Some(1));
    /// let frozen = session.with(|s| s.var_at(x).unwrap().exp().requires_grad()).unwrap();
    /// assert_eq!(session.exit_no_grad(), Some(0));
    /// let live = session.with(|s| s.var_at(x).unwrap().exp().requires_grad()).unwrap();
    /// assert_eq!((frozen, live), (false, true));
    /// assert_eq!(session.exit_no_grad(), None); // no region is open
    /// ```
    pub fn enter_no_grad(&self) -> Option<u32> {
        let scope = self.scope.as_ref().as_ref()?;
        let mut tape = scope.core.tape.try_borrow_mut().ok()?;
        let (depth, mine) = (tape.no_grad.checked_add(1)?, self.no_grad.get().checked_add(1)?);
        tape.no_grad = depth;
        self.no_grad.set(mine);
        Some(mine)
    }

    /// Ends the innermost region entered by [`enter_no_grad`](Session::enter_no_grad).
    /// Returns the number of such regions still entered, or `None` (and nothing changes)
    /// if no scope is open, none of its regions was entered this way, or the tape is in
    /// use by a running op.
    pub fn exit_no_grad(&self) -> Option<u32> {
        let scope = self.scope.as_ref().as_ref()?;
        let mut tape = scope.core.tape.try_borrow_mut().ok()?;
        let (depth, mine) = (tape.no_grad.checked_sub(1)?, self.no_grad.get().checked_sub(1)?);
        tape.no_grad = depth;
        self.no_grad.set(mine);
        Some(mine)
    }

    /// Closes the open scope, as the end of [`Graph::scope`]'s closure does; `false` if
    /// none was open. Every [`Var`] index of the scope is stale afterwards.
    pub fn close(&mut self) -> bool {
        let Some(scope) = self.scope.take() else {
            return false;
        };
        self.no_grad.set(0);
        let Scope { core, blocks, .. } = scope;
        let (mut tape, mut blocks) = (core.tape.into_inner(), blocks.into_inner());
        // SAFETY: the scope has been taken apart: `tape` and `blocks` still hold
        // references into the graph's arenas, but `finish` only moves them into the
        // graph's spares (emptied; see `tape::tape::recycle`), never reads through them.
        // No other reference into the graph is live (see `open`).
        let graph: &mut Graph<T> = unsafe { &mut *self.graph.as_ptr() };
        graph.finish_parts(&mut tape, &mut blocks);
        // The tape no longer borrows the stores (its vectors are emptied): let them go.
        self.held.get_mut().clear();
        true
    }

    /// The graph, to read its statistics or settings; `None` while a scope is open.
    pub fn graph(&self) -> Option<&Graph<T>> {
        if self.is_open() {
            return None;
        }
        // SAFETY: with no scope open the session holds the only reference (see `open`),
        // and this one borrows `self`.
        Some(unsafe { self.graph.as_ref() })
    }

    /// The graph, to change its settings; `None` while a scope is open.
    pub fn graph_mut(&mut self) -> Option<&mut Graph<T>> {
        if self.is_open() {
            return None;
        }
        // SAFETY: as for `graph`, mutably: this borrows `self` mutably.
        Some(unsafe { self.graph.as_mut() })
    }
}

/// The stored scope under the lifetime of this borrow of it. The types say `'static`, the
/// truth is "until `close`", which outlasts every borrow of the session.
fn shorten<'s, T: Float>(scope: &'s Scope<'static, 'static, T>) -> &'s Scope<'s, 'static, T> {
    // SAFETY: `Scope` is invariant in its first lifetime only so that handles of two
    // scopes cannot meet; shortening it on a shared borrow is sound because everything
    // the scope holds under it (arena slices, the checkpoint scratch) lives until `close`,
    // which needs `&mut self` and so comes after this borrow ends, and because `f` is
    // generic over `'s`, so nothing it stores under `'s` can be a shorter-lived borrow of
    // the caller's. The layout is the same type's.
    unsafe { &*std::ptr::from_ref(scope).cast::<Scope<'s, 'static, T>>() }
}

/// A gradient buffer [`Session::backward_into`] did not lend, handed back untouched.
pub struct NotLent<T: Float> {
    /// The buffer, as it was.
    pub grads: GradBuffer<T>,
    /// Why the pass refused it ([`Scope::backward_into`]'s checks), or `None` if no pass
    /// could start: no scope open, a buffer lent already, or not a node of the scope.
    pub error: Option<crate::error::Error>,
}

impl<T: Float> std::fmt::Debug for NotLent<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NotLent").field("error", &self.error).finish_non_exhaustive()
    }
}

impl<T: Float> Drop for Session<T> {
    fn drop(&mut self) {
        self.close();
        // SAFETY: `graph` came from `Box::leak` in `new` and is freed only here, after
        // `close` ended every reference into it.
        drop(unsafe { Box::from_raw(self.graph.as_ptr()) });
    }
}

impl<T: Float> std::fmt::Debug for Session<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("open", &self.is_open())
            .field("opened", &self.opened)
            .field("no_grad", &self.no_grad.get())
            .field("held_stores", &self.held.borrow().len())
            .field("lending", &self.lending.get())
            .finish()
    }
}
