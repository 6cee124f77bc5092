//! `tapir.Var`: a handle to a node of an open scope, checked at every use.

use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt};
use tapir::{Float, Scope, Var};

use crate::convert;
use crate::errors;
use crate::registry::{self, on_scope, DType, Entry, Meta, Missing};
use crate::tensor;

/// A handle to a value recorded in a scope: `x + y`, `x @ w`, `x.tanh()`, `x.sum(axis=1)`.
///
/// It holds only numbers (its graph, its scope's number, its node's index), so keeping one
/// keeps no graph memory alive. Using it after its scope ended, in another graph's scope,
/// or from another thread raises `tapir.ScopeError`.
#[pyclass(frozen, module = "tapir", name = "Var")]
pub struct PyVar {
    pub(crate) slot: u32,
    pub(crate) serial: u64,
    pub(crate) scope: u64,
    pub(crate) index: u32,
    pub(crate) thread: u64,
    pub(crate) dtype: DType,
    pub(crate) meta: Meta,
}

/// A handle's name in messages: `Var #3 (tanh, shape [2, 3])`.
pub(crate) fn describe(index: u32, meta: &Meta) -> String {
    format!("Var #{index} ({}, shape {})", meta.op, meta.shape)
}

impl PyVar {
    /// Runs `f` on this handle's entry after checking thread, graph and scope.
    pub(crate) fn run<R>(&self, py: Python<'_>, f: impl FnOnce(&Entry) -> PyResult<R>) -> PyResult<R> {
        if self.thread != registry::thread() {
            return Err(errors::scope(
                py,
                format!("{} was made on another thread; a scope is used by the thread that opened it", self.name()),
            ));
        }
        registry::with(self.slot, self.serial, |e| {
            self.check_scope(py, e)?;
            f(e)
        })
        .map_err(|m| self.missing(py, m))?
    }

    pub(crate) fn name(&self) -> String {
        describe(self.index, &self.meta)
    }

    fn missing(&self, py: Python<'_>, m: Missing) -> PyErr {
        match m {
            Missing::Gone => errors::scope(py, format!("{} used after its graph was dropped", self.name())),
            Missing::Busy => {
                errors::scope(py, format!("{} used while its graph is being opened or closed", self.name()))
            }
        }
    }

    fn check_scope(&self, py: Python<'_>, e: &Entry) -> PyResult<()> {
        if e.scope_number() == self.scope && e.is_open() {
            return Ok(());
        }
        let ended = if e.ended == self.scope {
            format!("at {} (scope {} of its graph)", e.ended_at, self.scope)
        } else {
            format!("(scope {} of its graph; the graph is on scope {})", self.scope, e.scope_number())
        };
        Err(errors::scope(py, format!("{} used after its scope ended {ended}", self.name())))
    }

    /// This handle in `s`, which is its own open scope (checked by `run`).
    pub(crate) fn get<'s, T: Float>(&self, py: Python<'_>, s: &'s Scope<'s, 'static, T>) -> PyResult<Var<'s, T>> {
        s.var_at(self.index as usize)
            .ok_or_else(|| errors::scope(py, format!("{} is not on its scope's tape", self.name())))
    }

    /// `other` in this handle's scope: a handle of the same scope, or a value.
    pub(crate) fn operand<'s, T: Float + numpy::Element>(
        &self,
        py: Python<'_>,
        s: &'s Scope<'s, 'static, T>,
        other: &Bound<'_, PyAny>,
        op: &str,
    ) -> PyResult<Var<'s, T>> {
        if let Ok(o) = other.cast::<PyVar>() {
            let o = o.get();
            if o.slot != self.slot || o.serial != self.serial {
                return Err(errors::scope(
                    py,
                    format!("{op}: {} belongs to another graph than {}", o.name(), self.name()),
                ));
            }
            if o.scope != self.scope || o.thread != self.thread {
                return Err(errors::scope(
                    py,
                    format!("{op}: {} belongs to scope {}, not {}", o.name(), o.scope, self.scope),
                ));
            }
            return o.get(py, s);
        }
        if other.is_instance_of::<PyFloat>()
            || (other.is_instance_of::<PyInt>() && !other.is_instance_of::<pyo3::types::PyBool>())
        {
            let v: f64 = other.extract()?;
            return Ok(s.scalar(T::from_f64(v)));
        }
        tensor::with_data(py, other, self.dtype, op, |data: &[T], dims| Ok(s.tensor(data, dims)))
    }
}

/// The Python handle of `v`, or the scope's error if `v` is poisoned (the op failed):
/// raised at the op's call, so the traceback points at the user's line.
pub(crate) fn finish<T: Float>(
    py: Python<'_>,
    e: &Entry,
    slot: u32,
    v: Var<'_, T>,
    op: &'static str,
) -> PyResult<PyVar> {
    if v.index() == u32::MAX as usize {
        let err = v.value().err().unwrap_or(tapir::Error::InvalidArgument {
            op,
            detail: "the op failed".into(),
            location: std::panic::Location::caller(),
        });
        return Err(errors::engine(py, &err));
    }
    Ok(PyVar {
        slot,
        serial: e.serial,
        scope: e.scope_number(),
        index: v.index() as u32,
        thread: registry::thread(),
        dtype: e.dtype(),
        meta: Meta { op, shape: v.shape() },
    })
}

/// Records `$body` (with `$x` this handle in scope `$s`, element type `$T`) and returns
/// the new handle named `$op`.
macro_rules! record {
    ($self:ident, $py:ident, $op:expr, |$s:ident, $x:ident, $T:ident| $body:expr) => {
        $self.run($py, |e| {
            on_scope!(e, |$s, $T| {
                let $x = $self.get($py, $s)?;
                let out = $body;
                finish($py, e, $self.slot, out, $op)
            })
            .unwrap_or_else(|| Err(errors::scope($py, "no scope is open".into())))
        })
    };
}
pub(crate) use record;

