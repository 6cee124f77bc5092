//! The checkpoint half of the cargo-fuzz target `tensor_io`: arbitrary bytes through
//! [`read_checkpoint`] in `f32` and `f64`. The fuzz target and the corpus replay test
//! (`tests/fuzz_replay.rs`) both call [`run_checkpoint_io`].
//!
//! Either the loader returns tensors that survive a round trip through
//! [`write_checkpoint`] bit for bit, with the same names, shapes and (rounded) values in
//! both element types, or it returns [`Error::Io`] for `"load"`. Nothing else: no panic,
//! no other variant.

use crate::program::Finding;
use tapir::{Error, Float, Tensor};

use tapir_nn::io::{read_checkpoint, write_checkpoint};

/// Reads `bytes` as a checkpoint in both element types and checks the result.
///
/// # Errors
/// A [`Finding`] if the loader returned anything but round-tripping tensors or an
/// [`Error::Io`] for `"load"`.
pub fn run_checkpoint_io(bytes: &[u8]) -> Result<(), Finding> {
    let narrow = check::<f32>(bytes)?;
    let wide = check::<f64>(bytes)?;
    match (narrow, wide) {
        (Some(n), Some(w)) => {
            let same = n.len() == w.len()
                && n.iter().zip(&w).all(|((a, x), (b, y))| {
                    a == b
                        && x.shape() == y.shape()
                        && x.data().iter().zip(y.data()).all(|(&p, &q)| same_bits(p, q as f32))
                });
            if !same {
                return Err(finding(bytes, "the f32 and f64 reads disagree".into()));
            }
            Ok(())
        }
        (None, None) => Ok(()),
        _ => Err(finding(bytes, "one element type loads and the other fails".into())),
    }
}

fn finding(bytes: &[u8], what: String) -> Finding {
    Finding { what, program: format!("read_checkpoint of {} bytes", bytes.len()) }
}

fn same_bits<T: Float>(a: T, b: T) -> bool {
    a.to_f64().to_bits() == b.to_f64().to_bits() || (a.is_nan() && b.is_nan())
}

/// Named tensors, as the loader returns them.
type Named<T> = Vec<(String, Tensor<T>)>;

/// The tensors, or `None` after an `Io` error for `"load"`.
fn check<T: Float>(bytes: &[u8]) -> Result<Option<Named<T>>, Finding> {
    let tensors = match read_checkpoint::<T>(bytes) {
        Ok(t) => t,
        Err(e @ Error::Io { op: "load", .. }) if e.to_string().starts_with("load: ") => return Ok(None),
        Err(e) => return Err(finding(bytes, format!("read_checkpoint::<{}> failed with {e:?}", T::NAME))),
    };
    let refs: Vec<(&str, &Tensor<T>)> = tensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut again = write_checkpoint(&refs)
        .and_then(|b| read_checkpoint::<T>(&b))
        .map_err(|e| finding(bytes, format!("a loaded checkpoint does not round-trip: {e}")))?;
    // The writer chooses its own order (safetensors sorts by dtype, then name).
    let order: Vec<&str> = tensors.iter().map(|(n, _)| n.as_str()).collect();
    again.sort_by_key(|(n, _)| order.iter().position(|o| o == n));
    let same = again.len() == tensors.len()
        && again.iter().zip(&tensors).all(|((a, x), (b, y))| {
            a == b && x.shape() == y.shape() && x.data().iter().zip(y.data()).all(|(&p, &q)| same_bits(p, q))
        });
    if !same {
        return Err(finding(bytes, format!("{} tensors changed in a round trip", T::NAME)));
    }
    Ok(Some(tensors))
}
