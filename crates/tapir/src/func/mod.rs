//! Function transforms in the manner of `torch.func` and JAX: [`grad`], [`value_and_grad`],
//! [`hvp`], [`jvp`], [`vjp`], [`jacobian`], [`jacfwd`] and [`hessian`] of a function of one tensor.
//!
//! Each is a thin layer over [`Scope::grad`], [`Scope::vjp`] and [`Scope::jvp`]: it opens one
//! [`Graph::scope`] on the caller's graph (so a warmed-up call reuses the arena and the
//! tape), records `f` on a gradient-requesting leaf holding `x`, takes the derivatives it
//! needs as recorded handles, and copies the result out into an owned [`Tensor`]. The
//! function is a closure over the scope and the input handle,
//! `for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>`: it works for every
//! scope's brand `'s`, so nothing it records can escape, and it may read tensors that
//! outlive the call (`'g`, the borrow of the graph) with [`Scope::input`].
//!
//! A function of several tensors (a tuple, an array, a `Vec`, a [`ParamStore`](crate::ParamStore),
//! a struct) uses the same transforms in [`tree`]: [`tree::grad`], [`tree::value_and_grad`],
//! [`tree::vjp`], [`tree::jvp`] and [`tree::hvp`] take any [`tree::Tree`] and return the
//! gradients with the input's structure; [`tree::jacobian`], [`tree::jacfwd`] and
//! [`tree::hessian`] return one block per input tensor; [`tree::Frozen`] leaves parts
//! undifferentiated.
//!
//! ```
//! # fn main() -> Result<(), tapir::Error> {
//! let (w, b) = (tapir::Tensor::from_vec(vec![3.0f64], &[1])?, tapir::Tensor::from_vec(vec![1.0], &[1])?);
//! let mut graph = tapir::Graph::new();
//! let (dw, db) = tapir::func::tree::grad(&mut graph, &(&w, &b), |_, (w, b)| (w * b).sum())?;
//! assert_eq!((dw.data(), db.data()), (&[1.0][..], &[3.0][..]));
//! # Ok(()) }
//! ```
//!
//! Costs, with `C` the cost of one evaluation of `f` (a gradient costs about `2–3 C`):
//!
//! | transform | method | cost |
//! |---|---|---|
//! | `grad`, `value_and_grad` | one recorded reverse sweep | about a gradient |
//! | `hvp` | reverse over reverse: `∇ₓ⟨∇f(x), v⟩` | about 2 gradients |
//! | `jvp` | forward mode: tangents recorded beside the values | about 2 evaluations |
//! | `vjp` | one recorded reverse sweep from `v` | about a gradient |
//! | `jacobian` | one vjp per output element | `m` gradients (small outputs) |
//! | `jacfwd` | one jvp per input element | `n` forward passes (small inputs, tall outputs) |
//! | `hessian` | one gradient of each gradient element | `n` gradients (small inputs) |

pub mod tree;

use crate::dtype::Float;
use crate::error::{try_vec, Error, Loc, Result};
use crate::graph::graph::Graph;
use crate::record::handles::{Scope, Var};
use crate::shape::{Shape, MAX_RANK};
use crate::tensor::Tensor;

/// The gradient `∇f(x)` of a one-element `f`.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// let g = tapir::func::grad(&mut graph, &x, |_, x| (x * x).sum())?; // ∇ Σx² = 2x
/// assert_eq!(g.data(), &[2.0, 4.0]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly, and [`Error::NotScalar`] unless `f` has one element.
#[track_caller]
pub fn grad<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, f: F) -> Result<Tensor<T>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    Ok(value_and_grad(graph, x, f)?.1)
}

/// `f(x)` (one element) and its gradient, from one recording.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f32>::new();
/// let x = tapir::Tensor::from_vec(vec![3.0f32], &[1])?;
/// let (y, g) = tapir::func::value_and_grad(&mut graph, &x, |_, x| x.powf(3.0).sum())?;
/// assert_eq!((y, g.data()[0]), (27.0, 27.0)); // x³ and 3x²
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`grad`].
#[track_caller]
pub fn value_and_grad<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, f: F) -> Result<(T, Tensor<T>)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    graph.scope(|s| {
        let xv = s.leaf(x);
        let y = f(s, xv);
        let value = y.value()?;
        if value.len() != 1 {
            return Err(Error::NotScalar { op: "value_and_grad", shape: y.shape(), location });
        }
        let [g] = s.grad(y, [xv])?;
        Ok((value[0], owned("value_and_grad", g, location)?))
    })
}

