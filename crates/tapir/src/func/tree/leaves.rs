//! The [`Tree`] trait, the walkers its methods take ([`Position`], [`Leaves`],
//! [`Gradients`]), [`Frozen`], and its implementations for tensors, references, tuples,
//! arrays and vectors. The parameter store's is in `params.rs`.

use std::fmt::{Display, Write as _};

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::graph::forward::Level;
use crate::record::handles::{Scope, Var};
use crate::shape::Shape;
use crate::tape::op::Op;
use crate::tensor::Tensor;

/// A structure of tensors that the [`func::tree`](crate::func::tree) transforms take as
/// their input and give back, with the same structure, as gradients (JAX's pytrees).
///
/// A structure has leaves, its tensors, in a fixed order. [`Map<L>`](Tree::Map) is the same
/// structure with a leaf of type `L` in place of each tensor: the transformed function
/// receives a `Map<Var<'s, T>>`, a handle per tensor. [`Grads`](Tree::Grads) is the
/// structure of the gradients, which is also the structure of the tangents that
/// [`jvp`](crate::func::tree::jvp) and [`hvp`](crate::func::tree::hvp) take:
///
/// | input | `Map<L>` | `Grads` |
/// |---|---|---|
/// | [`Tensor<T>`] | `L` | `Tensor<T>` |
/// | `&X` | `X::Map<L>` | `X::Grads` |
/// | `(A, B)` (up to four) | `(A::Map<L>, B::Map<L>)` | `(A::Grads, B::Grads)` |
/// | `[X; N]`, `Vec<X>` | `[X::Map<L>; N]`, `Vec<X::Map<L>>` | `[X::Grads; N]`, `Vec<X::Grads>` |
/// | [`ParamStore<T>`](crate::ParamStore) | [`ParamVars<L>`](crate::func::tree::ParamVars) | [`GradBuffer<T>`](crate::GradBuffer) |
/// | [`Frozen<X>`] | `X::Map<L>` | `()`: not differentiated |
/// | `S<Tensor<T>>`, `#[derive(Tree)]` | `S<L>` | `S<Tensor<T>>` |
///
/// The derive (cargo feature `derive`) takes a struct with one type parameter, the leaf,
/// whose every field is a structure of it (`L`, `Vec<L>`, `[L; 3]`, another derived
/// struct); see the [module](crate::func::tree) for an example. By hand, an
/// implementation visits its parts in the same order in all three methods and names
/// each part with [`Position::at`], as the tuple implementation does:
///
/// ```
/// use tapir::func::tree::{Gradients, Leaves, Position, Tree};
/// use tapir::{Float, Result, Tensor};
///
/// /// A weight and a bias.
/// struct Affine<T: Float> { w: Tensor<T>, b: Tensor<T> }
///
/// impl<T: Float> Tree<T> for Affine<T> {
///     type Map<L> = (L, L);
///     type Grads = (Tensor<T>, Tensor<T>);
///     fn check(&self, t: &Self::Grads, at: &mut Position) -> Result<()> {
///         at.at(".w", |at| self.w.check(&t.0, at))?;
///         at.at(".b", |at| self.b.check(&t.1, at))
///     }
///     fn record<'s, 'g>(&'g self, t: Option<&'g Self::Grads>, leaves: &mut Leaves<'s, 'g, T>) -> (tapir::Var<'s, T>, tapir::Var<'s, T>) {
///         (self.w.record(t.map(|t| &t.0), leaves), self.b.record(t.map(|t| &t.1), leaves))
///     }
///     fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<Self::Grads> {
///         Ok((self.w.grads(g)?, self.b.grads(g)?))
///     }
/// }
///
/// # fn main() -> Result<()> {
/// let a = Affine { w: Tensor::from_vec(vec![2.0f64], &[1])?, b: Tensor::from_vec(vec![1.0], &[1])? };
/// let mut graph = tapir::Graph::new();
/// let (dw, db) = tapir::func::tree::grad(&mut graph, &a, |_, (w, b)| (w * 3.0 + b).square().sum())?;
/// assert_eq!((dw.data(), db.data()), (&[42.0][..], &[14.0][..])); // 2(3w + b)·3, 2(3w + b)
/// # Ok(()) }
/// ```
pub trait Tree<T: Float> {
    /// The same structure with a leaf of type `L` in place of each tensor.
    type Map<L>;
    /// The structure of the gradients and tangents.
    type Grads;

