//! `tapir.Graph` and `tapir.Scope`: `with graph.scope() as s:` opens an iteration, leaving
//! the block (normally or by an exception) ends it, as `Graph::scope`'s closure does.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use tapir::{Float, Scope, Var};

use crate::convert;
use crate::errors;
use crate::nograd::PyNoGrad;
use crate::params::{Grads, PyGradBuffer, PyParamStore, Store};
use crate::registry::{self, on_scope, DType, Entry, Missing};
use crate::tensor;
use crate::var::{finish, PyVar};

/// Owns the arena and the tape's buffers; runs one scope at a time. Keep one for a whole
/// training run: each scope reuses the memory of the previous one.
#[pyclass(frozen, module = "tapir", name = "Graph")]
pub struct PyGraph {
    slot: u32,
    serial: u64,
    thread: u64,
    dtype: DType,
}

fn missing(py: Python<'_>, m: Missing) -> PyErr {
    match m {
        Missing::Gone => errors::scope(py, "this graph belongs to another thread (or was dropped)".into()),
        Missing::Busy => errors::scope(py, "a scope cannot be opened or closed from inside an op's callback".into()),
    }
}

#[pymethods]
impl PyGraph {
    /// A graph of `dtype` (`"float32"` or `"float64"`, or the NumPy dtype). `threads`
    /// sets the threads of its matrix products (default: all of `tapir.init_threads`'s);
    /// `arena_limit` caps a scope's arena bytes (`ArenaLimitError` past it).
    #[new]
    #[pyo3(signature = (dtype=None, threads=None, arena_limit=None))]
    fn new(
        py: Python<'_>,
        dtype: Option<&Bound<'_, PyAny>>,
        threads: Option<usize>,
        arena_limit: Option<usize>,
    ) -> PyResult<Self> {
        let dtype = match dtype {
            Some(d) => convert::parse_dtype(py, d, "Graph")?,
            None => DType::F32,
        };
        let (slot, serial) = registry::insert(dtype, threads);
        let g = PyGraph { slot, serial, thread: registry::thread(), dtype };
        if arena_limit.is_some() {
            g.set_arena_limit(py, arena_limit)?;
        }
        Ok(g)
    }

    /// A scope of this graph, to open with `with`. It keeps the graph alive, so that
    /// `with tapir.Graph().scope() as s:` works.
    fn scope(slf: &Bound<'_, Self>) -> PyScope {
        let g = slf.get();
        PyScope {
            slot: g.slot,
            serial: g.serial,
            thread: g.thread,
            dtype: g.dtype,
            number: AtomicU64::new(0),
            _graph: slf.clone().unbind(),
        }
    }

    /// Caps the bytes a scope may take in the arena (`None`: no cap).
    #[pyo3(signature = (limit))]
    fn set_arena_limit(&self, py: Python<'_>, limit: Option<usize>) -> PyResult<()> {
        self.settings(py, |e| match &mut e.sess {
            registry::Sess::F32(s) => s.graph_mut().map(|g| g.set_arena_limit(limit)),
            registry::Sess::F64(s) => s.graph_mut().map(|g| g.set_arena_limit(limit)),
        })
    }

    /// Statistics of the last scope: nodes, tape bytes, arena bytes in use, high-water
    /// mark and capacity (the memory the graph keeps between scopes).
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.settings(py, |e| match &mut e.sess {
            registry::Sess::F32(s) => s.graph().map(tapir::Graph::stats),
            registry::Sess::F64(s) => s.graph().map(tapir::Graph::stats),
        })?;
        let d = PyDict::new(py);
        d.set_item("nodes", st.nodes)?;
        d.set_item("tape_bytes", st.tape_bytes)?;
        d.set_item("arena_in_use", st.arena.bytes_in_use)?;
        d.set_item("arena_high_water", st.arena.high_water)?;
        d.set_item("arena_capacity", st.arena.capacity)?;
        Ok(d)
    }

    /// `"float32"` or `"float64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }

    fn __repr__(&self) -> String {
        format!("tapir.Graph(dtype={:?})", self.dtype.name())
    }
}

