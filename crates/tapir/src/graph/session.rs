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
//! scope is stored, and are valid until [`Session::close`]: this file holds the two
//! `unsafe` blocks that say so, and nothing else in the crate knows.

use std::cell::Cell;
use std::ptr::NonNull;

use crate::dtype::Float;
use crate::graph::graph::Graph;
use crate::record::handles::Scope;
#[cfg(doc)]
use crate::record::handles::Var;

/// A [`Graph`] whose scope is opened and closed by calls: [`open`](Session::open),
/// [`with`](Session::with) for each piece of work, [`close`](Session::close). Closing
/// does what the end of [`Graph::scope`]'s closure does (the arena is reset in O(1) at the
/// next open, and the tape's vectors are kept), so a warmed-up session allocates nothing
/// per scope either.
///
/// Anything the open scope borrows must outlive the session: its scope is a
/// `Scope<'s, 'static, T>`, so [`Scope::input`], [`Scope::leaf`] and [`Scope::param`]
/// take `'static` data. Use the copying forms instead: [`Scope::tensor`],
/// [`Scope::variable`] and [`Scope::param_copied`].
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
}

impl<T: Float> Session<T> {
    /// A session over `graph`, closed.
    pub fn new(graph: Graph<T>) -> Session<T> {
        let graph = NonNull::from(Box::leak(Box::new(graph)));
        Session { graph, scope: Box::new(None), opened: 0, no_grad: Cell::new(0) }
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
            .finish()
    }
}
