//! `tapir.Tensor`: an owned float32 or float64 array (`tapir::Tensor<T>`), copied once
//! from NumPy, and accepted wherever an array is a value: its data goes into the arena,
//! a store or an operand without passing through NumPy again.

use std::any::Any;

use numpy::{Element, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tapir::{Float, Tensor};

use crate::convert;
use crate::errors;
use crate::registry::DType;

/// A tensor of either element type.
enum Data {
    F32(Tensor<f32>),
    F64(Tensor<f64>),
}

/// An owned float32 or float64 array: `tapir.Tensor(array, dtype=None)` copies `array`
/// once. Use it wherever an array is a value (`s.leaf`, `s.input`, operands,
/// `store.add`); it pickles, and `numpy()` gives NumPy a copy.
#[pyclass(frozen, module = "tapir", name = "Tensor")]
pub struct PyTensor {
    data: Data,
}

impl PyTensor {
    fn dtype_of(&self) -> DType {
        match self.data {
            Data::F32(_) => DType::F32,
            Data::F64(_) => DType::F64,
        }
    }

    fn dims(&self) -> Vec<usize> {
        match &self.data {
            Data::F32(t) => t.dims(),
            Data::F64(t) => t.dims(),
        }
    }

    /// The tensor, if its element type is `T`.
    fn get<T: Float>(&self) -> Option<&Tensor<T>> {
        let any: &dyn Any = match &self.data {
            Data::F32(t) => t,
            Data::F64(t) => t,
        };
        any.downcast_ref::<Tensor<T>>()
    }
}

/// Calls `f` with the elements (row-major) and dimensions of `obj`: a `tapir.Tensor`'s own
/// data, uncopied, or an array, list or number as [`convert::with_array`] reads it. A
/// Tensor of the other dtype is a `DTypeError`, as an array's is.
pub(crate) fn with_data<T: Float + Element, R>(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    want: DType,
    what: &str,
    f: impl FnOnce(&[T], &[usize]) -> PyResult<R>,
) -> PyResult<R> {
    let Ok(t) = obj.cast::<PyTensor>() else {
        return convert::with_array(py, obj, want, what, f);
    };
    let t = t.get();
    match t.get::<T>() {
        Some(t) => f(t.data(), &t.dims()),
        None => Err(errors::dtype(
            py,
            format!(
                "{what}: a {} Tensor given to a {} graph (one dtype per graph); convert with tapir.Tensor(t, dtype=\"{}\")",
                t.dtype_of().name(),
                want.name(),
                want.name()
            ),
        )),
    }
}

/// `Tensor<T>` copied from `arr`, whose dtype is `T`'s.
fn copied<T: Float + Element>(py: Python<'_>, arr: &Bound<'_, PyAny>, dtype: DType) -> PyResult<Tensor<T>> {
    convert::with_array::<T, _>(py, arr, dtype, "Tensor", |d, dims| {
        Tensor::from_slice(d, dims).map_err(|e| errors::engine(py, &e))
    })
}

/// `t`'s elements converted to `U`.
fn converted<T: Float, U: Float>(py: Python<'_>, t: &Tensor<T>) -> PyResult<Tensor<U>> {
    let mut data = Vec::new();
    if data.try_reserve_exact(t.numel()).is_err() {
        let msg = format!("Tensor: out of memory converting a tensor of shape {}", t.shape());
        return Err(errors::raise(py, "TapirMemoryError", msg));
    }
    data.extend(t.data().iter().map(|v| U::from_f64(v.to_f64())));
    Tensor::from_vec(data, &t.dims()).map_err(|e| errors::engine(py, &e))
}

#[pymethods]
impl PyTensor {
    /// A copy of `data` (an array, a nested list, a number or a Tensor) as a float32 or
    /// float64 tensor. `dtype=None` keeps a float32 or float64 array's dtype and makes
    /// integers and Python numbers float64, as NumPy does; a `dtype` converts any real
    /// numbers. bool, complex and object data are a `DTypeError`.
    #[new]
    #[pyo3(signature = (data, dtype=None))]
    fn new(py: Python<'_>, data: &Bound<'_, PyAny>, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Self> {
        let dtype = dtype.map(|d| convert::parse_dtype(py, d, "Tensor")).transpose()?;
        if let Ok(t) = data.cast::<PyTensor>() {
            let t = t.get();
            let data = match (&t.data, dtype.unwrap_or(t.dtype_of())) {
                (Data::F32(x), DType::F32) => Data::F32(converted(py, x)?),
                (Data::F32(x), DType::F64) => Data::F64(converted(py, x)?),
                (Data::F64(x), DType::F32) => Data::F32(converted(py, x)?),
                (Data::F64(x), DType::F64) => Data::F64(converted(py, x)?),
            };
            return Ok(PyTensor { data });
        }
        let np = py.import("numpy")?;
        let arr = np.call_method1("asarray", (data,))?.cast_into::<PyUntypedArray>().map_err(PyErr::from)?;
        let name = arr.dtype().to_string();
        let kind: String = arr.dtype().getattr("kind")?.extract()?;
        let target = match (dtype, name.as_str(), kind.as_str()) {
            (_, _, k) if !matches!(k, "f" | "i" | "u") => {
                return Err(errors::dtype(py, format!("Tensor: {name} values are not real numbers")));
            }
            (Some(d), _, _) => d,
            (None, "float32", _) => DType::F32,
            (None, "float64", _) | (None, _, "i" | "u") => DType::F64,
            (None, other, _) => {
                return Err(errors::dtype(
                    py,
                    format!("Tensor: a {other} array; pass dtype=\"float32\" or dtype=\"float64\" to convert it"),
                ));
            }
        };
        let arr = if name == target.name() { arr.into_any() } else { arr.call_method1("astype", (target.name(),))? };
        let data = match target {
            DType::F32 => Data::F32(copied(py, &arr, target)?),
            DType::F64 => Data::F64(copied(py, &arr, target)?),
        };
        Ok(PyTensor { data })
    }

    /// The dimensions, as a tuple.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.dims())
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.dims().len()
    }

    /// `"float32"` or `"float64"`.
    #[getter]
    fn dtype(&self) -> &'static str {
        self.dtype_of().name()
    }

    /// Length of the first axis (a 0-d tensor has none: `TypeError`, as NumPy).
    fn __len__(&self) -> PyResult<usize> {
        match self.dims().first() {
            Some(&n) => Ok(n),
            None => Err(pyo3::exceptions::PyTypeError::new_err("len() of a 0-d Tensor")),
        }
    }

    /// The values, as a new NumPy array.
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        Ok(match &self.data {
            Data::F32(t) => convert::to_numpy(py, t.data(), &t.dims())?.into_any(),
            Data::F64(t) => convert::to_numpy(py, t.data(), &t.dims())?.into_any(),
        })
    }

    /// NumPy's conversion protocol: `numpy.asarray(t)` copies the values (`copy=False`
    /// is a `ValueError`: NumPy cannot share a Tensor's memory).
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        &self,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            return Err(pyo3::exceptions::PyValueError::new_err(
                "a tapir.Tensor cannot be viewed without a copy; use copy=None or True",
            ));
        }
        let a = self.numpy(py)?;
        match dtype {
            Some(d) => a.call_method1("astype", (d,)),
            None => Ok(a),
        }
    }

    /// The value of a one-element tensor, as a Python float.
    fn item(&self, py: Python<'_>) -> PyResult<f64> {
        match &self.data {
            Data::F32(t) => t.item().map(f64::from),
            Data::F64(t) => t.item(),
        }
        .map_err(|e| errors::engine(py, &e))
    }

    fn __repr__(&self, py: Python<'_>) -> PyResult<String> {
        let prefix = "tapir.Tensor(";
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("separator", ", ")?;
        kw.set_item("prefix", prefix)?;
        let body: String =
            py.import("numpy")?.getattr("array2string")?.call((self.numpy(py)?,), Some(&kw))?.extract()?;
        Ok(format!("{prefix}{body}, dtype={})", self.dtype()))
    }

    /// Pickling: the class and the values as a NumPy array (dtype, shape and exact bits).
    fn __reduce__<'py>(slf: &Bound<'py, Self>, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        let values = slf.get().numpy(py)?;
        PyTuple::new(py, [slf.get_type().into_any(), PyTuple::new(py, [values])?.into_any()])
    }
}
