//! `tapir.ParamStore`, `tapir.GradBuffer` and the optimizers. A store lent to an open scope
//! (`s.param(store, name)`) cannot change until that scope ends: the run-time twin of the
//! borrow checker's rule that keeps an optimizer from changing what a live graph reads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use tapir::{Float, GradBuffer, ParamId, ParamStore, Tensor};
use tapir_nn::optim::{Adam, AdamW, Optimizer, Sgd};

use crate::convert;
use crate::errors;
use crate::registry::DType;
use crate::tensor;

/// A store of either element type. Shared with the sessions whose open scopes read it
/// (`tapir::Session::with_param` holds a clone until the scope ends), so it changes only
/// through `Arc::get_mut`, which fails while a scope reads it.
pub(crate) enum Store {
    F32(Arc<ParamStore<f32>>),
    F64(Arc<ParamStore<f64>>),
}

/// A gradient buffer of either element type, or where it is while a scope holds it.
pub(crate) enum Grads {
    F32(GradBuffer<f32>),
    F64(GradBuffer<f64>),
    /// Lent to the scope opened at this Python `file:line` by `s.backward_into`, which
    /// writes the gradients straight into it; back when that scope ends.
    Lent(String),
}

impl Grads {
    /// `ScopeError` if the buffer is lent to an open scope.
    pub(crate) fn check_here(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        match self {
            Grads::Lent(at) => Err(errors::scope(
                py,
                format!("{what}: the gradient buffer is lent to the scope opened at {at} by backward_into; use it after that scope's `with` block"),
            )),
            _ => Ok(()),
        }
    }
}

/// The store to change, or `ScopeError` if an open scope still reads it.
fn unique<'a, T: Float>(py: Python<'_>, s: &'a mut Arc<ParamStore<T>>, what: &str) -> PyResult<&'a mut ParamStore<T>> {
    Arc::get_mut(s).ok_or_else(|| {
        errors::scope(
            py,
            format!("{what}: the parameters are borrowed by an open scope; change them after its `with` block"),
        )
    })
}

/// Named parameters that survive scopes: `store.add("w", array)`, `s.param(store, "w")`.
#[pyclass(module = "tapir", name = "ParamStore")]
pub struct PyParamStore {
    pub(crate) store: Store,
    /// Set while an open scope reads the store, with where that scope was opened.
    lent: Option<(Arc<AtomicBool>, String)>,
}

impl PyParamStore {
    pub(crate) fn kind(&self) -> DType {
        match self.store {
            Store::F32(_) => DType::F32,
            Store::F64(_) => DType::F64,
        }
    }

    pub(crate) fn id_of(&self, py: Python<'_>, name: &str) -> PyResult<ParamId> {
        let found = match &self.store {
            Store::F32(s) => s.find(name),
            Store::F64(s) => s.find(name),
        };
        found.ok_or_else(|| errors::raise(py, "ParamError", format!("no parameter named {name:?} in this store")))
    }

    /// Marks the store as read by the open scope whose flag this is.
    pub(crate) fn lend(&mut self, (flag, opened_at): (Arc<AtomicBool>, String)) {
        self.lent = Some((flag, opened_at));
    }

    /// `ScopeError` if an open scope reads the store.
    pub(crate) fn check_free(&self, py: Python<'_>, what: &str) -> PyResult<()> {
        match &self.lent {
            Some((flag, at)) if flag.load(Ordering::Acquire) => Err(errors::scope(
                py,
                format!("{what}: the parameters are borrowed by the scope opened at {at}; change them after its `with` block"),
            )),
            _ => Ok(()),
        }
    }

    fn names(&self) -> Vec<String> {
        match &self.store {
            Store::F32(s) => s.iter().map(|(_, n, _)| n.to_string()).collect(),
            Store::F64(s) => s.iter().map(|(_, n, _)| n.to_string()).collect(),
        }
    }
}

fn add_to<T: Float + numpy::Element>(
    py: Python<'_>,
    s: &mut ParamStore<T>,
    dtype: DType,
    name: &str,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let t = tensor::with_data::<T, _>(py, value, dtype, "ParamStore.add", |d, dims| {
        Tensor::from_vec(d.to_vec(), dims).map_err(|e| errors::engine(py, &e))
    })?;
    s.add(name, t).map(|_| ()).map_err(|e| errors::engine(py, &e))
}

fn set_in<T: Float + numpy::Element>(
    py: Python<'_>,
    s: &mut ParamStore<T>,
    id: ParamId,
    dtype: DType,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let t = s.get_mut(id).map_err(|e| errors::engine(py, &e))?;
    let shape = t.shape();
    tensor::with_data::<T, _>(py, value, dtype, "ParamStore.__setitem__", |d, dims| {
        if dims != shape.to_vec().as_slice() {
            return Err(errors::raise(
                py,
                "ShapeError",
                format!("ParamStore.__setitem__: a value of shape {dims:?} for a parameter of shape {shape}"),
            ));
        }
        t.data_mut().copy_from_slice(d);
        Ok(())
    })
}

