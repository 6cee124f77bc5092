//! NumPy arrays in and out. In: one copy, never a view (a later write to the array cannot
//! change a value the tape reads); out: a new array NumPy owns, never a view of the arena
//! (which the next scope reuses).

use numpy::{Element, PyArray1, PyArrayDyn, PyArrayMethods, PyReadonlyArrayDyn, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;

use crate::errors;
use crate::registry::DType;

/// The dtype names NumPy reports, for messages.
fn dtype_name(arr: &Bound<'_, PyUntypedArray>) -> String {
    arr.dtype().to_string()
}

/// `obj` (an ndarray, a nested list, a Python number) as an array of `want`'s dtype:
/// arrays must have exactly that dtype (f32 and f64 do not mix: a `DTypeError` says how
/// to convert); lists and numbers are weak (NEP 50) and take it.
fn as_array<'py>(
    py: Python<'py>,
    obj: &Bound<'py, PyAny>,
    want: DType,
    what: &str,
) -> PyResult<Bound<'py, PyUntypedArray>> {
    let np = py.import("numpy")?;
    let arr = match obj.cast::<PyUntypedArray>() {
        Ok(a) => a.clone(),
        Err(_) => {
            if obj.is_instance_of::<pyo3::types::PyBool>() {
                return Err(errors::dtype(py, format!("{what}: a bool is not a float value")));
            }
            let a = np.call_method1("asarray", (obj,))?;
            let a = a.cast_into::<PyUntypedArray>().map_err(PyErr::from)?;
            let kind: String = a.dtype().getattr("kind")?.extract()?;
            if kind == "f" || kind == "i" || kind == "u" {
                np.call_method1("asarray", (obj, want.name()))?.cast_into::<PyUntypedArray>().map_err(PyErr::from)?
            } else {
                return Err(errors::dtype(py, format!("{what}: {} values are not floats", dtype_name(&a))));
            }
        }
    };
    let name = dtype_name(&arr);
    if name != want.name() {
        let hint = match name.as_str() {
            "float32" | "float64" => format!("; convert with .astype(numpy.{})", want.name()),
            _ => String::new(),
        };
        return Err(errors::dtype(
            py,
            format!("{what}: a {name} array given to a {} graph (one dtype per graph){hint}", want.name()),
        ));
    }
    Ok(arr)
}

/// Calls `f` with `obj`'s elements in row-major order and its dimensions, copying only if
/// the array is not C-contiguous (Fortran order, negative or other strides).
pub(crate) fn with_array<T: Element + Copy, R>(
    py: Python<'_>,
    obj: &Bound<'_, PyAny>,
    want: DType,
    what: &str,
    f: impl FnOnce(&[T], &[usize]) -> PyResult<R>,
) -> PyResult<R> {
    let arr = as_array(py, obj, want, what)?;
    let dims: Vec<usize> = arr.shape().to_vec();
    let arr: PyReadonlyArrayDyn<'_, T> = arr.extract()?;
    // `as_slice` also accepts Fortran order, whose memory order is not row-major.
    match arr.as_slice().ok().filter(|_| arr.is_c_contiguous()) {
        Some(data) => f(data, &dims),
        None => {
            // A broadcast view can stand for far more elements than it holds in memory.
            let n = arr.len();
            let mut data: Vec<T> = Vec::new();
            if n.checked_mul(std::mem::size_of::<T>()).is_none_or(|b| b > isize::MAX as usize)
                || data.try_reserve_exact(n).is_err()
            {
                let msg = format!("{what}: out of memory copying an array of shape {dims:?} ({n} elements)");
                return Err(errors::raise(py, "TapirMemoryError", msg));
            }
            data.extend(arr.as_array().iter().copied());
            f(&data, &dims)
        }
    }
}

/// A new NumPy array (owned by NumPy) holding `data` with dimensions `dims`.
pub(crate) fn to_numpy<'py, T: Element + Copy>(
    py: Python<'py>,
    data: &[T],
    dims: &[usize],
) -> PyResult<Bound<'py, PyArrayDyn<T>>> {
    PyArray1::from_slice(py, data).reshape(dims)
}

/// Integer labels or indices from an int32/int64 array, a list or a number; a negative
/// value or a float array is an error naming `what`.
pub(crate) fn indices(py: Python<'_>, obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<usize>> {
    let np = py.import("numpy")?;
    let arr = np.call_method1("asarray", (obj,))?.cast_into::<PyUntypedArray>().map_err(PyErr::from)?;
    let kind: String = arr.dtype().getattr("kind")?.extract()?;
    // `np.asarray([])` is float64: an empty list is an empty list of indices.
    let empty = arr.len() == 0 && arr.ndim() == 1;
    if kind != "i" && kind != "u" && !empty {
        return Err(errors::dtype(py, format!("{what}: indices must be integers, not {}", dtype_name(&arr))));
    }
    let arr = np.call_method1("asarray", (arr, "int64"))?;
    let arr: PyReadonlyArrayDyn<'_, i64> = arr.extract()?;
    arr.as_array()
        .iter()
        .map(|&i| {
            usize::try_from(i).map_err(|_| errors::raise(py, "TapirIndexError", format!("{what}: negative index {i}")))
        })
        .collect()
}

/// The dtype of `what` (a graph, a store, a tensor) named by a string (`"float32"`, `"f64"`) or anything `numpy.dtype` accepts.
pub(crate) fn parse_dtype(py: Python<'_>, dtype: &Bound<'_, PyAny>, what: &str) -> PyResult<DType> {
    let name: String = match dtype.extract::<String>() {
        Ok(s) => s,
        Err(_) => py.import("numpy")?.getattr("dtype")?.call1((dtype,))?.str()?.extract()?,
    };
    match name.as_str() {
        "float32" | "f32" => Ok(DType::F32),
        "float64" | "f64" => Ok(DType::F64),
        other => Err(errors::dtype(py, format!("{what}: holds float32 or float64 values, not {other}"))),
    }
}
