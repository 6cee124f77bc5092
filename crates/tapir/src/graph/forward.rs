//! Forward mode at scope level: [`Scope::forward`] opens a level, [`Scope::dual`] seeds a
//! tangent, [`Scope::tangent`] reads one, and [`Scope::jvp`] does all three for a
//! function (PyTorch's `torch.autograd.forward_ad` levels and `make_dual`/`unpack_dual`,
//! JAX's `jvp`). The tangent rules and their propagation are `ops::jvp` and
//! `engine/jvp.rs`; how tangents are stored is `record::handles::Tangents`.

use std::marker::PhantomData;
use std::panic::Location;

use crate::dtype::Float;
use crate::engine::jvp::propagate;
use crate::error::{Error, Loc};
use crate::record::handles::{JvpHook, Replay, Scope, Var};
use crate::tape::id::NodeMap;
use crate::tape::op::Op;

/// A forward-mode level of a scope, opened by [`Scope::forward`]: the handle that seeds
/// and reads its tangents. `Copy`, branded with the scope like a [`Var`], and valid while
/// the closure that opened it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Level<'s> {
    index: u32,
    generation: u32,
    _brand: PhantomData<fn(&'s ()) -> &'s ()>,
}

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Runs `f` with a new forward-mode level open: every op recorded meanwhile whose
    /// inputs carry tangents at the level (seeded with [`dual`](Scope::dual)) records its
    /// output's tangent too, with its forward rule, as ordinary ops on this tape. Tangents
    /// are therefore differentiable: [`grad`](Scope::grad) of a tangent is reverse over
    /// forward, and a level opened inside another is carried by it (forward over forward).
    /// [`grad`](Scope::grad) called inside `f` records its gradient ops with tangents too
    /// (forward over reverse: a Hessian-vector product at the cost of about one gradient).
    ///
    /// Inside [`no_grad`](Scope::no_grad), [`detach`](Var::detach)ed values, random draws
    /// and constants carry no tangent. A scope with no level open pays nothing for forward
    /// mode: no tangent table exists and nodes carry no tangent field.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::from_vec(vec![0.5f64, 2.0], &[2])?;
    /// let v = tapir::Tensor::from_vec(vec![1.0, 0.0], &[2])?;
    /// let mut g = tapir::Graph::<f64>::new();
    /// let jv = g.scope(|s| {
    ///     s.forward(|level| {
    ///         let x = s.dual(level, s.leaf(&x), s.input(&v));
    ///         let y = x.sin() * x; // dy = (cos x · x + sin x) dx
    ///         s.tangent(level, y).value().map(|t| t.to_vec())
    ///     })
    /// })?;
    /// assert!((jv[0] - (0.5f64.cos() * 0.5 + 0.5f64.sin())).abs() < 1e-15);
    /// assert_eq!(jv[1], 0.0);
    /// # Ok(()) }
    /// ```
    pub fn forward<R>(&'s self, f: impl FnOnce(Level<'s>) -> R) -> R {
        struct Close<'a, 's, 'g: 's, T: Float>(&'a Scope<'s, 'g, T>);
        impl<T: Float> Drop for Close<'_, '_, '_, T> {
            fn drop(&mut self) {
                let mut tape = self.0.core.tape.borrow_mut();
                let t = &mut tape.tangents;
                t.levels.pop();
                t.generations.pop();
                t.cut = t.levels.len();
                // The record path clears `slow` on its next slow-path call if nothing else needs it.
            }
        }
        let level = {
            let mut tape = self.core.tape.borrow_mut();
            let replay: &'s (dyn Replay<'s, T> + 's) = self;
            let hook: JvpHook<T> = propagate::<T>;
            let t = &mut tape.tangents;
            t.hook.get_or_insert((hook, replay));
            t.levels.push(NodeMap::default());
            let generation = t.generation;
            t.generation = t.generation.wrapping_add(1);
            t.generations.push(generation);
            t.cut = t.levels.len();
            let index = u32::try_from(t.levels.len() - 1).expect("fewer levels than nested closures");
            tape.slow = true;
            Level { index, generation, _brand: PhantomData }
        };
        let _close = Close(self);
        f(level)
    }

    /// `x` with tangent `t` at `level`: a new node equal to `x` (no copy) whose tangent is
    /// `t`, from which the ops recorded under `level` carry tangents. Outer levels see it
    /// as `x`. PyTorch's `make_dual`.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] (recorded) unless `t` has `x`'s shape;
    /// [`Error::InvalidArgument`] if `level` has closed.
    #[track_caller]
    pub fn dual(&'s self, level: Level<'s>, x: Var<'s, T>, t: Var<'s, T>) -> Var<'s, T> {
        self.dual_at(level, x, t, Location::caller())
    }

    pub(crate) fn dual_at(&'s self, level: Level<'s>, x: Var<'s, T>, t: Var<'s, T>, location: Loc) -> Var<'s, T> {
        let Some(index) = self.open(level, "dual", location) else { return self.core.poison() };
        let (sx, st) = (x.shape(), t.shape());
        if sx != st {
            return self.core.fail(Error::ShapeMismatch { op: "dual", lhs: sx, rhs: st, location });
        }
        // Recorded with this level and the inner ones suspended: its tangent here is `t`.
        let cut = std::mem::replace(&mut self.core.tape.borrow_mut().tangents.cut, index);
        let d = self.core.record_at("dual", location, |r| Ok((Op::Reshape { x: x.id }, sx, r.value(x.id))));
        let mut tape = self.core.tape.borrow_mut();
        tape.tangents.cut = cut;
        if tape.error.is_none() {
            tape.tangents.set(index, d.id, t.id);
        }
        d
    }

    /// The tangent of `y` at `level`: zeros of `y`'s shape if nothing seeded at `level`
    /// reaches it. PyTorch's `unpack_dual(y).tangent`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (recorded) if `level` has closed.
    #[track_caller]
    pub fn tangent(&'s self, level: Level<'s>, y: Var<'s, T>) -> Var<'s, T> {
        self.tangent_at(level, y, Location::caller())
    }

    pub(crate) fn tangent_at(&'s self, level: Level<'s>, y: Var<'s, T>, location: Loc) -> Var<'s, T> {
        let Some(index) = self.open(level, "tangent", location) else { return self.core.poison() };
        let t = self.core.tape.borrow().tangents.get(index, y.id);
        match t {
            Some(id) => Var { core: &self.core, id },
            None => self.core.record_at("tangent", location, |r| {
                let shape = r.shape(y.id);
                Ok((Op::Leaf, shape, &*r.alloc(shape.numel())?))
            }),
        }
    }

    /// `f(xs)` and its Jacobian-vector product `J·ts` by forward mode: a level is opened,
    /// each `xs[i]` gets tangent `ts[i]`, and `f`'s output and its tangent are returned
    /// (JAX's `jax.jvp`, at about the cost of one more evaluation of `f`). Both are handles
    /// on this tape, so they compose: `jvp` inside `jvp` is forward over forward, `grad` of
    /// the tangent is reverse over forward.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::from_vec(vec![1.0f64, 2.0, 3.0], &[3])?;
    /// let v = tapir::Tensor::from_vec(vec![1.0, 1.0, 0.0], &[3])?;
    /// let mut g = tapir::Graph::<f64>::new();
    /// let jv = g.scope(|s| {
    ///     let (_, jv) = s.jvp([s.leaf(&x)], [s.input(&v)], |[x]| x.square()); // J = diag(2x)
    ///     jv.value().map(|t| t.to_vec())
    /// })?;
    /// assert_eq!(jv, [2.0, 4.0, 0.0]);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`dual`](Scope::dual) (recorded), and what `f` records wrongly.
    #[track_caller]
    pub fn jvp<const N: usize>(
        &'s self,
        xs: [Var<'s, T>; N],
        ts: [Var<'s, T>; N],
        f: impl FnOnce([Var<'s, T>; N]) -> Var<'s, T>,
    ) -> (Var<'s, T>, Var<'s, T>) {
        let location = Location::caller();
        self.forward(|level| {
            let mut duals = xs;
            for (d, t) in duals.iter_mut().zip(ts) {
                *d = self.dual_at(level, *d, t, location);
            }
            let y = f(duals);
            (y, self.tangent_at(level, y, location))
        })
    }

    /// `level`'s index if it is open, else records [`Error::InvalidArgument`] for `op`.
    fn open(&'s self, level: Level<'s>, op: &'static str, location: Loc) -> Option<usize> {
        let index = level.index as usize;
        let open = self.core.tape.borrow().tangents.generations.get(index) == Some(&level.generation);
        if open {
            return Some(index);
        }
        self.core.fail(Error::InvalidArgument {
            op,
            detail: "the forward-mode level has closed (use a level inside the Scope::forward closure that opened it)"
                .into(),
            location,
        });
        None
    }
}
