//! The transforms over any structure of tensors ([`Tree`]): [`grad`], [`value_and_grad`],
//! [`vjp`], [`jvp`] and [`hvp`] take a tuple, an array, a `Vec`, a
//! [`ParamStore`](crate::ParamStore) or a user struct of tensors and give back the
//! gradients with the same structure, as JAX's and `torch.func`'s do with pytrees.
//!
//! The function receives the same structure of handles ([`Tree::Map`]`<Var<'s, T>>`), so
//! a tuple is destructured in the closure's arguments:
//!
//! ```
//! # fn main() -> Result<(), tapir::Error> {
//! use tapir::{func::tree, Tensor};
//! let w = Tensor::from_vec(vec![1.0f64, 2.0], &[2])?;
//! let bs = vec![Tensor::from_vec(vec![3.0], &[1])?, Tensor::from_vec(vec![4.0], &[1])?];
//! let mut graph = tapir::Graph::new();
//! // f = Σ w² · (b₀ + b₁): ∂f/∂w = 2w(b₀ + b₁), ∂f/∂bᵢ = Σ w²
//! let (dw, db) = tree::grad(&mut graph, &(&w, &bs), |_, (w, bs)| w.square().sum() * (bs[0] + bs[1]).sum())?;
//! assert_eq!(dw.data(), &[14.0, 28.0]);
//! assert_eq!((db[0].data(), db[1].data()), (&[5.0][..], &[5.0][..]));
//! # Ok(()) }
//! ```
//!
//! Choosing what is differentiated (JAX's `argnums`): wrap the parts to leave out in
//! [`Frozen`]. They reach the function as constants and their gradient is `()`, so the
//! types say which gradients exist; there is no runtime mask to get wrong.
//!
//! A struct of tensors derives [`Tree`] with the cargo feature `derive`. It is written
//! generic over its leaf, so that the same struct holds the tensors, the handles the
//! function receives and the gradients:
//!
//! ```
//! # #[cfg(feature = "derive")]
//! # fn main() -> Result<(), tapir::Error> {
//! use tapir::{func::tree::{self, Tree}, Tensor};
//! #[derive(Tree)]
//! struct Mlp<L> { w: L, layers: Vec<L> }
//!
//! let net = Mlp { w: Tensor::from_vec(vec![2.0f64], &[1])?, layers: vec![Tensor::from_vec(vec![3.0], &[1])?] };
//! let mut graph = tapir::Graph::new();
//! let g: Mlp<Tensor<f64>> = tree::grad(&mut graph, &net, |_, m| (m.w * m.layers[0]).sum())?;
//! assert_eq!((g.w.data(), g.layers[0].data()), (&[3.0][..], &[2.0][..]));
//! # Ok(()) }
//! # #[cfg(not(feature = "derive"))]
//! # fn main() {}
//! ```
//!
//! Every field of a derived struct is a structure of the leaf (`L`, `Vec<L>`, `[L; N]`, a
//! tuple of them, another derived struct); a field of another type, a second type
//! parameter or an enum is a compile error. [`Frozen`] wraps a whole input, not a field
//! (its gradient `()` is not a field's type): pass a frozen part beside the struct,
//! `&(&net, Frozen(&data))`.
//!
//! ```compile_fail
//! # #[cfg(not(feature = "derive"))]
//! # compile_error!("the derive needs the feature");
//! #[derive(tapir::func::tree::Tree)]
//! struct Two<L, M> { w: L, b: M } // one type parameter, the leaf, only
//! ```
//!
//! A tangent ([`jvp`], [`hvp`]) has the structure of the gradients, and is checked
//! against the input before anything is recorded: a list of another length, a tensor of
//! another shape, a gradient buffer of another store is an [`Error::Structure`] naming
//! the position (`input.1[3]`, `input.w`, `input["layer1.w"]`), both sides and the
//! caller's line.
//!
//! Covered: `grad`, `value_and_grad`, `vjp`, `jvp`, `hvp`, and the Jacobian and Hessian
//! transforms [`jacobian`], [`jacfwd`] and [`hessian`] by the methods of their one-tensor
//! versions ([`func::jacobian`](super::jacobian) and the others). These give blocks in
//! the structure's leaf order, [`Frozen`] parts having none: a `Vec` of Jacobian blocks,
//! one per leaf, of shape the output's followed by the leaf's, and a `Vec` of `Vec`s of
//! Hessian blocks `h[i][j]`, of shape leaf `i`'s followed by leaf `j`'s.

