//! [`jacobian`], [`jacfwd`] and [`hessian`] over a structure of tensors: the one-tensor
//! transforms' methods ([`func::jacobian`](crate::func::jacobian) and the others), with
//! one block per differentiated leaf.
//!
//! The blocks come back as a `Vec` in the structure's leaf order (the order of
//! [`Tree::record`], the order of the fields of `X::Grads`), [`Frozen`](super::Frozen)
//! parts left out. They are not given the structure of [`Tree::Grads`]: a block has the
//! output's dimensions in front of its leaf's, which a [`GradBuffer`](crate::GradBuffer)
//! slot cannot hold, and a Hessian's blocks are indexed by two leaves.

use std::panic::Location;

use super::gradients;
use super::leaves::{Leaves, Mode, Tree};
use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::func::{joined, zeroed};
use crate::graph::graph::Graph;
use crate::record::handles::{Scope, Var};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// The Jacobian of `f` with respect to every differentiated tensor of `x`, one block per
/// leaf in the structure's order ([`Frozen`](super::Frozen) parts have none), each of
/// shape `f`'s shape followed by its leaf's: one vector-Jacobian product per output
/// element, so meant for small outputs (see [`jacfwd`] for small inputs).
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::Tensor;
/// let (a, b) = (Tensor::from_vec(vec![1.0f64, 2.0], &[2])?, Tensor::from_vec(vec![3.0], &[1])?);
/// let mut graph = tapir::Graph::new();
/// // f = a · b₀ (shape [2]): ∂f/∂a = b₀ I (shape [2, 2]), ∂f/∂b = a (shape [2, 1])
/// let j = tapir::func::tree::jacobian(&mut graph, &(&a, &b), |_, (a, b)| a * b)?;
/// assert_eq!((j[0].shape().dims(), j[1].shape().dims()), (&[2, 2][..], &[2, 1][..]));
/// assert_eq!((j[0].data(), j[1].data()), (&[3.0, 0.0, 0.0, 3.0][..], &[1.0, 2.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// What `f` records wrongly; [`Error::InvalidShape`] if `f`'s rank and a leaf's add up
/// to more than [`MAX_RANK`](crate::shape::MAX_RANK) or an element count overflows;
/// [`Error::TensorOutOfMemory`] if the allocator refuses a block (all are allocated
/// before the first product).
#[track_caller]
pub fn jacobian<'g, T: Float, X: Tree<T> + ?Sized, F>(graph: &'g mut Graph<T>, x: &'g X, f: F) -> Result<Vec<Tensor<T>>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Grad, location);
        let y = f(s, x.record(None, &mut leaves));
        y.value()?;
        let sy = y.shape();
        let mut blocks = blocks("jacobian", sy, &leaves.xs, location)?;
        let mut e = zeroed("jacobian", sy, sy.numel(), location)?;
        for i in 0..sy.numel() {
            e[i] = T::ONE;
            let seed = s.tensor(&e, &sy.to_vec());
            e[i] = T::ZERO;
            let rows = gradients(s, y, Some(seed), &leaves.xs)?;
            for ((_, data), row) in blocks.iter_mut().zip(rows) {
                let n = row.shape().numel();
                data[i * n..(i + 1) * n].copy_from_slice(row.value()?);
            }
        }
        Ok(blocks.into_iter().map(|(shape, data)| Tensor::from_parts(data, shape)).collect())
    })
}