#[pymethods]
impl PyVar {
    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "add", |s, x, T| x + self.operand(py, s, other, "add")?)
    }
    fn __radd__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "add", |s, x, T| self.operand(py, s, other, "add")? + x)
    }
    fn __sub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "sub", |s, x, T| x - self.operand(py, s, other, "sub")?)
    }
    fn __rsub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "sub", |s, x, T| self.operand(py, s, other, "sub")? - x)
    }
    fn __mul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "mul", |s, x, T| x * self.operand(py, s, other, "mul")?)
    }
    fn __rmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "mul", |s, x, T| self.operand(py, s, other, "mul")? * x)
    }
    fn __truediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "div", |s, x, T| x / self.operand(py, s, other, "div")?)
    }
    fn __rtruediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "div", |s, x, T| self.operand(py, s, other, "div")? / x)
    }
    pub(crate) fn __matmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "matmul", |s, x, T| x.matmul(self.operand(py, s, other, "matmul")?))
    }
    fn __rmatmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "matmul", |s, x, T| self.operand(py, s, other, "matmul")?.matmul(x))
    }
    /// `x ** p`: a number `p` is `powf` (its derivative `p·xᵖ⁻¹`), a handle `pow`.
    pub(crate) fn __pow__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyVar> {
        let _ = modulo;
        if other.is_instance_of::<PyFloat>() || other.is_instance_of::<PyInt>() {
            let p: f64 = other.extract()?;
            return record!(self, py, "powf", |s, x, T| x.powf(T::from_f64(p)));
        }
        record!(self, py, "pow", |s, x, T| x.pow(self.operand(py, s, other, "pow")?))
    }
    fn __rpow__(&self, py: Python<'_>, other: &Bound<'_, PyAny>, modulo: Option<&Bound<'_, PyAny>>) -> PyResult<PyVar> {
        let _ = modulo;
        record!(self, py, "pow", |s, x, T| self.operand(py, s, other, "pow")?.pow(x))
    }
    fn __neg__(&self, py: Python<'_>) -> PyResult<PyVar> {
        record!(self, py, "neg", |s, x, T| -x)
    }

    /// The dimensions, as a tuple (available after the scope ends too).
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyTuple>> {
        pyo3::types::PyTuple::new(py, self.meta.shape.to_vec())
    }
    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.meta.shape.rank()
    }
    /// `"float32"` or `"float64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype.name()
    }
    /// Length of the first axis (a 0-d handle has none: `TypeError`, as NumPy).
    fn __len__(&self) -> PyResult<usize> {
        match self.meta.shape.rank() {
            0 => Err(pyo3::exceptions::PyTypeError::new_err("len() of a 0-d Var")),
            _ => Ok(self.meta.shape.dim(0)),
        }
    }
    /// Whether a gradient flows to this value.
    #[getter]
    fn requires_grad(&self, py: Python<'_>) -> PyResult<bool> {
        self.run(py, |e| on_scope!(e, |s, T| Ok(self.get(py, s)?.requires_grad())).unwrap_or(Ok(false)))
    }
    /// The value, as a new NumPy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let dims = self.meta.shape.to_vec();
        self.run(py, |e| {
            on_scope!(e, |s, T| {
                let v = self.get(py, s)?.value().map_err(|err| errors::engine(py, &err))?;
                Ok(convert::to_numpy::<T>(py, v, &dims)?.into_any())
            })
            .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))
        })
    }
    /// NumPy's conversion protocol: `numpy.asarray(v)` copies the value.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let _ = copy;
        let a = self.numpy(py)?;
        match dtype {
            Some(d) => a.call_method1("astype", (d,)),
            None => Ok(a),
        }
    }
    /// The value of a one-element handle, as a Python float.
    fn item(&self, py: Python<'_>) -> PyResult<f64> {
        self.run(py, |e| {
            on_scope!(e, |s, T| self.get(py, s)?.item().map(|v| v.to_f64()).map_err(|err| errors::engine(py, &err)))
                .unwrap_or_else(|| Err(errors::scope(py, "no scope is open".into())))
        })
    }
    /// A one-element handle as a float; more elements: `TypeError`, as NumPy.
    fn __float__(&self, py: Python<'_>) -> PyResult<f64> {
        if self.meta.shape.numel() != 1 {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "only one-element values convert to float, not {}",
                self.name()
            )));
        }
        self.item(py)
    }
    /// `None`: NumPy's operators defer to `Var`'s reflected ones (`array + var` is a `Var`).
    #[classattr]
    fn __array_ufunc__(py: Python<'_>) -> Py<PyAny> {
        py.None()
    }
    /// Truth of a one-element handle; more elements: `ValueError`, as NumPy.
    fn __bool__(&self, py: Python<'_>) -> PyResult<bool> {
        if self.meta.shape.numel() != 1 {
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "the truth value of {} with more than one element is ambiguous",
                self.name()
            )));
        }
        Ok(self.item(py)? != 0.0)
    }
    /// `∂loss/∂self` after `Scope.backward`, as a new NumPy array; `None` if no gradient
    /// reached this value.
    #[getter]
    fn grad<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let dims = self.meta.shape.to_vec();
        self.run(py, |e| {
            on_scope!(e, |s, T| match self.get(py, s)?.grad() {
                Some(g) => Ok(Some(convert::to_numpy::<T>(py, g, &dims)?.into_any())),
                None => Ok(None),
            })
            .unwrap_or(Ok(None))
        })
    }
    fn __repr__(&self) -> String {
        format!("tapir.{} [{}]", self.name(), self.dtype.name())
    }
}