mod jac;
mod leaves;
mod params;

use std::panic::Location;

pub use jac::{hessian, jacfwd, jacobian};
pub use leaves::{Frozen, Gradients, Leaves, Position, Tree};
pub use params::ParamVars;
/// Derives [`Tree`] for a struct generic over its leaf type (cargo feature `derive`).
#[cfg(feature = "derive")]
pub use tapir_derive::Tree;

use self::leaves::Mode;
use super::{owned, same_shape};
use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::graph::graph::Graph;
use crate::record::handles::{Scope, Var};
use crate::tensor::Tensor;

/// The gradient of a one-element `f` with respect to every tensor of `x`, with `x`'s
/// structure ([`Tree::Grads`]).
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let xs = [tapir::Tensor::from_vec(vec![1.0f64, 2.0], &[2])?, tapir::Tensor::from_vec(vec![3.0], &[1])?];
/// let mut graph = tapir::Graph::new();
/// let [d0, d1] = tapir::func::tree::grad(&mut graph, &xs, |_, [a, b]| a.sum() * b.sum())?;
/// assert_eq!((d0.data(), d1.data()), (&[3.0, 3.0][..], &[3.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly, and [`Error::NotScalar`] unless `f` has one element.
#[track_caller]
pub fn grad<'g, T: Float, X: Tree<T> + ?Sized, F>(graph: &'g mut Graph<T>, x: &'g X, f: F) -> Result<X::Grads>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    Ok(value_and_grad_at(graph, x, f, "grad", Location::caller())?.1)
}

/// `f(x)` (one element) and its gradient with `x`'s structure, from one recording.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let (a, b) = (tapir::Tensor::from_vec(vec![2.0f64], &[1])?, tapir::Tensor::from_vec(vec![5.0], &[1])?);
/// let mut graph = tapir::Graph::new();
/// let (y, (da, db)) = tapir::func::tree::value_and_grad(&mut graph, &(&a, &b), |_, (a, b)| (a * b).sum())?;
/// assert_eq!((y, da.data(), db.data()), (10.0, &[5.0][..], &[2.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`grad`].
#[track_caller]
pub fn value_and_grad<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    f: F,
) -> Result<(T, X::Grads)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    value_and_grad_at(graph, x, f, "value_and_grad", Location::caller())
}

fn value_and_grad_at<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    f: F,
    op: &'static str,
    location: Loc,
) -> Result<(T, X::Grads)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Grad, location);
        let y = f(s, x.record(None, &mut leaves));
        let value = y.value()?;
        if value.len() != 1 {
            return Err(Error::NotScalar { op, shape: y.shape(), location });
        }
        let gs = gradients(s, y, None, &leaves.xs)?;
        Ok((value[0], x.grads(&mut Gradients::new(&gs, op, location))?))
    })
}

/// `f(x)` and the vector-Jacobian product `vᵀJ = ∂⟨f(x), v⟩/∂x` with `x`'s structure, for
/// `f` of any shape and `v` of `f`'s shape.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let (a, b) = (tapir::Tensor::from_vec(vec![1.0f64, 2.0], &[2])?, tapir::Tensor::from_vec(vec![3.0, 4.0], &[2])?);
/// let v = tapir::Tensor::from_vec(vec![1.0, 10.0], &[2])?;
/// let mut graph = tapir::Graph::new();
/// let (y, (va, vb)) = tapir::func::tree::vjp(&mut graph, &(&a, &b), &v, |_, (a, b)| a * b)?;
/// assert_eq!((y.data(), va.data(), vb.data()), (&[3.0, 8.0][..], &[3.0, 40.0][..], &[1.0, 20.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly; [`Error::ShapeMismatch`] unless `v` has `f(x)`'s shape.
#[track_caller]
pub fn vjp<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    v: &'g Tensor<T>,
    f: F,
) -> Result<(Tensor<T>, X::Grads)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Grad, location);
        let y = f(s, x.record(None, &mut leaves));
        y.value()?;
        same_shape("vjp", y.shape(), v.shape(), location)?;
        let gs = gradients(s, y, Some(s.input(v)), &leaves.xs)?;
        Ok((owned("vjp", y, location)?, x.grads(&mut Gradients::new(&gs, "vjp", location))?))
    })
}