#[pymethods]
impl PyParamStore {
    /// An empty store of `dtype` (`"float32"` by default).
    #[new]
    #[pyo3(signature = (dtype=None))]
    fn new(py: Python<'_>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let store = match dtype.map(|d| convert::parse_dtype(py, d, "ParamStore")).transpose()?.unwrap_or(DType::F32) {
            DType::F32 => Store::F32(Arc::default()),
            DType::F64 => Store::F64(Arc::default()),
        };
        Ok(PyParamStore { store, lent: None })
    }

    /// Adds parameter `name` with a copy of `value` (an array of the store's dtype).
    fn add(&mut self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_free(py, "ParamStore.add")?;
        let dtype = self.kind();
        match &mut self.store {
            Store::F32(s) => add_to(py, unique(py, s, "ParamStore.add")?, dtype, name, value),
            Store::F64(s) => add_to(py, unique(py, s, "ParamStore.add")?, dtype, name, value),
        }
    }

    /// A copy of parameter `name`'s value.
    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let id = self.id_of(py, name)?;
        match &self.store {
            Store::F32(s) => {
                let t = s.get(id).map_err(|e| errors::engine(py, &e))?;
                Ok(convert::to_numpy(py, t.data(), &t.shape().to_vec())?.into_any())
            }
            Store::F64(s) => {
                let t = s.get(id).map_err(|e| errors::engine(py, &e))?;
                Ok(convert::to_numpy(py, t.data(), &t.shape().to_vec())?.into_any())
            }
        }
    }

    /// Overwrites parameter `name` with `value` (same shape and dtype).
    fn __setitem__(&mut self, py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_free(py, "ParamStore.__setitem__")?;
        let (id, dtype) = (self.id_of(py, name)?, self.kind());
        match &mut self.store {
            Store::F32(s) => set_in(py, unique(py, s, "ParamStore.__setitem__")?, id, dtype, value),
            Store::F64(s) => set_in(py, unique(py, s, "ParamStore.__setitem__")?, id, dtype, value),
        }
    }

    fn __contains__(&self, name: &str) -> bool {
        match &self.store {
            Store::F32(s) => s.find(name).is_some(),
            Store::F64(s) => s.find(name).is_some(),
        }
    }

    fn __len__(&self) -> usize {
        match &self.store {
            Store::F32(s) => s.len(),
            Store::F64(s) => s.len(),
        }
    }

    /// The parameters' names, in the order they were added.
    fn keys(&self) -> Vec<String> {
        self.names()
    }

    /// Elements over all parameters.
    fn numel(&self) -> usize {
        match &self.store {
            Store::F32(s) => s.numel(),
            Store::F64(s) => s.numel(),
        }
    }

    /// `"float32"` or `"float64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.kind().name()
    }

    /// A zeroed gradient buffer for this store (allocate once, `zero()` each step).
    fn zeros_like(&self, py: Python<'_>) -> PyResult<PyGradBuffer> {
        let grads = match &self.store {
            Store::F32(s) => Grads::F32(s.zeros_like().map_err(|e| errors::engine(py, &e))?),
            Store::F64(s) => Grads::F64(s.zeros_like().map_err(|e| errors::engine(py, &e))?),
        };
        Ok(PyGradBuffer { grads, names: self.names() })
    }

    /// The store in the safetensors format (what `safetensors.numpy.load` and PyTorch read).
    fn to_bytes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyBytes>> {
        let bytes = match &self.store {
            Store::F32(s) => tapir_nn::io::to_bytes(s),
            Store::F64(s) => tapir_nn::io::to_bytes(s),
        }
        .map_err(|e| errors::engine(py, &e))?;
        Ok(pyo3::types::PyBytes::new(py, &bytes))
    }

    /// Loads values saved by `to_bytes` (or any safetensors file with these names and
    /// shapes); on error the store is unchanged.
    fn load_bytes(&mut self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        self.check_free(py, "ParamStore.load_bytes")?;
        match &mut self.store {
            Store::F32(s) => tapir_nn::io::load_bytes(unique(py, s, "ParamStore.load_bytes")?, data),
            Store::F64(s) => tapir_nn::io::load_bytes(unique(py, s, "ParamStore.load_bytes")?, data),
        }
        .map_err(|e| errors::engine(py, &e))
    }

    /// Pickling: the class, the dtype and the `(name, values)` pairs in the order the
    /// names were added, each value a NumPy array (exact bits). A store an open scope
    /// reads pickles too: this only reads it.
    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let me = slf.borrow();
        let items = me
            .names()
            .into_iter()
            .map(|n| {
                let value = me.__getitem__(py, &n)?;
                PyTuple::new(py, [n.into_pyobject(py)?.into_any(), value])
            })
            .collect::<PyResult<Vec<_>>>()?;
        let args = PyTuple::new(py, [me.kind().name()])?;
        PyTuple::new(py, [slf.get_type().into_any(), args.into_any(), PyList::new(py, items)?.into_any()])
    }

    /// Unpickling: replaces every parameter by `state`'s `(name, values)` pairs, all or
    /// nothing. `ScopeError` while an open scope reads the store. The result is a new
    /// store: gradient buffers and optimizers made for the old one do not fit it.
    fn __setstate__(&mut self, py: Python<'_>, state: Vec<(String, Bound<'_, PyAny>)>) -> PyResult<()> {
        self.check_free(py, "ParamStore.__setstate__")?;
        let dtype = self.kind();
        self.store = match dtype {
            DType::F32 => {
                let mut s = ParamStore::new();
                for (name, value) in &state {
                    add_to(py, &mut s, dtype, name, value)?;
                }
                Store::F32(Arc::new(s))
            }
            DType::F64 => {
                let mut s = ParamStore::new();
                for (name, value) in &state {
                    add_to(py, &mut s, dtype, name, value)?;
                }
                Store::F64(Arc::new(s))
            }
        };
        Ok(())
    }

    fn __repr__(&self) -> String {
        format!("tapir.ParamStore({} parameters, {} elements, {})", self.__len__(), self.numel(), self.kind().name())
    }
}