impl PyGraph {
    /// Runs `f` on the graph while no scope is open.
    fn settings<R>(&self, py: Python<'_>, f: impl FnOnce(&mut Entry) -> Option<R>) -> PyResult<R> {
        if self.thread != registry::thread() {
            return Err(errors::scope(py, "this graph belongs to another thread".into()));
        }
        registry::with_mut(self.slot, self.serial, f)
            .map_err(|m| missing(py, m))?
            .ok_or_else(|| errors::scope(py, "the graph's scope is open: change settings between scopes".into()))
    }
}

/// After `e`'s scope closed: the lent gradient buffer's contents back into its Python
/// object. (A buffer borrowed by a running method, which cannot happen here, would keep its
/// `Lent` state and raise `ScopeError` when used.)
fn give_back(py: Python<'_>, e: &mut Entry) {
    let Some(buffer) = e.lent_grads.get_mut().take() else {
        return;
    };
    let grads = match &mut e.sess {
        registry::Sess::F32(s) => s.take_grads().map(Grads::F32),
        registry::Sess::F64(s) => s.take_grads().map(Grads::F64),
    };
    if let (Some(grads), Ok(b)) = (grads, buffer.bind(py).cast::<PyGradBuffer>()) {
        if let Ok(mut b) = b.try_borrow_mut() {
            b.grads = grads;
        }
    }
}

impl Drop for PyGraph {
    fn drop(&mut self) {
        if self.thread == registry::thread() {
            // A scope still open (its object kept by a suspended generator) ends with the
            // graph: a gradient buffer it holds goes back to its Python object first.
            let _ = registry::with_mut(self.slot, self.serial, |e| {
                match &mut e.sess {
                    registry::Sess::F32(s) => s.close(),
                    registry::Sess::F64(s) => s.close(),
                };
                Python::attach(|py| give_back(py, e));
            });
            registry::remove(self.slot, self.serial);
        }
    }
}

/// One iteration's recording: `with graph.scope() as s:`. Its handles (`Var`) are valid
/// until the block ends; the arena is then reset in O(1) for the next scope.
#[pyclass(frozen, module = "tapir", name = "Scope")]
pub struct PyScope {
    slot: u32,
    serial: u64,
    thread: u64,
    dtype: DType,
    /// The scope's number once entered (0: not yet).
    number: AtomicU64,
    /// The graph, held so that it is not dropped (and its session with it) while the
    /// scope object lives.
    _graph: Py<PyGraph>,
}

impl PyScope {
    /// Runs `f` on this scope's entry after checking thread and that this scope is open.
    fn run<R>(&self, py: Python<'_>, f: impl FnOnce(&Entry) -> PyResult<R>) -> PyResult<R> {
        if self.thread != registry::thread() {
            return Err(errors::scope(py, "this scope belongs to another thread".into()));
        }
        let number = self.number.load(Ordering::Relaxed);
        registry::with(self.slot, self.serial, |e| {
            if number == 0 {
                return Err(errors::scope(py, "this scope is not open: use it as `with graph.scope() as s:`".into()));
            }
            if e.scope_number() != number || !e.is_open() {
                return Err(errors::scope(py, format!("this scope ended at {}", e.ended_at)));
            }
            f(e)
        })
        .map_err(|m| missing(py, m))?
    }

    /// A new handle, made by `f` on the open scope.
    fn make(&self, py: Python<'_>, op: &'static str, f: impl FnOnce(Maker<'_>) -> PyResult<PyVar>) -> PyResult<PyVar> {
        self.run(py, |e| f(Maker { py, e, slot: self.slot, op }))
    }
}

/// What `PyScope::make`'s closures need (kept small: a closure cannot be generic).
struct Maker<'a> {
    py: Python<'a>,
    e: &'a Entry,
    slot: u32,
    op: &'static str,
}

