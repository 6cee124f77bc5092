//! Errors: the engine's `tapir::Error` mapped onto `tapir.TapirError`'s subclasses, each
//! also a subclass of the matching built-in (`ShapeError(ValueError)`, ...), and the
//! binding's own `ScopeError` and dtype `TypeError`s. The classes are defined in Python
//! (`tapir/_errors.py`, for multiple inheritance) and looked up only when raising.

use pyo3::prelude::*;
use pyo3::types::PyType;
use tapir::ErrorClass;

/// An exception of class `name` of `tapir._errors` with `msg`.
pub(crate) fn raise(py: Python<'_>, name: &str, msg: String) -> PyErr {
    let class = py.import("tapir._errors").and_then(|m| m.getattr(name)).and_then(|c| Ok(c.cast_into::<PyType>()?));
    match class {
        Ok(class) => PyErr::from_type(class, (msg,)),
        Err(e) => e,
    }
}

/// `ScopeError` (a `RuntimeError`) with `msg` and the caller's `file:line`.
pub(crate) fn scope(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "ScopeError", format!("{msg} (at {})", caller(py)))
}

/// `DTypeError` (a `TypeError`) with `msg`.
pub(crate) fn dtype(py: Python<'_>, msg: String) -> PyErr {
    raise(py, "DTypeError", msg)
}

/// The Python class of an engine error (an exhaustive match over the engine's classes).
fn class_of(e: &tapir::Error) -> &'static str {
    match e.class() {
        ErrorClass::Shape => "ShapeError",
        ErrorClass::Index => "TapirIndexError",
        ErrorClass::Gradient => "GradientError",
        ErrorClass::Unsupported => "UnsupportedError",
        ErrorClass::ArenaLimit => "ArenaLimitError",
        ErrorClass::Memory => "TapirMemoryError",
        ErrorClass::Param => "ParamError",
        ErrorClass::NonFinite => "NonFiniteError",
        ErrorClass::Argument => "ArgumentError",
        ErrorClass::Callback => "CallbackError",
        ErrorClass::Io => "TapirIOError",
    }
}

/// The engine's error as a Python exception, its Rust location (inside this binding)
/// replaced by the Python caller's `file:line`.
pub(crate) fn engine(py: Python<'_>, e: &tapir::Error) -> PyErr {
    raise(py, class_of(e), located(py, e))
}

/// `e` with the op name `from` that opens its message (the engine's name of an op's
/// general form, `conv2d_with`) replaced by `to`, the Python method called (`conv2d`), so
/// that the message names what the caller wrote; an error that does not open with `from`
/// is returned as it is.
pub(crate) fn renamed(py: Python<'_>, e: PyErr, from: &str, to: &str) -> PyErr {
    let Ok(msg) = e.value(py).str() else { return e };
    match msg.to_string().strip_prefix(&format!("{from}: ")) {
        Some(rest) => PyErr::from_type(e.get_type(py), (format!("{to}: {rest}"),)),
        None => e,
    }
}

/// The message of `e` with the Python caller's location.
pub(crate) fn located(py: Python<'_>, e: &tapir::Error) -> String {
    let msg = e.to_string();
    match e.location() {
        Some(loc) => msg.replace(&format!("(at {loc})"), &format!("(at {})", caller(py))),
        None => msg,
    }
}

/// `file:line` of the innermost Python frame outside the `tapir` package: the user's line.
/// Looked up only when an error is raised or a scope opens or closes.
pub(crate) fn caller(py: Python<'_>) -> String {
    let here = || -> PyResult<String> {
        let package = py.import("tapir")?.getattr("__file__")?.extract::<String>()?;
        let package = package.rsplit_once('/').map_or(package.clone(), |(dir, _)| dir.to_string());
        let mut frame = py.import("sys")?.call_method1("_getframe", (0,))?;
        let mut fallback = None;
        loop {
            let code = frame.getattr("f_code")?;
            let file: String = code.getattr("co_filename")?.extract()?;
            let line: u32 = frame.getattr("f_lineno")?.extract().unwrap_or(0);
            if fallback.is_none() {
                fallback = Some(format!("{file}:{line}"));
            }
            if !file.starts_with(&package) {
                return Ok(format!("{file}:{line}"));
            }
            let back = frame.getattr("f_back")?;
            if back.is_none() {
                return Ok(fallback.unwrap_or_default());
            }
            frame = back;
        }
    };
    here().unwrap_or_else(|_| "<unknown>".to_string())
}