/// Gradients of a store's parameters, owned by the caller (`store.zeros_like()`).
#[pyclass(module = "tapir", name = "GradBuffer")]
pub struct PyGradBuffer {
    pub(crate) grads: Grads,
    names: Vec<String>,
}

#[pymethods]
impl PyGradBuffer {
    /// Sets every gradient to zero. `ScopeError` while lent to an open scope.
    fn zero(&mut self, py: Python<'_>) -> PyResult<()> {
        match &mut self.grads {
            Grads::F32(g) => g.zero(),
            Grads::F64(g) => g.zero(),
            Grads::Lent(_) => self.grads.check_here(py, "GradBuffer.zero")?,
        }
        Ok(())
    }

    /// A copy of the gradient of parameter `name`.
    fn __getitem__<'py>(&self, py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
        let k = self
            .names
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| errors::raise(py, "ParamError", format!("no parameter named {name:?}")))?;
        match &self.grads {
            Grads::F32(g) => {
                let (_, v) = g.iter().nth(k).ok_or_else(|| errors::raise(py, "ParamError", name.to_string()))?;
                Ok(convert::to_numpy(py, v.data(), &v.shape().to_vec())?.into_any())
            }
            Grads::F64(g) => {
                let (_, v) = g.iter().nth(k).ok_or_else(|| errors::raise(py, "ParamError", name.to_string()))?;
                Ok(convert::to_numpy(py, v.data(), &v.shape().to_vec())?.into_any())
            }
            Grads::Lent(_) => self.grads.check_here(py, "GradBuffer.__getitem__").map(|()| py.None().into_bound(py)),
        }
    }
}

/// An optimizer of either element type.
enum Opt {
    F32(Box<dyn Optimizer<f32> + Send + Sync>),
    F64(Box<dyn Optimizer<f64> + Send + Sync>),
}

/// An optimizer: `opt.step(store, grads)` updates `store` from `grads`.
#[pyclass(module = "tapir", name = "Optimizer", subclass)]
pub struct PyOptimizer {
    opt: Opt,
}

fn make<'a>(
    py: Python<'_>,
    store: &PyParamStore,
    f32: impl FnOnce(&ParamStore<f32>) -> tapir::Result<Box<dyn Optimizer<f32> + Send + Sync + 'a>>,
    f64: impl FnOnce(&ParamStore<f64>) -> tapir::Result<Box<dyn Optimizer<f64> + Send + Sync + 'a>>,
) -> PyResult<PyOptimizer>
where
    'a: 'static,
{
    let opt = match &store.store {
        Store::F32(s) => Opt::F32(f32(s).map_err(|e| errors::engine(py, &e))?),
        Store::F64(s) => Opt::F64(f64(s).map_err(|e| errors::engine(py, &e))?),
    };
    Ok(PyOptimizer { opt })
}