/// The Hessian-vector product `∇²f(x) · v` of a one-element `f`, by reverse over
/// reverse: the gradient is recorded, then `∇ₓ⟨∇f(x), v⟩` is a second reverse sweep over
/// the forward and the recorded gradient, about two gradients' work. No Hessian is formed.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// let v = tapir::Tensor::from_vec(vec![1.0, 0.0], &[2])?;
/// // f = x₀²x₁: H = [[2x₁, 2x₀], [2x₀, 0]] = [[4, 2], [2, 0]], so H v = [4, 2].
/// let hv = tapir::func::hvp(&mut graph, &x, &v, |_, x| {
///     (x.narrow(0, 0, 1).square() * x.narrow(0, 1, 1)).sum()
/// })?;
/// assert_eq!(hv.data(), &[4.0, 2.0]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`grad`]; [`Error::ShapeMismatch`] unless `v` has `x`'s shape.
#[track_caller]
pub fn hvp<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, v: &'g Tensor<T>, f: F) -> Result<Tensor<T>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    same_shape("hvp", x.shape(), v.shape(), location)?;
    graph.scope(|s| {
        let xv = s.leaf(x);
        let y = f(s, xv);
        let [g] = s.grad(y, [xv])?;
        let [hv] = s.grad((g * s.input(v)).sum(), [xv])?;
        owned("hvp", hv, location)
    })
}

/// `f(x)` and the Jacobian-vector product `J v = ∂f(x)/∂x · v` (forward mode), for `f` of
/// any shape.
///
/// Method: tangent propagation ([`Scope::jvp`]): `x` is seeded with tangent `v` and every
/// op records its output's tangent beside its value, about one more evaluation of `f`,
/// independent of the input and output sizes. (Until 0.1 this was the double-vjp trick, two
/// reverse sweeps; [`testing::jvpcheck`](crate::testing::jvpcheck) still compares the two.)
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
/// let v = tapir::Tensor::from_vec(vec![1.0, 1.0, 0.0], &[3])?;
/// let (y, jv) = tapir::func::jvp(&mut graph, &x, &v, |_, x| x.square())?; // J = diag(2x)
/// assert_eq!((y.data(), jv.data()), (&[1.0, 4.0, 9.0][..], &[2.0, 4.0, 0.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly; [`Error::ShapeMismatch`] unless `v` has `x`'s shape;
/// [`Error::ForwardUnsupported`] through a custom op without a forward rule.
#[track_caller]
pub fn jvp<'g, T: Float, F>(
    graph: &'g mut Graph<T>,
    x: &'g Tensor<T>,
    v: &'g Tensor<T>,
    f: F,
) -> Result<(Tensor<T>, Tensor<T>)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    same_shape("jvp", x.shape(), v.shape(), location)?;
    graph.scope(|s| {
        let (y, jv) = s.jvp([s.input(x)], [s.input(v)], |[x]| f(s, x));
        Ok((owned("jvp", y, location)?, owned("jvp", jv, location)?))
    })
}

/// The Jacobian of `f` at `x` by forward mode, of shape `f`'s shape followed by `x`'s: one
/// tangent per input element (JAX's `jacfwd`), so meant for small inputs and tall outputs,
/// where [`jacobian`] (one reverse sweep per output element) would take `m ≫ n` sweeps.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// let a = tapir::Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let j = tapir::func::jacfwd(&mut graph, &x, |s, x| s.input(&a).matmul(x.reshape(&[2, 1])).reshape(&[3]))?;
/// assert_eq!(j.data(), a.data()); // the Jacobian of A·x is A
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`jacobian`] and [`jvp`].
#[track_caller]
pub fn jacfwd<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, f: F) -> Result<Tensor<T>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    graph.scope(|s| {
        let y = f(s, s.input(x));
        y.value()?;
        let (sy, sx) = (y.shape(), x.shape());
        let shape = joined("jacfwd", sy, sx, location)?;
        let n = sx.numel();
        let mut data = zeroed("jacfwd", shape, shape.numel(), location)?;
        let mut e = zeroed("jacfwd", sx, n, location)?;
        let dims = sx.to_vec();
        for j in 0..n {
            e[j] = T::ONE;
            let seed = s.tensor(&e, &dims);
            e[j] = T::ZERO;
            let (_, t) = s.jvp([s.input(x)], [seed], |[x]| f(s, x));
            for (i, &v) in t.value()?.iter().enumerate() {
                data[i * n + j] = v;
            }
        }
        Ok(Tensor::from_parts(data, shape))
    })
}

