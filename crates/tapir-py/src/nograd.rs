//! `with s.no_grad():`, the context manager of `Scope.no_grad`: `Scope::no_grad`'s closure
//! as an enter/exit pair, kept across calls by `tapir::Session::enter_no_grad` and
//! `exit_no_grad`.

use std::sync::atomic::{AtomicU32, Ordering};

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::errors;
use crate::registry::{self, Entry, Missing, Sess};

/// The region of `with s.no_grad():`: ops inside compute values, but their results
/// require no gradient (leaves made inside still request theirs). Regions nest; one
/// object may be entered again once it has been exited.
#[pyclass(frozen, module = "tapir", name = "NoGrad")]
pub struct PyNoGrad {
    slot: u32,
    serial: u64,
    thread: u64,
    /// The number of the scope it belongs to.
    scope: u64,
    /// How many times it is entered and not yet exited.
    entered: AtomicU32,
}

impl PyNoGrad {
    /// A region of scope `scope` of the graph in `slot` with `serial`.
    pub(crate) fn new(slot: u32, serial: u64, thread: u64, scope: u64) -> PyNoGrad {
        PyNoGrad { slot, serial, thread, scope, entered: AtomicU32::new(0) }
    }

    fn check_thread(&self, py: Python<'_>) -> PyResult<()> {
        if self.thread != registry::thread() {
            return Err(errors::scope(py, "no_grad: this scope belongs to another thread".into()));
        }
        Ok(())
    }

    /// Runs `f` on the graph's entry with the scope checked: `Err(where it ended)` if the
    /// scope is no longer open.
    fn on_entry<R>(&self, py: Python<'_>, f: impl FnOnce(&Entry) -> R) -> PyResult<Result<R, String>> {
        self.check_thread(py)?;
        let looked = registry::with(self.slot, self.serial, |e| {
            if e.scope_number() == self.scope && e.is_open() {
                Ok(f(e))
            } else if e.ended == self.scope {
                Err(format!("at {}", e.ended_at))
            } else {
                Err(format!("(scope {} of its graph; the graph is on scope {})", self.scope, e.scope_number()))
            }
        });
        match looked {
            Ok(r) => Ok(r),
            Err(Missing::Gone) => Ok(Err("with its graph, which was dropped".into())),
            Err(Missing::Busy) => {
                Err(errors::scope(py, "no_grad: its graph is being opened or closed by an enclosing call".into()))
            }
        }
    }
}

#[pymethods]
impl PyNoGrad {
    fn __enter__(slf: &Bound<'_, Self>, py: Python<'_>) -> PyResult<Py<Self>> {
        let me = slf.get();
        let depth = me
            .on_entry(py, |e| match &e.sess {
                Sess::F32(s) => s.enter_no_grad(),
                Sess::F64(s) => s.enter_no_grad(),
            })?
            .map_err(|ended| errors::scope(py, format!("no_grad: entered after its scope ended {ended}")))?;
        if depth.is_none() {
            return Err(errors::scope(py, "no_grad: the scope's tape is in use by a running op".into()));
        }
        me.entered.fetch_add(1, Ordering::Relaxed);
        Ok(slf.clone().unbind())
    }

    /// Ends the region. After the scope has ended (`s.close()` inside the block) this is a
    /// `ScopeError`, unless an exception is already leaving the block: that one propagates.
    #[pyo3(signature = (*exc))]
    fn __exit__(&self, py: Python<'_>, exc: &Bound<'_, PyTuple>) -> PyResult<bool> {
        let raising = exc.iter().next().is_some_and(|t| !t.is_none());
        self.check_thread(py)?;
        if self.entered.load(Ordering::Relaxed) == 0 {
            return Err(errors::scope(py, "no_grad: exited without being entered".into()));
        }
        self.entered.fetch_sub(1, Ordering::Relaxed);
        let exited = self.on_entry(py, |e| match &e.sess {
            Sess::F32(s) => s.exit_no_grad(),
            Sess::F64(s) => s.exit_no_grad(),
        })?;
        match exited {
            Ok(Some(_)) => Ok(false),
            Ok(None) => Err(errors::scope(py, "no_grad: the scope's tape is in use by a running op".into())),
            Err(_) if raising => Ok(false),
            Err(ended) => Err(errors::scope(
                py,
                format!("no_grad: its scope ended {ended}, inside the `with s.no_grad():` block; end the block first"),
            )),
        }
    }
}
