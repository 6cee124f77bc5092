//! Parameters as one flat vector, for functional calls ([`Ctx::with_params`](crate::Ctx::with_params)):
//! MAML's inner step, Newton-type methods and Hessian-vector products over a whole model
//! work on a single handle, laid out as the chosen parameters' tensors flattened and
//! concatenated in the order given.

use tapir::{Float, ParamId, ParamStore, Tensor};

/// The number of elements of the parameters `ids` together.
///
/// # Errors
/// [`tapir::Error::UnknownParam`] if an id is foreign to `store`.
#[track_caller]
pub fn flat_len<T: Float>(store: &ParamStore<T>, ids: &[ParamId]) -> tapir::Result<usize> {
    let mut n = 0;
    for &id in ids {
        n += store.get(id)?.numel();
    }
    Ok(n)
}

/// The parameters `ids` flattened and concatenated, in the order of `ids`: the layout
/// [`Ctx::with_params`](crate::Ctx::with_params) reads.
///
/// # Errors
/// [`tapir::Error::UnknownParam`] if an id is foreign to `store`.
#[track_caller]
pub fn flatten_params<T: Float>(store: &ParamStore<T>, ids: &[ParamId]) -> tapir::Result<Tensor<T>> {
    let mut data = Vec::with_capacity(flat_len(store, ids)?);
    for &id in ids {
        data.extend_from_slice(store.get(id)?.data());
    }
    let n = data.len();
    Tensor::from_vec(data, &[n])
}

/// Writes `flat` (laid out as by [`flatten_params`]) back into the parameters `ids`.
///
/// # Errors
/// [`tapir::Error::UnknownParam`] if an id is foreign to `store`;
/// [`tapir::Error::InvalidArgument`] if `flat` does not have [`flat_len`] elements (the
/// store is then unchanged).
#[track_caller]
pub fn unflatten_params<T: Float>(store: &mut ParamStore<T>, ids: &[ParamId], flat: &[T]) -> tapir::Result<()> {
    let n = flat_len(store, ids)?;
    if flat.len() != n {
        return Err(crate::invalid(
            "unflatten_params",
            format!("{} values for {} parameters holding {n} elements", flat.len(), ids.len()),
        ));
    }
    let mut start = 0;
    for &id in ids {
        let t = store.get_mut(id)?;
        let len = t.numel();
        t.data_mut().copy_from_slice(&flat[start..start + len]);
        start += len;
    }
    Ok(())
}