    /// Checks that `t` has this structure (lengths, shapes, stores).
    ///
    /// # Errors
    /// [`Error::Structure`] naming the first part that differs (through `at`).
    fn check(&self, t: &Self::Grads, at: &mut Position) -> Result<()>;

    /// Records each tensor with [`Leaves::leaf`], in the structure's order, with the
    /// matching tensor of `t` (checked beforehand by [`check`](Tree::check)) as its tangent.
    fn record<'s, 'g>(&'g self, t: Option<&'g Self::Grads>, leaves: &mut Leaves<'s, 'g, T>) -> Self::Map<Var<'s, T>>;

    /// Builds the gradients, taking one from `g` per leaf that [`record`](Tree::record)
    /// recorded unfrozen, in the same order.
    ///
    /// # Errors
    /// What [`Gradients::next`] reports.
    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<Self::Grads>;
}

/// Where a structure check is, for its error: the transform, the path from the input
/// (`input.1[3]`) and the caller's location.
#[derive(Debug)]
pub struct Position {
    op: &'static str,
    path: String,
    location: Loc,
}

impl Position {
    pub(crate) fn new(op: &'static str, location: Loc) -> Position {
        Position { op, path: "input".into(), location }
    }

    /// Runs `f` with `segment` (`.0`, `[3]`, `.w`) appended to the path.
    pub fn at<R>(&mut self, segment: impl Display, f: impl FnOnce(&mut Position) -> R) -> R {
        let len = self.path.len();
        write!(self.path, "{segment}").expect("writing to a String cannot fail");
        let r = f(self);
        self.path.truncate(len);
        r
    }

    /// An [`Error::Structure`] at this position saying `detail`.
    pub fn mismatch(&self, detail: impl Into<String>) -> Error {
        Error::Structure { op: self.op, position: self.path.clone(), detail: detail.into(), location: self.location }
    }

    /// `Ok` if a tensor of shape `input` and one of shape `other` match here.
    ///
    /// # Errors
    /// [`Error::Structure`] with both shapes otherwise.
    pub fn shapes(&self, input: Shape, other: Shape) -> Result<()> {
        if input == other {
            return Ok(());
        }
        Err(self.mismatch(format!("the tangent has shape {other} where the input has shape {input}")))
    }

    /// `Ok` if two lists of lengths `input` and `other` match here.
    ///
    /// # Errors
    /// [`Error::Structure`] with both lengths otherwise.
    pub fn lengths(&self, input: usize, other: usize) -> Result<()> {
        if input == other {
            return Ok(());
        }
        Err(self.mismatch(format!("the tangent has {other} elements where the input has {input}")))
    }
}

/// What a leaf becomes: a gradient-requesting leaf, a dual number, or a leaf with its
/// tangent kept beside it (for `hvp`'s inner product).
#[derive(Clone, Copy)]
pub(crate) enum Mode<'s> {
    Grad,
    Dual(Level<'s>),
    Pair,
}

/// Records the tensors of a structure as leaves of a scope ([`Tree::record`]).
pub struct Leaves<'s, 'g, T: Float> {
    scope: &'s Scope<'s, 'g, T>,
    mode: Mode<'s>,
    frozen: u32,
    /// The differentiated leaves, in order, and (in `Pair` mode) their tangents.
    pub(crate) xs: Vec<Var<'s, T>>,
    pub(crate) ts: Vec<Var<'s, T>>,
    /// Tangents for the differentiated leaves in order (`jacfwd`'s one-hot seeds), used in
    /// `Dual` mode where no tangent structure is given.
    pub(crate) seeds: Vec<Var<'s, T>>,
    location: Loc,
}

impl<'s, 'g, T: Float> Leaves<'s, 'g, T> {
    pub(crate) fn new(scope: &'s Scope<'s, 'g, T>, mode: Mode<'s>, location: Loc) -> Self {
        Leaves { scope, mode, frozen: 0, xs: Vec::new(), ts: Vec::new(), seeds: Vec::new(), location }
    }

