//! `backward_into` on programs with a custom op: the program's gradient-requesting leaves
//! become parameters of a store, and its loss is differentiated into a caller's
//! [`GradBuffer`], zeroed (the engine then computes straight into the buffer's slots) or
//! holding gradients already (it computes in the arena and adds). On any error the buffer
//! must hold exactly what it held before; a misbehaving custom op (`custom.rs`) may only
//! fail with [`Error::CustomOp`], and when it does not fail it must leave what the
//! well-behaved op leaves, bit for bit.

use tapir::{Error, Float, Graph, ParamStore, Tensor};

use crate::program::custom::NAME;
use crate::program::interpret::{backward_into, step_on, sum};
use crate::program::{Dtype, Program};

/// One `backward_into`: its result, and the buffer's bits before and after.
struct Into {
    result: Result<(), Error>,
    before: Vec<u64>,
    after: Vec<u64>,
}

/// Checks `backward_into` on `p` with a zeroed and a filled buffer.
///
/// # Errors
/// What went wrong, for [`Program::finding`].
pub(crate) fn check(p: &Program) -> Result<(), String> {
    for filled in [false, true] {
        let got = run(p, filled)?;
        match &got.result {
            Err(e) if got.after != got.before => {
                return Err(format!("backward_into failed with {e} and changed the caller's buffer (filled: {filled})"))
            }
            Err(e @ Error::CustomOp { op, .. }) if *op == NAME && !p.misbehaves() => {
                return Err(format!("backward_into through a well-behaved `{NAME}` failed: {e}"))
            }
            Err(_) => {}
            Ok(()) if p.misbehaves() => {
                let tamed = run(&p.tamed(), filled)?;
                if tamed.result.is_err() || tamed.after != got.after {
                    let as_f64 = |b: &[u64]| b.iter().map(|&b| f64::from_bits(b)).collect::<Vec<_>>();
                    return Err(format!(
                        "backward_into through a misbehaving `{NAME}` returned Ok with the gradients {:?}; the \
                         well-behaved op returned {:?} with {:?} (filled: {filled})",
                        as_f64(&got.after),
                        tamed.result,
                        as_f64(&tamed.after)
                    ));
                }
            }
            Ok(()) => {}
        }
    }
    Ok(())
}

fn run(p: &Program, filled: bool) -> Result<Into, String> {
    match p.dtype {
        Dtype::F32 => run_as::<f32>(p, filled),
        Dtype::F64 => run_as::<f64>(p, filled),
    }
}

fn bits<T: Float>(v: &[T]) -> Vec<u64> {
    v.iter().map(|x| x.to_f64().to_bits()).collect()
}

fn run_as<T: Float>(p: &Program, filled: bool) -> Result<Into, String> {
    let mut store = ParamStore::<T>::new();
    // Each leaf as a parameter (`Ok`) or an input (`Err`).
    let mut leaves = Vec::with_capacity(p.leaves.len());
    for (i, l) in p.leaves.iter().enumerate() {
        let data = l.data.iter().map(|&v| T::from_f64(v)).collect();
        let t = Tensor::from_vec(data, &l.dims).map_err(|e| format!("leaf: {e}"))?;
        leaves.push(if l.grad {
            Ok(store.add(format!("p{i}"), t).map_err(|e| format!("param: {e}"))?)
        } else {
            Err(t)
        });
    }
    let mut grads = store.zeros_like().map_err(|e| format!("zeros_like: {e}"))?;
    if filled {
        for (i, g) in grads.as_mut_slice().iter_mut().enumerate() {
            *g = T::from_f64(0.25 * (i % 7 + 1) as f64);
        }
    }
    let before = bits(grads.as_slice());
    let mut graph = Graph::<T>::new();
    graph.set_threads(p.threads);
    graph.set_arena_limit(Some(p.limit()));
    let result = graph.scope(|s| {
        let mut values: Vec<_> = leaves
            .iter()
            .map(|l| match l {
                Ok(id) => s.param(&store, *id),
                Err(t) => s.input(t),
            })
            .collect();
        for step in &p.steps {
            let v = step_on(s, &values, step);
            values.push(v);
        }
        let loss = if p.reduce_loss { sum(values[p.loss]) } else { values[p.loss] };
        backward_into(s, loss, &mut grads)
    });
    Ok(Into { result, before, after: bits(grads.as_slice()) })
}