#[pymethods]
impl PyOptimizer {
    /// One update of every parameter of `store` from `grads`. `ScopeError` while an open
    /// scope reads `store`.
    fn step(
        &mut self,
        py: Python<'_>,
        store: &Bound<'_, PyParamStore>,
        grads: &Bound<'_, PyGradBuffer>,
    ) -> PyResult<()> {
        let mut st = store.borrow_mut();
        st.check_free(py, "step")?;
        let g = grads.borrow();
        g.grads.check_here(py, "step")?;
        match (&mut self.opt, &mut st.store, &g.grads) {
            (Opt::F32(o), Store::F32(s), Grads::F32(g)) => o.step(unique(py, s, "step")?, g),
            (Opt::F64(o), Store::F64(s), Grads::F64(g)) => o.step(unique(py, s, "step")?, g),
            _ => return Err(errors::dtype(py, "step: optimizer, store and gradients must share one dtype".into())),
        }
        .map_err(|e| errors::engine(py, &e))
    }

    /// The learning rate of the next step.
    #[getter]
    fn lr(&self) -> f64 {
        match &self.opt {
            Opt::F32(o) => o.lr(),
            Opt::F64(o) => o.lr(),
        }
    }

    #[setter]
    fn set_lr(&mut self, lr: f64) {
        match &mut self.opt {
            Opt::F32(o) => o.set_lr(lr),
            Opt::F64(o) => o.set_lr(lr),
        }
    }
}

/// Stochastic gradient descent, with optional momentum (Nesterov's if `nesterov`) and
/// weight decay, as `torch.optim.SGD`.
#[pyfunction]
#[pyo3(name = "SGD", signature = (store, lr, momentum=0.0, nesterov=false, weight_decay=0.0))]
pub fn sgd(
    py: Python<'_>,
    store: &Bound<'_, PyParamStore>,
    lr: f64,
    momentum: f64,
    nesterov: bool,
    weight_decay: f64,
) -> PyResult<PyOptimizer> {
    let st = store.borrow();
    make(
        py,
        &st,
        |s| Ok(Box::new(Sgd::new(s, lr)?.momentum(momentum, nesterov)?.weight_decay(weight_decay)?)),
        |s| Ok(Box::new(Sgd::new(s, lr)?.momentum(momentum, nesterov)?.weight_decay(weight_decay)?)),
    )
}

/// Adam, as `torch.optim.Adam` (L2 weight decay added to the gradient).
#[pyfunction]
#[pyo3(name = "Adam", signature = (store, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0))]
pub fn adam(
    py: Python<'_>,
    store: &Bound<'_, PyParamStore>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
) -> PyResult<PyOptimizer> {
    let st = store.borrow();
    make(
        py,
        &st,
        |s| Ok(Box::new(Adam::new(s, lr)?.betas(betas.0, betas.1)?.eps(eps)?.weight_decay(weight_decay)?)),
        |s| Ok(Box::new(Adam::new(s, lr)?.betas(betas.0, betas.1)?.eps(eps)?.weight_decay(weight_decay)?)),
    )
}

/// AdamW (decoupled weight decay), as `torch.optim.AdamW`.
#[pyfunction]
#[pyo3(name = "AdamW", signature = (store, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01))]
pub fn adamw(
    py: Python<'_>,
    store: &Bound<'_, PyParamStore>,
    lr: f64,
    betas: (f64, f64),
    eps: f64,
    weight_decay: f64,
) -> PyResult<PyOptimizer> {
    let st = store.borrow();
    make(
        py,
        &st,
        |s| Ok(Box::new(AdamW::new(s, lr, weight_decay)?.betas(betas.0, betas.1)?.eps(eps)?)),
        |s| Ok(Box::new(AdamW::new(s, lr, weight_decay)?.betas(betas.0, betas.1)?.eps(eps)?)),
    )
}

/// Scales `grads` so that their global L2 norm is at most `max_norm`; returns the norm
/// before clipping (`torch.nn.utils.clip_grad_norm_`).
#[pyfunction]
pub fn clip_grad_norm(
    py: Python<'_>,
    store: &Bound<'_, PyParamStore>,
    grads: &Bound<'_, PyGradBuffer>,
    max_norm: f64,
) -> PyResult<f64> {
    let st = store.borrow();
    let mut g = grads.borrow_mut();
    g.grads.check_here(py, "clip_grad_norm")?;
    match (&st.store, &mut g.grads) {
        (Store::F32(s), Grads::F32(g)) => tapir_nn::optim::clip_grad_norm(s, g, max_norm),
        (Store::F64(s), Grads::F64(g)) => tapir_nn::optim::clip_grad_norm(s, g, max_norm),
        _ => return Err(errors::dtype(py, "clip_grad_norm: store and gradients must share one dtype".into())),
    }
    .map_err(|e| errors::engine(py, &e))
}
