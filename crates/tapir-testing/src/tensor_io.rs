//! Arbitrary bytes through the loaders of external data in this crate:
//! [`Tensor::from_vec`] and [`Tensor::from_slice`] with arbitrary dimensions and lengths,
//! in `f32` and `f64`. The cargo-fuzz target `tensor_io` calls [`run_tensor_io`] (and the
//! checkpoint loader of `tapir-nn`, which this crate cannot depend on).
//!
//! Either the loader returns a tensor with exactly the requested dimensions and the
//! given elements, bit for bit, or it returns the documented error: [`Error::InvalidShape`]
//! for a rank above 6 or an element count that overflows, [`Error::DataLength`] for a
//! length that is not the product of the dimensions, each naming the loader and located
//! at the caller. Nothing else: no panic, no allocation of the requested size before the
//! shape is checked.

use crate::model;
use crate::program::Finding;
use crate::unstructured::Unstructured;
use tapir::Error;
use tapir::Float;
use tapir::Tensor;

/// Decodes `bytes` as (flags, dimensions, elements) and checks both loaders on them.
///
/// The first byte picks the element type (bit 0) and, per dimension, whether it is read
/// as one byte or as a full `u64` (bit 1); the second byte is the rank (0 to 8); the third
/// trims up to 3 elements off the end; the rest are the elements, little-endian.
///
/// # Errors
/// A [`Finding`] if a loader returned anything but the tensor or the documented error.
pub fn run_tensor_io(bytes: &[u8]) -> Result<(), Finding> {
    let mut u = Unstructured::new(bytes);
    let flags = u.byte();
    let rank = u.below(9);
    let wide = flags & 2 != 0;
    let dims: Vec<usize> = (0..rank).map(|_| if wide { u.u64() as usize } else { usize::from(u.byte() % 8) }).collect();
    let trim = u.below(4);
    let mut rest = vec![];
    while !u.is_empty() {
        rest.push(u.byte());
    }
    if flags & 1 == 0 {
        check::<f32>(&dims, &rest, trim, 4, |c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
    } else {
        check::<f64>(&dims, &rest, trim, 8, |c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]))
    }
}

fn check<T: Float>(
    dims: &[usize],
    raw: &[u8],
    trim: usize,
    size: usize,
    read: impl Fn(&[u8]) -> T,
) -> Result<(), Finding> {
    let mut data: Vec<T> = raw.chunks_exact(size).map(read).collect();
    data.truncate(data.len().saturating_sub(trim));
    let what = format!("{} dims {dims:?}, {} elements", T::NAME, data.len());
    let finding = |detail: String| Finding { what: detail, program: what.clone() };
    let expected = if !model::valid_dims(dims) {
        Err("InvalidShape")
    } else if model::numel(dims) != data.len() {
        Err("DataLength")
    } else {
        Ok(())
    };
    for (op, got) in
        [("from_slice", Tensor::from_slice(&data, dims)), ("from_vec", Tensor::from_vec(data.clone(), dims))]
    {
        match (&expected, got) {
            (Ok(()), Ok(t)) => {
                let same = t.data().iter().zip(&data).all(|(a, b)| a.to_f64().to_bits() == b.to_f64().to_bits());
                if t.dims() != dims || t.numel() != data.len() || !same {
                    return Err(finding(format!("{op} returned {t:?}")));
                }
            }
            (Err(variant), Err(e)) => check_error(&e, op, variant).map_err(finding)?,
            (_, got) => return Err(finding(format!("{op} returned {got:?}, expected {expected:?}"))),
        }
    }
    Ok(())
}

/// The error is `variant`, names `op` and is located in this file.
fn check_error(e: &Error, op: &str, variant: &str) -> Result<(), String> {
    let msg = e.to_string();
    if model::variant(e) != variant || e.op() != op || !msg.starts_with(op) {
        return Err(format!("{op} failed with {e:?}, expected {variant}"));
    }
    match e.location() {
        Some(l) if l.file() == file!() && msg.contains(file!()) => Ok(()),
        _ => Err(format!("{op}: error {msg} is not located at the caller ({})", file!())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_valid_invalid_and_overflowing_shapes() {
        // f32, rank 2 of [2, 1], no trim, two elements.
        let ok = [0, 2, 2, 1, 0, 0, 0, 128, 63, 0, 0, 0, 64];
        run_tensor_io(&ok).unwrap();
        // Wide dims: u64::MAX overflows.
        let mut wide = vec![3, 1];
        wide.extend(u64::MAX.to_le_bytes());
        run_tensor_io(&wide).unwrap();
        run_tensor_io(&[]).unwrap();
        run_tensor_io(&[0, 8, 1, 1, 1, 1, 1, 1, 1, 1]).unwrap();
    }
}
