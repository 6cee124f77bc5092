//! Where the graphs live: a registry per thread, so that Python objects hold plain ids.
//!
//! A `tapir::Session` is not `Send` (its scope holds `RefCell`s and arena borrows), and a
//! `#[pyclass]` must be. So the sessions stay in a thread-local table, and the Python
//! objects (`Graph`, `Scope`, `Var`) hold only numbers: a slot, the graph's serial, the
//! scope's number and a node index. Every use looks its entry up and checks those numbers,
//! which is the run-time twin of `Graph::scope`'s compile-time brand: a handle of an ended
//! scope, of another graph, or from another thread finds no match and raises `ScopeError`,
//! never touching memory it should not. No `unsafe` is needed here, and a handle kept alive
//! (in a list, a closure, a global) pins a few dozen bytes, never the arena.

use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use tapir::{Graph, Session, Shape};

/// A graph of either element type: one dtype per graph.
pub(crate) enum Sess {
    F32(Session<f32>),
    F64(Session<f64>),
}

/// The element type of a graph, a store or a value.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum DType {
    F32,
    F64,
}

impl DType {
    pub(crate) fn name(self) -> &'static str {
        match self {
            DType::F32 => "float32",
            DType::F64 => "float64",
        }
    }
}

/// One graph of this thread.
pub(crate) struct Entry {
    pub serial: u64,
    pub sess: Sess,
    /// Where the open (or last) scope was opened, and where the last one ended: Python
    /// `file:line`, for the messages of `ScopeError`.
    pub opened_at: String,
    pub ended_at: String,
    /// The number of the scope that ended at `ended_at`.
    pub ended: u64,
    /// The flags of the parameter stores the open scope borrows, cleared when it ends.
    pub borrows: RefCell<Vec<Arc<AtomicBool>>>,
    /// The `tapir.GradBuffer` whose contents the session holds for the open scope
    /// (`s.backward_into`), to be given back when it ends (`graph::give_back`).
    pub lent_grads: RefCell<Option<Py<PyAny>>>,
}

impl Entry {
    pub(crate) fn dtype(&self) -> DType {
        match self.sess {
            Sess::F32(_) => DType::F32,
            Sess::F64(_) => DType::F64,
        }
    }

    pub(crate) fn is_open(&self) -> bool {
        match &self.sess {
            Sess::F32(s) => s.is_open(),
            Sess::F64(s) => s.is_open(),
        }
    }

    /// The number of the open (or last) scope, from 1.
    pub(crate) fn scope_number(&self) -> u64 {
        match &self.sess {
            Sess::F32(s) => s.scopes_opened(),
            Sess::F64(s) => s.scopes_opened(),
        }
    }
}

thread_local! {
    static GRAPHS: RefCell<Vec<Option<Entry>>> = const { RefCell::new(Vec::new()) };
    static THREAD: Cell<u64> = const { Cell::new(0) };
}

static SERIALS: AtomicU64 = AtomicU64::new(1);

/// A number for the calling thread, unique in the process (0 is never one).
pub(crate) fn thread() -> u64 {
    THREAD.with(|t| {
        if t.get() == 0 {
            t.set(SERIALS.fetch_add(1, Ordering::Relaxed));
        }
        t.get()
    })
}

/// A fresh serial, unique in the process.
pub(crate) fn serial() -> u64 {
    SERIALS.fetch_add(1, Ordering::Relaxed)
}

/// Adds a graph to this thread's table; returns its slot and serial.
pub(crate) fn insert(dtype: DType, threads: Option<usize>) -> (u32, u64) {
    let serial = serial();
    let sess = match dtype {
        DType::F32 => Sess::F32(Session::new(configured(Graph::new(), threads))),
        DType::F64 => Sess::F64(Session::new(configured(Graph::new(), threads))),
    };
    let entry = Entry {
        serial,
        sess,
        opened_at: String::new(),
        ended_at: String::new(),
        ended: 0,
        borrows: RefCell::default(),
        lent_grads: RefCell::default(),
    };
    GRAPHS.with(|g| {
        let mut g = g.borrow_mut();
        let slot = match g.iter().position(Option::is_none) {
            Some(i) => {
                g[i] = Some(entry);
                i
            }
            None => {
                g.push(Some(entry));
                g.len() - 1
            }
        };
        (slot as u32, serial)
    })
}

fn configured<T: tapir::Float>(mut g: Graph<T>, threads: Option<usize>) -> Graph<T> {
    if let Some(n) = threads {
        g.set_threads(n);
    }
    g
}

/// Drops the graph in `slot` if it is still the one with `serial`. From another thread
/// (a Python object freed there) it finds nothing: that graph is freed with its thread.
/// While the table is in use (an object freed during an op) it is left for `insert`'s
/// next sweep... which never comes; so it is dropped on the table's next mutable use.
pub(crate) fn remove(slot: u32, serial: u64) {
    GRAPHS.with(|g| {
        if let Ok(mut g) = g.try_borrow_mut() {
            if let Some(e) = g.get_mut(slot as usize) {
                if e.as_ref().is_some_and(|e| e.serial == serial) {
                    *e = None;
                }
            }
        }
    });
}

/// Why a lookup found no usable entry.
pub(crate) enum Missing {
    /// No graph with this serial in this thread's table: dropped, or another thread's.
    Gone,
    /// The table is in use by an enclosing call (a Python callback opening a scope).
    Busy,
}

/// Runs `f` on the entry of `(slot, serial)`, borrowed shared (ops: they never open or
/// close a scope, so a Python callback run by one may record ops too).
pub(crate) fn with<R>(slot: u32, serial: u64, f: impl FnOnce(&Entry) -> R) -> Result<R, Missing> {
    GRAPHS.with(|g| {
        let g = g.try_borrow().map_err(|_| Missing::Busy)?;
        match g.get(slot as usize) {
            Some(Some(e)) if e.serial == serial => Ok(f(e)),
            _ => Err(Missing::Gone),
        }
    })
}

/// Runs `f` on the entry, borrowed mutably (opening and closing scopes, settings).
pub(crate) fn with_mut<R>(slot: u32, serial: u64, f: impl FnOnce(&mut Entry) -> R) -> Result<R, Missing> {
    GRAPHS.with(|g| {
        let mut g = g.try_borrow_mut().map_err(|_| Missing::Busy)?;
        match g.get_mut(slot as usize) {
            Some(Some(e)) if e.serial == serial => Ok(f(e)),
            _ => Err(Missing::Gone),
        }
    })
}

/// What a Python handle knows of its node without its graph: enough to name it in an
/// error after its scope has ended.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Meta {
    pub op: &'static str,
    pub shape: Shape,
}

/// Runs `$body` with `$s` bound to the open scope of `$entry` and `$T` to its element
/// type; `None` if no scope is open.
macro_rules! on_scope {
    ($entry:expr, |$s:ident, $T:ident| $body:expr) => {
        match &$entry.sess {
            $crate::registry::Sess::F32(ss) => ss.with(|$s| {
                #[allow(dead_code)]
                type $T = f32;
                $body
            }),
            $crate::registry::Sess::F64(ss) => ss.with(|$s| {
                #[allow(dead_code)]
                type $T = f64;
                $body
            }),
        }
    };
}
pub(crate) use on_scope;