    /// The scope being recorded on.
    pub fn scope(&self) -> &'s Scope<'s, 'g, T> {
        self.scope
    }

    /// Runs `f` with every leaf it records frozen: a constant, not differentiated.
    pub fn frozen<R>(&mut self, f: impl FnOnce(&mut Self) -> R) -> R {
        self.frozen += 1;
        let r = f(self);
        self.frozen -= 1;
        r
    }

    /// Records `x` (borrowed, not copied), with tangent `t` (zeros if `None`).
    pub fn leaf(&mut self, x: &'g Tensor<T>, t: Option<&'g Tensor<T>>) -> Var<'s, T> {
        self.slices(x.shape(), x.data(), t.map(|t| (t.shape(), t.data())))
    }

    /// [`leaf`](Leaves::leaf) from a shape and elements (a gradient buffer's slot).
    pub(crate) fn slices(&mut self, shape: Shape, data: &'g [T], t: Option<(Shape, &'g [T])>) -> Var<'s, T> {
        let (s, core) = (self.scope, &self.scope.core);
        if self.frozen > 0 {
            return core.leaf(Op::Leaf, shape, data);
        }
        let seed = self.seeds.get(self.xs.len()).copied();
        let tangent = |core: &'s crate::record::handles::Core<'s, T>| match (t, seed) {
            (Some((ts, td)), _) => core.leaf(Op::Leaf, ts, td),
            (None, Some(seed)) => seed,
            (None, None) => s.zeros(&shape.to_array()[..shape.rank()]),
        };
        match self.mode {
            Mode::Grad => {
                let x = core.leaf(Op::Variable, shape, data);
                self.xs.push(x);
                x
            }
            Mode::Pair => {
                let x = core.leaf(Op::Variable, shape, data);
                self.xs.push(x);
                self.ts.push(tangent(core));
                x
            }
            Mode::Dual(level) => {
                // Gradient-requesting, so that the function may take gradients with
                // respect to its inputs (`jvp` of a gradient is forward over reverse).
                let x = core.leaf(Op::Variable, shape, data);
                let d = s.dual_at(level, x, tangent(core), self.location);
                self.xs.push(d);
                d
            }
        }
    }

    /// A poisoned handle for a part that cannot be recorded.
    pub(crate) fn poison(&self) -> Var<'s, T> {
        self.scope.core.poison()
    }
}

/// The gradients of a structure's differentiated leaves, handed out in order to
/// [`Tree::grads`].
pub struct Gradients<'a, 's, T: Float> {
    grads: &'a [Var<'s, T>],
    next: usize,
    op: &'static str,
    location: Loc,
}

impl<'a, 's, T: Float> Gradients<'a, 's, T> {
    pub(crate) fn new(grads: &'a [Var<'s, T>], op: &'static str, location: Loc) -> Self {
        Gradients { grads, next: 0, op, location }
    }

    /// The next gradient as a handle.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if a hand-written [`Tree`] asks for more gradients than
    /// it recorded leaves.
    pub fn next_var(&mut self) -> Result<Var<'s, T>> {
        let g = self.grads.get(self.next).copied().ok_or_else(|| Error::InvalidArgument {
            op: self.op,
            detail: format!("the structure asked for gradient {} but recorded {} leaves", self.next, self.grads.len()),
            location: self.location,
        })?;
        self.next += 1;
        Ok(g)
    }

    /// The next gradient, copied into an owned tensor.
    ///
    /// # Errors
    /// As [`next_var`](Gradients::next_var); what the scope recorded wrongly;
    /// [`Error::TensorOutOfMemory`] if the copy cannot be allocated.
    #[allow(clippy::should_implement_trait)] // fallible, unlike `Iterator::next`
    pub fn next(&mut self) -> Result<Tensor<T>> {
        let g = self.next_var()?;
        super::super::owned(self.op, g, self.location)
    }
}

impl<T: Float> Tree<T> for Tensor<T> {
    type Map<L> = L;
    type Grads = Tensor<T>;

    fn check(&self, t: &Tensor<T>, at: &mut Position) -> Result<()> {
        at.shapes(self.shape(), t.shape())
    }

    fn record<'s, 'g>(&'g self, t: Option<&'g Tensor<T>>, leaves: &mut Leaves<'s, 'g, T>) -> Var<'s, T> {
        leaves.leaf(self, t)
    }

    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<Tensor<T>> {
        g.next()
    }
}

impl<T: Float, X: Tree<T> + ?Sized> Tree<T> for &X {
    type Map<L> = X::Map<L>;
    type Grads = X::Grads;

    fn check(&self, t: &X::Grads, at: &mut Position) -> Result<()> {
        (**self).check(t, at)
    }

    fn record<'s, 'g>(&'g self, t: Option<&'g X::Grads>, leaves: &mut Leaves<'s, 'g, T>) -> X::Map<Var<'s, T>> {
        (**self).record(t, leaves)
    }

    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<X::Grads> {
        (**self).grads(g)
    }
}