/// Handles of `xs`, all of this scope.
fn vars_of<'s, T: Float>(
    py: Python<'_>,
    s: &'s Scope<'s, 'static, T>,
    xs: &[Bound<'_, PyVar>],
    me: &PyScope,
) -> PyResult<Vec<Var<'s, T>>> {
    let number = me.number.load(Ordering::Relaxed);
    xs.iter()
        .map(|x| {
            let v = x.get();
            if v.slot != me.slot || v.serial != me.serial || v.scope != number || v.thread != me.thread {
                return Err(errors::scope(
                    py,
                    format!("{} belongs to another scope", crate::var::describe(v.index, &v.meta)),
                ));
            }
            v.get(py, s)
        })
        .collect()
}

#[pymethods]
impl PyScope {
    fn __enter__(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<Self>> {
        let me = slf.get();
        if me.thread != registry::thread() {
            return Err(errors::scope(py, "this scope belongs to another thread".into()));
        }
        if me.number.load(Ordering::Relaxed) != 0 {
            return Err(errors::scope(py, "this scope was entered already: open a new one with graph.scope()".into()));
        }
        let at = errors::caller(py);
        let number = registry::with_mut(me.slot, me.serial, |e| {
            let opened = match &mut e.sess {
                registry::Sess::F32(s) => s.open(),
                registry::Sess::F64(s) => s.open(),
            };
            if !opened {
                return Err(errors::scope(
                    py,
                    format!(
                        "a scope of this graph is already open (opened at {}): scopes of one graph do not nest, and a generator suspended inside its `with` block keeps its scope open",
                        e.opened_at
                    ),
                ));
            }
            e.opened_at = at;
            Ok(e.scope_number())
        })
        .map_err(|m| missing(py, m))??;
        me.number.store(number, Ordering::Relaxed);
        Ok(slf.clone().unbind())
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<bool> {
        self.close(py)?;
        Ok(false)
    }

    /// Ends the scope (what leaving the `with` block does); ending it twice does nothing.
    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let number = self.number.load(Ordering::Relaxed);
        if self.thread != registry::thread() {
            return Err(errors::scope(py, "this scope belongs to another thread".into()));
        }
        let at = errors::caller(py);
        registry::with_mut(self.slot, self.serial, |e| {
            if e.scope_number() == number && e.is_open() {
                match &mut e.sess {
                    registry::Sess::F32(s) => s.close(),
                    registry::Sess::F64(s) => s.close(),
                };
                give_back(py, e);
                e.ended_at = at;
                e.ended = number;
                for b in e.borrows.get_mut().drain(..) {
                    b.store(false, Ordering::Release);
                }
            }
        })
        .map_err(|m| missing(py, m))
    }

    /// A context manager: `with s.no_grad():` records its block's ops without gradients
    /// (their results require none; a leaf made inside still requests its own), as
    /// `torch.no_grad()`. Regions nest; an exception leaving the block ends it too.
    fn no_grad(&self, py: Python<'_>) -> PyResult<PyNoGrad> {
        self.run(py, |e| Ok(PyNoGrad::new(self.slot, self.serial, self.thread, e.scope_number())))
    }

    /// A gradient-requesting leaf: `array` copied into the arena once (a later write to
    /// the array changes nothing). After `backward`, its `.grad` holds `∂loss/∂leaf`.
    fn leaf(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.make(py, "leaf", |m| {
            on_scope!(m.e, |s, T| tensor::with_data::<T, _>(m.py, array, m.e.dtype(), "leaf", |d, dims| {
                finish(m.py, m.e, m.slot, s.variable(d, dims), m.op)
            }))
            .unwrap_or_else(|| Err(errors::scope(m.py, "no scope is open".into())))
        })
    }

    /// A constant: `array` copied into the arena once; no gradient.
    fn input(&self, py: Python<'_>, array: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.make(py, "input", |m| {
            on_scope!(m.e, |s, T| tensor::with_data::<T, _>(m.py, array, m.e.dtype(), "input", |d, dims| {
                finish(m.py, m.e, m.slot, s.tensor(d, dims), m.op)
            }))
            .unwrap_or_else(|| Err(errors::scope(m.py, "no scope is open".into())))
        })
    }

    /// A constant filled with `value`, of shape `shape`.
    #[pyo3(signature = (shape, value=0.0))]
    fn full(&self, py: Python<'_>, shape: Vec<usize>, value: f64) -> PyResult<PyVar> {
        self.make(py, "full", |m| {
            on_scope!(m.e, |s, T| finish(m.py, m.e, m.slot, s.full(&shape, T::from_f64(value)), m.op))
                .unwrap_or_else(|| Err(errors::scope(m.py, "no scope is open".into())))
        })
    }

    /// Parameter `name` of `store`, read in place (no copy). The store is borrowed until
    /// the scope ends: changing it meanwhile (`opt.step`, `store[name] = ...`) raises
    /// `ScopeError`.
    fn param(&self, py: Python<'_>, store: &Bound<'_, PyParamStore>, name: &str) -> PyResult<PyVar> {
        let mut st = store.borrow_mut();
        if st.kind() != self.dtype {
            return Err(errors::dtype(
                py,
                format!("param: a {} store in a {} graph", st.kind().name(), self.dtype.name()),
            ));
        }
        let id = st.id_of(py, name)?;
        let flag = self.run(py, |e| {
            let flag = Arc::new(AtomicBool::new(true));
            e.borrows.borrow_mut().push(flag.clone());
            Ok((flag, e.opened_at.clone()))
        })?;
        st.lend(flag);
        let st = &*st;
        self.make(py, "param", |m| {
            match (&st.store, &m.e.sess) {
                (Store::F32(p), registry::Sess::F32(ss)) => {
                    ss.with_param(p, id, |_, v| finish(m.py, m.e, m.slot, v, m.op))
                }
                (Store::F64(p), registry::Sess::F64(ss)) => {
                    ss.with_param(p, id, |_, v| finish(m.py, m.e, m.slot, v, m.op))
                }
                _ => None,
            }
            .unwrap_or_else(|| Err(errors::dtype(m.py, "param: store and graph dtypes differ".into())))
        })
    }

    /// Backward from the scalar `loss`: afterwards each leaf's and parameter's `.grad`
    /// holds `∂loss/∂it`. Consumes the tape (a second backward raises `GradientError`).
    fn backward(&self, py: Python<'_>, loss: &Bound<'_, PyVar>) -> PyResult<()> {
        self.run(py, |e| {
            on_scope!(e, |s, T| {
                let y = vars_of(py, s, std::slice::from_ref(loss), self)?[0];
                s.backward(y).map_err(|err| errors::engine(py, &err))
            })
            .unwrap_or(Ok(()))
        })
    }

    /// As `backward`, adding every parameter's gradient into `grads`
    /// (`grads[p] += ∂loss/∂p`; zero it between steps with `grads.zero()`). The scope
    /// keeps `grads` until it ends (the gradients are written straight into it, with no
    /// copy); using it meanwhile raises `ScopeError`.
    fn backward_into(&self, py: Python<'_>, loss: &Bound<'_, PyVar>, grads: &Bound<'_, PyGradBuffer>) -> PyResult<()> {
        let mut g = grads.borrow_mut();
        g.grads.check_here(py, "backward_into")?;
        self.run(py, |e| {
            let index = match (&e.sess, &g.grads) {
                (registry::Sess::F32(ss), Grads::F32(_)) => {
                    ss.with(|s| vars_of(py, s, std::slice::from_ref(loss), self).map(|v| v[0].index()))
                }
                (registry::Sess::F64(ss), Grads::F64(_)) => {
                    ss.with(|s| vars_of(py, s, std::slice::from_ref(loss), self).map(|v| v[0].index()))
                }
                _ => return Err(errors::dtype(py, "backward_into: gradient buffer and graph dtypes differ".into())),
            }
            .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))?;
            let mut lent = e.lent_grads.borrow_mut();
            if lent.is_some() {
                // This scope holds a buffer already (and its tape is consumed): the copying
                // form, which reports what is wrong without taking this buffer.
                return match (&e.sess, &mut g.grads) {
                    (registry::Sess::F32(ss), Grads::F32(b)) => {
                        ss.with(|s| s.var_at(index).map(|y| s.backward_add(y, b)))
                    }
                    (registry::Sess::F64(ss), Grads::F64(b)) => {
                        ss.with(|s| s.var_at(index).map(|y| s.backward_add(y, b)))
                    }
                    _ => None,
                }
                .flatten()
                .unwrap_or(Ok(()))
                .map_err(|err| errors::engine(py, &err));
            }
            let buffer = std::mem::replace(&mut g.grads, Grads::Lent(e.opened_at.clone()));
            let result = match (&e.sess, buffer) {
                (registry::Sess::F32(ss), Grads::F32(b)) => {
                    ss.backward_into(index, b).map_err(|n| (Grads::F32(n.grads), n.error))
                }
                (registry::Sess::F64(ss), Grads::F64(b)) => {
                    ss.backward_into(index, b).map_err(|n| (Grads::F64(n.grads), n.error))
                }
                (_, other) => Err((other, None)),
            };
            match result {
                Ok(pass) => {
                    *lent = Some(grads.clone().into_any().unbind());
                    pass.map_err(|err| errors::engine(py, &err))
                }
                Err((back, error)) => {
                    g.grads = back;
                    Err(match error {
                        Some(err) => errors::engine(py, &err),
                        None => errors::scope(py, "backward_into: the scope could not take the gradient buffer".into()),
                    })
                }
            }
        })
    }

    /// `∂y/∂xᵢ` for each `x` in `xs`, as handles recorded on the tape, so that they can be
    /// differentiated again (`torch.autograd.grad(..., create_graph=True)`). `y` must be a
    /// scalar. The tape is not consumed.
    #[pyo3(signature = (y, xs, create_graph=true))]
    fn grad<'py>(
        &self,
        py: Python<'py>,
        y: &Bound<'py, PyVar>,
        xs: Vec<Bound<'py, PyVar>>,
        create_graph: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let _ = create_graph; // gradients are always recorded (and so differentiable)
        let out = self.run(py, |e| {
            on_scope!(e, |s, T| {
                let yv = vars_of(py, s, std::slice::from_ref(y), self)?[0];
                let xv = vars_of(py, s, &xs, self)?;
                let mut out = vec![yv; xv.len()];
                s.grad_into(yv, &xv, &mut out).map_err(|err| errors::engine(py, &err))?;
                out.into_iter().map(|g| finish(py, e, self.slot, g, "grad")).collect::<PyResult<Vec<PyVar>>>()
            })
            .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))
        })?;
        PyList::new(py, out.into_iter().map(|v| Py::new(py, v)).collect::<PyResult<Vec<_>>>()?)
    }

    /// `xs` joined along `axis`.
    #[pyo3(signature = (xs, axis=0))]
    fn concat(&self, py: Python<'_>, xs: Vec<Bound<'_, PyVar>>, axis: isize) -> PyResult<PyVar> {
        self.run(py, |e| {
            on_scope!(e, |s, T| {
                let v = vars_of(py, s, &xs, self)?;
                finish(py, e, self.slot, s.concat(&v, axis), "concat")
            })
            .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))
        })
    }

    /// `xs` (of one shape) stacked along a new axis `axis`.
    #[pyo3(signature = (xs, axis=0))]
    fn stack(&self, py: Python<'_>, xs: Vec<Bound<'_, PyVar>>, axis: isize) -> PyResult<PyVar> {
        self.run(py, |e| {
            on_scope!(e, |s, T| {
                let v = vars_of(py, s, &xs, self)?;
                finish(py, e, self.slot, s.stack(&v, axis), "stack")
            })
            .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))
        })
    }

    /// Nodes recorded so far and arena bytes in use now.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let st = self.run(py, |e| Ok(on_scope!(e, |s, T| s.stats()).unwrap_or_default()))?;
        let d = PyDict::new(py);
        d.set_item("nodes", st.nodes)?;
        d.set_item("tape_bytes", st.tape_bytes)?;
        d.set_item("arena_in_use", st.arena.bytes_in_use)?;
        d.set_item("arena_high_water", st.arena.high_water)?;
        Ok(d)
    }
}