/// `f(x)` and the vector-Jacobian product `vᵀJ = ∂⟨f(x), v⟩/∂x` (reverse mode), for `f` of
/// any shape and `v` of `f`'s shape (JAX's `vjp` applied once).
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0, 3.0], &[3])?;
/// let v = tapir::Tensor::from_vec(vec![1.0, 0.5, 0.0], &[3])?;
/// let (y, vj) = tapir::func::vjp(&mut graph, &x, &v, |_, x| x.square())?; // J = diag(2x)
/// assert_eq!((y.data(), vj.data()), (&[1.0, 4.0, 9.0][..], &[2.0, 2.0, 0.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly; [`Error::ShapeMismatch`] unless `v` has `f(x)`'s shape.
#[track_caller]
pub fn vjp<'g, T: Float, F>(
    graph: &'g mut Graph<T>,
    x: &'g Tensor<T>,
    v: &'g Tensor<T>,
    f: F,
) -> Result<(Tensor<T>, Tensor<T>)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    graph.scope(|s| {
        let xv = s.leaf(x);
        let y = f(s, xv);
        y.value()?;
        same_shape("vjp", y.shape(), v.shape(), location)?;
        let [vj] = s.vjp(y, s.input(v), [xv])?;
        Ok((owned("vjp", y, location)?, owned("vjp", vj, location)?))
    })
}

/// The Jacobian of `f` at `x`, of shape `f`'s shape followed by `x`'s: one vector-Jacobian
/// product per output element, so meant for small outputs.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// let a = tapir::Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])?;
/// let j = tapir::func::jacobian(&mut graph, &x, |s, x| s.input(&a).matmul(x.reshape(&[2, 1])).reshape(&[3]))?;
/// assert_eq!(j.shape().dims(), &[3, 2]);
/// assert_eq!(j.data(), a.data()); // the Jacobian of A·x is A
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly; [`Error::InvalidShape`] if the two ranks add up to more
/// than [`MAX_RANK`] or the element count overflows; [`Error::TensorOutOfMemory`] if the
/// allocator refuses the Jacobian's memory (it is allocated before the first product).
#[track_caller]
pub fn jacobian<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, f: F) -> Result<Tensor<T>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    graph.scope(|s| {
        let xv = s.leaf(x);
        let y = f(s, xv);
        y.value()?;
        let (sy, sx) = (y.shape(), x.shape());
        let shape = joined("jacobian", sy, sx, location)?;
        let mut data = zeroed("jacobian", shape, shape.numel(), location)?;
        let mut e = zeroed("jacobian", sy, sy.numel(), location)?;
        let n = sx.numel();
        for i in 0..sy.numel() {
            e[i] = T::ONE;
            let seed = s.tensor(&e, &sy.to_array()[..sy.rank()]);
            e[i] = T::ZERO;
            let [row] = s.vjp(y, seed, [xv])?;
            data[i * n..(i + 1) * n].copy_from_slice(row.value()?);
        }
        Ok(Tensor::from_parts(data, shape))
    })
}

/// The Hessian of a one-element `f` at `x`, of shape `x`'s twice: the gradient is recorded
/// once, then each of its `n` elements is differentiated, so meant for small inputs.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut graph = tapir::Graph::<f64>::new();
/// let x = tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?;
/// // f = x₀²x₁ + x₁³: H = [[2x₁, 2x₀], [2x₀, 6x₁]]
/// let h = tapir::func::hessian(&mut graph, &x, |_, x| {
///     let (a, b) = (x.narrow(0, 0, 1), x.narrow(0, 1, 1));
///     (a.square() * b + b.powf(3.0)).sum()
/// })?;
/// assert_eq!(h.data(), &[4.0, 2.0, 2.0, 12.0]);
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`grad`] and [`jacobian`].
#[track_caller]
pub fn hessian<'g, T: Float, F>(graph: &'g mut Graph<T>, x: &'g Tensor<T>, f: F) -> Result<Tensor<T>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, Var<'s, T>) -> Var<'s, T>,
{
    let location = std::panic::Location::caller();
    graph.scope(|s| {
        let xv = s.leaf(x);
        let y = f(s, xv);
        let sx = x.shape();
        let shape = joined("hessian", sx, sx, location)?;
        s.check()?; // what `f` recorded wrongly comes first
        let mut data = zeroed("hessian", shape, shape.numel(), location)?;
        let [g] = s.grad(y, [xv])?;
        let n = sx.numel();
        let flat = g.reshape(&[n]);
        for i in 0..n {
            let [row] = s.grad(flat.narrow(0, i, 1).sum(), [xv])?;
            data[i * n..(i + 1) * n].copy_from_slice(row.value()?);
        }
        Ok(Tensor::from_parts(data, shape))
    })
}