/// `f(x)` and the Jacobian-vector product `J t = Σᵢ ∂f/∂xᵢ · tᵢ` by forward mode, with the
/// tangent `t` in the structure of `x`'s gradients (a [`Frozen`] part's is `()`).
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::Tensor;
/// let (a, b) = (Tensor::from_vec(vec![1.0f64, 2.0], &[2])?, Tensor::from_vec(vec![3.0, 4.0], &[2])?);
/// let (ta, tb) = (Tensor::from_vec(vec![1.0, 0.0], &[2])?, Tensor::from_vec(vec![0.0, 1.0], &[2])?);
/// let mut graph = tapir::Graph::new();
/// // d(a ⊙ b) = ta ⊙ b + a ⊙ tb
/// let (y, jt) = tapir::func::tree::jvp(&mut graph, &(&a, &b), &(ta, tb), |_, (a, b)| a * b)?;
/// assert_eq!((y.data(), jt.data()), (&[3.0, 8.0][..], &[3.0, 2.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// [`Error::Structure`] unless `t` matches `x` (lengths, shapes, stores), before
/// anything is recorded; what `f` records wrongly; [`Error::ForwardUnsupported`]
/// through a custom op without a forward rule.
#[track_caller]
pub fn jvp<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    t: &'g X::Grads,
    f: F,
) -> Result<(Tensor<T>, Tensor<T>)>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    x.check(t, &mut Position::new("jvp", location))?;
    graph.scope(|s| {
        s.forward(|level| {
            let mut leaves = Leaves::new(s, Mode::Dual(level), location);
            let y = f(s, x.record(Some(t), &mut leaves));
            let jt = s.tangent_at(level, y, location);
            Ok((owned("jvp", y, location)?, owned("jvp", jt, location)?))
        })
    })
}

/// The Hessian-vector product `∇²f(x) · v` of a one-element `f`, with `v` and the result
/// in the structure of `x`'s gradients: reverse over reverse, `∇ₓ Σᵢ⟨∇ᵢf(x), vᵢ⟩`, about
/// two gradients' work; the Hessian's blocks between parts are included.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::Tensor;
/// let (a, b) = (Tensor::from_vec(vec![2.0f64], &[1])?, Tensor::from_vec(vec![3.0], &[1])?);
/// let (va, vb) = (Tensor::from_vec(vec![1.0], &[1])?, Tensor::from_vec(vec![0.0], &[1])?);
/// let mut graph = tapir::Graph::new();
/// // f = a²b: H = [[2b, 2a], [2a, 0]] = [[6, 4], [4, 0]], so H (1, 0) = (6, 4)
/// let (ha, hb) = tapir::func::tree::hvp(&mut graph, &(&a, &b), &(va, vb), |_, (a, b)| (a.square() * b).sum())?;
/// assert_eq!((ha.data(), hb.data()), (&[6.0][..], &[4.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`grad`] and, for `v`, [`jvp`].
#[track_caller]
pub fn hvp<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    v: &'g X::Grads,
    f: F,
) -> Result<X::Grads>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    x.check(v, &mut Position::new("hvp", location))?;
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Pair, location);
        let y = f(s, x.record(Some(v), &mut leaves));
        let value = y.value()?;
        if value.len() != 1 {
            return Err(Error::NotScalar { op: "hvp", shape: y.shape(), location });
        }
        let gs = gradients(s, y, None, &leaves.xs)?;
        let mut inner = s.scalar(T::ZERO);
        for (g, v) in gs.iter().zip(&leaves.ts) {
            inner = inner + (*g * *v).sum();
        }
        let hv = gradients(s, inner, None, &leaves.xs)?;
        x.grads(&mut Gradients::new(&hv, "hvp", location))
    })
}

/// The recorded gradients of `y` (seeded with `seed`, else one) for each of `xs`.
#[track_caller]
fn gradients<'s, T: Float>(
    s: &'s Scope<'s, '_, T>,
    y: Var<'s, T>,
    seed: Option<Var<'s, T>>,
    xs: &[Var<'s, T>],
) -> Result<Vec<Var<'s, T>>> {
    let mut out = vec![s.core.poison(); xs.len()];
    match seed {
        Some(v) => s.vjp_into(y, v, xs, &mut out)?,
        None => s.grad_into(y, xs, &mut out)?,
    }
    Ok(out)
}