/// The Jacobian of `f` by forward mode, in the blocks and shapes of [`jacobian`]: one
/// tangent per element of the differentiated leaves (JAX's `jacfwd`), the other leaves'
/// tangents zero, so meant for small inputs and tall outputs.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::{func::tree::{jacfwd, Frozen}, Tensor};
/// let (a, b, c) = (Tensor::from_vec(vec![1.0f64, 2.0], &[2])?, Tensor::from_vec(vec![3.0], &[1])?, Tensor::from_vec(vec![5.0], &[1])?);
/// let mut graph = tapir::Graph::new();
/// // c is frozen, so it has no block: ∂(a b₀ c₀)/∂a = b₀c₀ I, ∂/∂b = a c₀
/// let j = jacfwd(&mut graph, &(&a, &b, Frozen(&c)), |_, (a, b, c)| a * b * c)?;
/// assert_eq!(j.len(), 2);
/// assert_eq!((j[0].data(), j[1].data()), (&[15.0, 0.0, 0.0, 15.0][..], &[5.0, 10.0][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`jacobian`]; [`Error::ForwardUnsupported`] through a custom op without a
/// forward rule.
#[track_caller]
pub fn jacfwd<'g, T: Float, X: Tree<T> + ?Sized, F>(graph: &'g mut Graph<T>, x: &'g X, f: F) -> Result<Vec<Tensor<T>>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Grad, location);
        let y = f(s, x.record(None, &mut leaves));
        y.value()?;
        let mut blocks = blocks("jacfwd", y.shape(), &leaves.xs, location)?;
        let shapes: Vec<Shape> = leaves.xs.iter().map(|v| v.shape()).collect();
        for (k, &sk) in shapes.iter().enumerate() {
            let n = sk.numel();
            let mut e = zeroed("jacfwd", sk, n, location)?;
            for j in 0..n {
                e[j] = T::ONE;
                let seeds = shapes
                    .iter()
                    .enumerate()
                    .map(|(l, sl)| if l == k { s.tensor(&e, &sk.to_vec()) } else { s.zeros(&sl.to_vec()) })
                    .collect();
                e[j] = T::ZERO;
                let column = s.forward(|level| {
                    let mut leaves = Leaves::new(s, Mode::Dual(level), location);
                    leaves.seeds = seeds;
                    let y = f(s, x.record(None, &mut leaves));
                    s.tangent_at(level, y, location)
                });
                let data = &mut blocks[k].1;
                for (i, &v) in column.value()?.iter().enumerate() {
                    data[i * n + j] = v;
                }
            }
        }
        Ok(blocks.into_iter().map(|(shape, data)| Tensor::from_parts(data, shape)).collect())
    })
}

/// The Hessian of a one-element `f` in blocks: `h[i][j]` holds `∂²f/∂xᵢ∂xⱼ` between the
/// differentiated leaves `i` and `j` (in the structure's order, [`Frozen`](super::Frozen)
/// parts left out), of shape leaf `i`'s followed by leaf `j`'s. The gradient is recorded
/// once, then each of its elements is differentiated, so meant for small inputs.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::Tensor;
/// let (a, b) = (Tensor::from_vec(vec![2.0f64], &[1])?, Tensor::from_vec(vec![3.0, 1.0], &[2])?);
/// let mut graph = tapir::Graph::new();
/// // f = a₀² Σb: H_aa = 2Σb, H_ab = [2a₀, 2a₀], H_bb = 0
/// let h = tapir::func::tree::hessian(&mut graph, &(&a, &b), |_, (a, b)| (a.square() * b).sum())?;
/// assert_eq!((h[0][0].data(), h[0][1].data()), (&[8.0][..], &[4.0, 4.0][..]));
/// assert_eq!((h[1][0].shape().dims(), h[1][1].data()), (&[2, 1][..], &[0.0; 4][..]));
/// # Ok(()) }
/// ```
///
/// # Errors
/// As for [`jacobian`], and [`Error::NotScalar`] unless `f` has one element.
#[track_caller]
pub fn hessian<'g, T: Float, X: Tree<T> + ?Sized, F>(
    graph: &'g mut Graph<T>,
    x: &'g X,
    f: F,
) -> Result<Vec<Vec<Tensor<T>>>>
where
    F: for<'s> Fn(&'s Scope<'s, 'g, T>, X::Map<Var<'s, T>>) -> Var<'s, T>,
{
    let location = Location::caller();
    graph.scope(|s| {
        let mut leaves = Leaves::new(s, Mode::Grad, location);
        let y = f(s, x.record(None, &mut leaves));
        if y.value()?.len() != 1 {
            return Err(Error::NotScalar { op: "hessian", shape: y.shape(), location });
        }
        let xs = &leaves.xs;
        let mut rows = Vec::with_capacity(xs.len());
        for xi in xs {
            rows.push(blocks("hessian", xi.shape(), xs, location)?);
        }
        let gs = gradients(s, y, None, xs)?;
        for (g, row) in gs.iter().zip(&mut rows) {
            let n = g.shape().numel();
            let flat = g.reshape(&[n]);
            for e in 0..n {
                let second = gradients(s, flat.narrow(0, e, 1).sum(), None, xs)?;
                for ((_, data), h) in row.iter_mut().zip(second) {
                    let m = h.shape().numel();
                    data[e * m..(e + 1) * m].copy_from_slice(h.value()?);
                }
            }
        }
        Ok(rows
            .into_iter()
            .map(|row| row.into_iter().map(|(shape, data)| Tensor::from_parts(data, shape)).collect())
            .collect())
    })
}

/// Zeroed blocks of shape `front` followed by each of `xs`' shapes, allocated fallibly.
fn blocks<T: Float>(op: &'static str, front: Shape, xs: &[Var<'_, T>], location: Loc) -> Result<Vec<(Shape, Vec<T>)>> {
    xs.iter()
        .map(|x| {
            let shape = joined(op, front, x.shape(), location)?;
            Ok((shape, zeroed(op, shape, shape.numel(), location)?))
        })
        .collect()
}
