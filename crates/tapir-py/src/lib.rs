//! The Python package `tapir`: leak-free reverse-mode autodiff. This crate is its native
//! module, `tapir._tapir`; `python/tapir/` holds the Python layer (errors, `nn`, stubs).
//!
//! The GIL is held for every op (v1): a scope belongs to the thread that opened it, and
//! the module declares `gil_used = true`, so free-threaded builds re-enable the GIL.

mod convert;
mod errors;
mod graph;
mod nograd;
mod ops;
mod params;
mod registry;
mod tensor;
mod var;

use pyo3::prelude::*;

/// Sets the size of the thread pool the engine's products run on (0: one per core); call
/// it once, before the first graph. Returns the size in effect.
#[pyfunction]
fn init_threads(py: Python<'_>, threads: usize) -> PyResult<usize> {
    tapir::init_threads(threads).map_err(|e| errors::engine(py, &e))
}

/// Turns the pool's spin-waiting on or off (on by default where `init_threads` gave the pool
/// no more threads than cores): idle pool threads spin for up to 1 ms between a graph's
/// parallel ops instead of sleeping. Returns whether it was on. Off where other processes
/// need the cores; results are the same either way.
#[pyfunction]
fn set_spin_wait(on: bool) -> bool {
    tapir::set_spin_wait(on)
}

/// The native module.
#[pymodule(gil_used = true)]
fn _tapir(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<graph::PyGraph>()?;
    m.add_class::<graph::PyScope>()?;
    m.add_class::<var::PyVar>()?;
    m.add_class::<nograd::PyNoGrad>()?;
    m.add_class::<tensor::PyTensor>()?;
    m.add_class::<params::PyParamStore>()?;
    m.add_class::<params::PyGradBuffer>()?;
    m.add_class::<params::PyOptimizer>()?;
    m.add_function(wrap_pyfunction!(params::sgd, m)?)?;
    m.add_function(wrap_pyfunction!(params::adam, m)?)?;
    m.add_function(wrap_pyfunction!(params::adamw, m)?)?;
    m.add_function(wrap_pyfunction!(params::clip_grad_norm, m)?)?;
    m.add_function(wrap_pyfunction!(init_threads, m)?)?;
    m.add_function(wrap_pyfunction!(set_spin_wait, m)?)?;
    Ok(())
}