/// A part of a structure that is passed to the function but not differentiated (JAX's
/// `argnums` leaves it out; here it is marked): its tensors are recorded as constants
/// ([`Scope::input`]), its gradient is `()`, and so is its tangent for `jvp` and `hvp`.
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::func::tree::{grad, Frozen};
/// let (x, c) = (tapir::Tensor::from_vec(vec![2.0f64], &[1])?, tapir::Tensor::from_vec(vec![5.0], &[1])?);
/// let mut graph = tapir::Graph::new();
/// let (dx, ()) = grad(&mut graph, &(&x, Frozen(&c)), |_, (x, c)| (x * c).sum())?;
/// assert_eq!(dx.data(), &[5.0]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Frozen<X>(pub X);

impl<T: Float, X: Tree<T>> Tree<T> for Frozen<X> {
    type Map<L> = X::Map<L>;
    type Grads = ();

    fn check(&self, _: &(), _: &mut Position) -> Result<()> {
        Ok(())
    }

    fn record<'s, 'g>(&'g self, _: Option<&'g ()>, leaves: &mut Leaves<'s, 'g, T>) -> X::Map<Var<'s, T>> {
        leaves.frozen(|l| self.0.record(None, l))
    }

    fn grads(&self, _: &mut Gradients<'_, '_, T>) -> Result<()> {
        Ok(())
    }
}

macro_rules! tuple {
    ($($x:ident $i:tt),+) => {
        impl<T: Float, $($x: Tree<T>),+> Tree<T> for ($($x,)+) {
            type Map<L> = ($($x::Map<L>,)+);
            type Grads = ($($x::Grads,)+);

            fn check(&self, t: &Self::Grads, at: &mut Position) -> Result<()> {
                $(at.at(concat!(".", stringify!($i)), |at| self.$i.check(&t.$i, at))?;)+
                Ok(())
            }

            fn record<'s, 'g>(&'g self, t: Option<&'g Self::Grads>, leaves: &mut Leaves<'s, 'g, T>) -> Self::Map<Var<'s, T>> {
                ($(self.$i.record(t.map(|t| &t.$i), leaves),)+)
            }

            fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<Self::Grads> {
                Ok(($(self.$i.grads(g)?,)+))
            }
        }
    };
}

tuple!(A 0);
tuple!(A 0, B 1);
tuple!(A 0, B 1, C 2);
tuple!(A 0, B 1, C 2, D 3);

impl<T: Float, X: Tree<T>> Tree<T> for Vec<X> {
    type Map<L> = Vec<X::Map<L>>;
    type Grads = Vec<X::Grads>;

    fn check(&self, t: &Vec<X::Grads>, at: &mut Position) -> Result<()> {
        at.lengths(self.len(), t.len())?;
        self.iter().zip(t).enumerate().try_for_each(|(i, (x, t))| at.at(format_args!("[{i}]"), |at| x.check(t, at)))
    }

    fn record<'s, 'g>(
        &'g self,
        t: Option<&'g Vec<X::Grads>>,
        leaves: &mut Leaves<'s, 'g, T>,
    ) -> Vec<X::Map<Var<'s, T>>> {
        let t = |i: usize| t.and_then(|t| t.get(i));
        self.iter().enumerate().map(|(i, x)| x.record(t(i), leaves)).collect()
    }

    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<Vec<X::Grads>> {
        self.iter().map(|x| x.grads(g)).collect()
    }
}

impl<T: Float, X: Tree<T>, const N: usize> Tree<T> for [X; N] {
    type Map<L> = [X::Map<L>; N];
    type Grads = [X::Grads; N];

    fn check(&self, t: &[X::Grads; N], at: &mut Position) -> Result<()> {
        self.iter().zip(t).enumerate().try_for_each(|(i, (x, t))| at.at(format_args!("[{i}]"), |at| x.check(t, at)))
    }

    fn record<'s, 'g>(
        &'g self,
        t: Option<&'g [X::Grads; N]>,
        leaves: &mut Leaves<'s, 'g, T>,
    ) -> [X::Map<Var<'s, T>>; N] {
        std::array::from_fn(|i| self[i].record(t.map(|t| &t[i]), leaves))
    }

    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<[X::Grads; N]> {
        let v: Vec<X::Grads> = self.iter().map(|x| x.grads(g)).collect::<Result<_>>()?;
        Ok(v.try_into().unwrap_or_else(|_| unreachable!("an array of N gives N gradients")))
    }
}