/// `n` zeros for the result of `op`, of shape `shape`, allocated fallibly: the byte count
/// is checked first (see [`bytes_for`]), then [`try_vec`] reports a refusal of the
/// allocator as [`Error::TensorOutOfMemory`] instead of aborting the process. A Jacobian
/// or Hessian is the square of its input's size (`2^17` `f32` inputs make 64 GiB), so
/// its size is the caller's to choose and the allocator's to refuse.
fn zeroed<T: Float>(op: &'static str, shape: Shape, n: usize, location: Loc) -> Result<Vec<T>> {
    bytes_for::<T>(op, shape, n, location)?;
    try_vec(op, shape, n, T::ZERO, location)
}

/// The bytes of `n` elements of `T`, or [`Error::TensorOutOfMemory`] (without asking the
/// allocator) if they overflow or exceed `isize::MAX`, the most a `Vec` can hold. A
/// [`Shape`] already caps its element count at `isize::MAX / 8`, so this guards `n`s
/// computed by the caller.
fn bytes_for<T>(op: &'static str, shape: Shape, n: usize, location: Loc) -> Result<usize> {
    match n.checked_mul(std::mem::size_of::<T>()) {
        Some(bytes) if isize::try_from(bytes).is_ok() => Ok(bytes),
        bytes => Err(Error::TensorOutOfMemory { op, shape, requested: bytes.unwrap_or(usize::MAX), location }),
    }
}

/// A handle's value as an owned tensor, allocated fallibly for `op`.
fn owned<T: Float>(op: &'static str, v: Var<'_, T>, location: Loc) -> Result<Tensor<T>> {
    Tensor::copy_at(op, v.shape(), v.value()?, location)
}

fn same_shape(op: &'static str, x: Shape, v: Shape, location: Loc) -> Result<()> {
    if x == v {
        Ok(())
    } else {
        Err(Error::ShapeMismatch { op, lhs: x, rhs: v, location })
    }
}

/// `a`'s dimensions followed by `b`'s.
fn joined(op: &'static str, a: Shape, b: Shape, location: Loc) -> Result<Shape> {
    let mut d = [0usize; 2 * MAX_RANK];
    let (ra, rb) = (a.rank(), b.rank());
    d[..ra].copy_from_slice(&a.to_array()[..ra]);
    d[ra..ra + rb].copy_from_slice(&b.to_array()[..rb]);
    crate::error::shape_at(op, a, &d[..ra + rb], location)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_byte_count_past_isize_max_is_refused_without_allocating() {
        let (shape, location) = (Shape::new(&[3, 5]).unwrap(), std::panic::Location::caller());
        // `Shape` cannot hold such a count (it caps elements at `isize::MAX / 8`), so the
        // guard is tested on the count alone; a `Vec` this size would abort with a
        // capacity overflow, not return an error.
        let n = isize::MAX as usize / 4 + 1;
        let e = zeroed::<f32>("jacobian", shape, n, location).unwrap_err();
        let requested = n * 4;
        assert!(matches!(e, Error::TensorOutOfMemory { op: "jacobian", requested: r, .. } if r == requested), "{e}");
        assert_eq!(
            e.to_string(),
            format!(
                "jacobian: out of memory allocating {requested} bytes for a tensor of shape [3, 5] (at {location})"
            )
        );
        let e = bytes_for::<f64>("hessian", shape, usize::MAX, location).unwrap_err();
        assert!(matches!(e, Error::TensorOutOfMemory { op: "hessian", requested: usize::MAX, .. }), "{e}");
        assert_eq!(bytes_for::<f64>("hessian", shape, 15, location).unwrap(), 120);
    }

    #[test]
    fn the_largest_shape_fits_isize_in_bytes() {
        // The guard's premise for `Shape`s: their element count times 8 bytes never overflows.
        let e = Shape::new(&[1 << 31, 1 << 31]).unwrap_err();
        assert!(matches!(e, crate::shape::ShapeProblem::Overflow), "{e:?}");
        let big = Shape::new(&[1 << 30, (1 << 30) - 1]).unwrap();
        assert!(bytes_for::<f64>("hessian", big, big.numel(), std::panic::Location::caller()).is_ok());
    }
}
