//! Parameters as one flat vector, for functional calls ([`Ctx::with_params`](crate::Ctx::with_params)):
//! MAML's inner step, Newton-type methods and Hessian-vector products over a whole model
//! work on a single handle, laid out as the chosen parameters' tensors flattened and
//! concatenated in the order given.

use tapir::{Float, ParamId, ParamStore, Tensor};

/// The number of elements of the parameters `ids` together.
///
/// # Errors
/// [`tapir::Error::UnknownParam`] if an id is foreign to `store`;
/// [`tapir::Error::InvalidArgument`] if the count overflows `usize` (an id repeated
/// very many times).
#[track_caller]
pub fn flat_len<T: Float>(store: &ParamStore<T>, ids: &[ParamId]) -> tapir::Result<usize> {
    let mut n: usize = 0;
    for (i, &id) in ids.iter().enumerate() {
        let numel = store.get(id)?.numel();
        n = match n.checked_add(numel) {
            Some(n) => n,
            None => {
                return Err(crate::invalid(
                    "flat_len",
                    format!(
                        "the {} parameters' element count overflows usize at parameter {i} ({numel} elements)",
                        ids.len()
                    ),
                ))
            }
        };
    }
    Ok(n)
}

/// The parameters `ids` flattened and concatenated, in the order of `ids`: the layout
/// [`Ctx::with_params`](crate::Ctx::with_params) reads.
///
/// # Errors
/// [`tapir::Error::UnknownParam`] if an id is foreign to `store`; as [`flat_len`];
/// [`tapir::Error::TensorOutOfMemory`] if the flat vector cannot be allocated (ids may
/// repeat, so it can be far larger than the store).
#[track_caller]
pub fn flatten_params<T: Float>(store: &ParamStore<T>, ids: &[ParamId]) -> tapir::Result<Tensor<T>> {
    let n = flat_len(store, ids)?;
    let location = std::panic::Location::caller();
    let mut data = Vec::new();
    // `try_reserve_exact` refuses a byte count past `isize::MAX` as well as a refusal of
    // the allocator, so both are this typed error rather than an abort.
    data.try_reserve_exact(n).map_err(|_| tapir::Error::TensorOutOfMemory {
        op: "flatten_params",
        shape: tapir::Shape::new(&[n]).unwrap_or(tapir::Shape::scalar()),
        requested: n.saturating_mul(std::mem::size_of::<T>()),
        location,
    })?;
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
