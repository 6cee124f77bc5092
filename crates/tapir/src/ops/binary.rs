//! Elementwise binary ops with NumPy broadcasting, one table: each row of
//! [`binary_fns!`] gives a function's variant, its name, its forward formula and the
//! derivative with respect to each input, side by side. Also the operators `+ - * /`
//! between handles and with scalars.
//!
//! Forward, for `out = f(a, b)` with `a` and `b` broadcast to `out`'s shape.
//! Backward, with `dout = ∂L/∂out`, summed over every dimension along which the input was
//! broadcast:
//!
//! | op         | `out`            | `da +=`                    | `db +=`                          |
//! |------------|------------------|----------------------------|----------------------------------|
//! | `add`      | `a + b`          | `dout`                     | `dout`                           |
//! | `sub`      | `a - b`          | `dout`                     | `-dout`                          |
//! | `mul`      | `a * b`          | `dout ⊙ b`                 | `dout ⊙ a`                       |
//! | `div`      | `a / b`          | `dout / b`                 | `-dout ⊙ a / b²`                 |
//! | `pow`      | `a ^ b`          | `dout ⊙ b ⊙ a^(b-1)`, 0 where `b = 0` | `dout ⊙ a^b ⊙ ln a` (0 where a ≤ 0) |
//! | `maximum`  | the larger       | `dout` where `a > b`, half on ties | `dout` where `b > a`, half on ties |
//! | `minimum`  | the smaller      | `dout` where `a < b`, half on ties | `dout` where `b < a`, half on ties |
//!
//! `maximum` and `minimum` propagate a NaN from either input, and a NaN input gets the
//! whole `dout`, as in PyTorch. Both inputs stay in the arena during backward, so nothing
//! extra is saved.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::kernels::binary_fn::BinaryFn;
use crate::kernels::{self, par, PairMap};
use crate::record::ctx::{BackwardCtx, GradCtx, JvpCtx, Rec};
use crate::record::handles::{Core, Var};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Op, OpKind};
use faer::Par;

/// Recording: equal shapes fill the output in one pass; broadcasting goes through the
/// broadcast kernel.
struct Record<'r, 'a, 's, T> {
    r: &'r Rec<'a, 's, T>,
    a: (&'s [T], Shape),
    b: (&'s [T], Shape),
    out: Shape,
    par: Par,
}

impl<'s, T: Float> PairMap<T> for Record<'_, '_, 's, T> {
    type Out = Result<&'s mut [T]>;
    #[inline]
    fn map(self, f: impl Fn(T, T) -> T + Sync) -> Self::Out {
        let ((a, sa), (b, sb), so) = (self.a, self.b, self.out);
        if sa == so && sb == so && so.numel() < par::MIN_PARALLEL {
            return self.r.alloc_iter(a.iter().zip(b).map(move |(&x, &y)| f(x, y)));
        }
        record_broadcast(self.r, (a, sa), (b, sb), so, self.par, f)
    }
}

/// A broadcast or a large recording, out of line so that the small equal-shape case stays
/// tight.
#[inline(never)]
fn record_broadcast<'s, T: Float>(
    r: &Rec<'_, 's, T>,
    (a, sa): (&[T], Shape),
    (b, sb): (&[T], Shape),
    so: Shape,
    threads: Par,
    f: impl Fn(T, T) -> T + Sync,
) -> Result<&'s mut [T]> {
    let out = r.alloc_written(so.numel())?;
    kernels::channel::binary(threads, (a, &sa), (b, &sb), (&mut *out, &so), f);
    Ok(out)
}

impl<'s, T: Float> Var<'s, T> {
    #[track_caller]
    #[inline]
    fn binary(self, other: Var<'s, T>, f: BinaryFn) -> Var<'s, T> {
        self.core.record(OpKind::Binary(f), |r| {
            let (sa, sb) = (r.shape(self.id), r.shape(other.id));
            let so = sa.broadcast(&sb).ok_or(Error::Broadcast { op: r.op, lhs: sa, rhs: sb, location: r.location })?;
            let (a, b) = ((r.value(self.id), sa), (r.value(other.id), sb));
            let out = f.forward(Record { r, a, b, out: so, par: self.core.par })?;
            Ok((Op::Binary { f, a: self.id, b: other.id }, so, out))
        })
    }

    /// `self ^ e` elementwise, with broadcasting.
    #[track_caller]
    pub fn pow(self, e: Var<'s, T>) -> Var<'s, T> {
        self.binary(e, BinaryFn::Pow)
    }

    /// The elementwise maximum, with broadcasting; on ties the gradient is split evenly,
    /// and a NaN in either input gives NaN.
    #[track_caller]
    pub fn maximum(self, other: Var<'s, T>) -> Var<'s, T> {
        self.binary(other, BinaryFn::Maximum)
    }

    /// The elementwise minimum, with broadcasting; on ties the gradient is split evenly,
    /// and a NaN in either input gives NaN.
    #[track_caller]
    pub fn minimum(self, other: Var<'s, T>) -> Var<'s, T> {
        self.binary(other, BinaryFn::Minimum)
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $variant:ident) => {
        impl<'s, T: Float> $trait for Var<'s, T> {
            type Output = Var<'s, T>;
            #[track_caller]
            fn $method(self, rhs: Var<'s, T>) -> Var<'s, T> {
                self.binary(rhs, BinaryFn::$variant)
            }
        }
    };
}

operator!(Add, add, Add);
operator!(Sub, sub, Sub);
operator!(Mul, mul, Mul);
operator!(Div, div, Div);

impl<'s, T: Float> Add<T> for Var<'s, T> {
    type Output = Var<'s, T>;
    #[track_caller]
    fn add(self, c: T) -> Var<'s, T> {
        self.add_scalar(c)
    }
}

impl<'s, T: Float> Sub<T> for Var<'s, T> {
    type Output = Var<'s, T>;
    #[track_caller]
    fn sub(self, c: T) -> Var<'s, T> {
        self.add_scalar(-c)
    }
}

impl<'s, T: Float> Mul<T> for Var<'s, T> {
    type Output = Var<'s, T>;
    #[track_caller]
    fn mul(self, c: T) -> Var<'s, T> {
        self.mul_scalar(c)
    }
}

impl<'s, T: Float> Div<T> for Var<'s, T> {
    type Output = Var<'s, T>;
    #[track_caller]
    fn div(self, c: T) -> Var<'s, T> {
        self.mul_scalar(T::ONE / c)
    }
}

impl<'s, T: Float> Neg for Var<'s, T> {
    type Output = Var<'s, T>;
    #[track_caller]
    fn neg(self) -> Var<'s, T> {
        self.neg_()
    }
}

macro_rules! scalar_lhs {
    ($t:ty) => {
        impl<'s> Add<Var<'s, $t>> for $t {
            type Output = Var<'s, $t>;
            #[track_caller]
            fn add(self, v: Var<'s, $t>) -> Var<'s, $t> {
                v.add_scalar(self)
            }
        }
        impl<'s> Sub<Var<'s, $t>> for $t {
            type Output = Var<'s, $t>;
            #[track_caller]
            fn sub(self, v: Var<'s, $t>) -> Var<'s, $t> {
                v.neg_().add_scalar(self)
            }
        }
        impl<'s> Mul<Var<'s, $t>> for $t {
            type Output = Var<'s, $t>;
            #[track_caller]
            fn mul(self, v: Var<'s, $t>) -> Var<'s, $t> {
                v.mul_scalar(self)
            }
        }
        impl<'s> Div<Var<'s, $t>> for $t {
            type Output = Var<'s, $t>;
            #[track_caller]
            fn div(self, v: Var<'s, $t>) -> Var<'s, $t> {
                v.recip().mul_scalar(self)
            }
        }
    };
}

scalar_lhs!(f32);
scalar_lhs!(f64);

/// `da += ∂f/∂a ⊙ dout` and `db += ∂f/∂b ⊙ dout`, each summed over its broadcast dimensions.
#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    f: BinaryFn,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    let (so, sa, sb) = (ctx.shape(out), ctx.shape(a), ctx.shape(b));
    let (va, vb, par) = (ctx.value(a), ctx.value(b), ctx.par);
    // `a`'s length, at hand, not the output's, which shape-`[1]` backward would pay to
    // compute; either path gives the same bits.
    if va.len() >= par::MIN_PARALLEL {
        return backward_large(ctx, out, f, (a, sa), (b, sb), so);
    }
    if let Some((dout, da)) = ctx.grad_pair(out, a)? {
        f.grad_a(par, (dout, &so), (va, &sa), (vb, &sb), (da, false));
    }
    // For `x * x`, `a == b`: this second pass adds the second contribution.
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        f.grad_b(par, (dout, &so), (va, &sa), (vb, &sb), (db, false));
    }
    Ok(())
}

/// [`backward`] when `a` is long enough to split over the threads: a first gradient is
/// written in the pass that computes it where the kernel can (the full-size operand of a
/// per-channel broadcast, as a conv bias has), instead of zero-filled and then added to.
#[inline(never)]
fn backward_large<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    f: BinaryFn,
    (a, sa): (NodeId<'s>, Shape),
    (b, sb): (NodeId<'s>, Shape),
    so: Shape,
) -> Result<()> {
    let (va, vb, par) = (ctx.value(a), ctx.value(b), ctx.par);
    if let Some((dout, da, first)) = ctx.grad_pair_write(out, a)? {
        f.grad_a(par, (dout, &so), (va, &sa), (vb, &sb), (da, first));
    }
    // For `x * x`, `a == b`: this second pass adds the second contribution.
    if let Some((dout, db, first)) = ctx.grad_pair_write(out, b)? {
        f.grad_b(par, (dout, &so), (va, &sa), (vb, &sb), (db, first));
    }
    Ok(())
}

/// Recorded derivative (see [`Scope::grad`](crate::Scope::grad)): the table's formulas as
/// ops, each summed back to its input's shape. `maximum` and `minimum` route `g` through
/// constant masks (1, 0, or ½ on ties), so their second derivative is 0 almost everywhere.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    f: BinaryFn,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    for (input, side) in [(a, Side::A), (b, Side::B)] {
        if ctx.wants(input) {
            let d = partial(ctx.core, "grad", f, side, g, (a, b, out));
            ctx.add_reduced(input, d);
        }
    }
    Ok(())
}

/// Forward rule: `t = ∂f/∂a ⊙ ta + ∂f/∂b ⊙ tb`, broadcast to the output's shape.
#[track_caller]
pub(crate) fn jvp<'s, T: Float>(
    ctx: &JvpCtx<'s, T>,
    out: NodeId<'s>,
    f: BinaryFn,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<Option<Var<'s, T>>> {
    let mut sum: Option<Var<'s, T>> = None;
    for (input, side) in [(a, Side::A), (b, Side::B)] {
        if let Some(t) = ctx.tangent(input) {
            let d = partial(ctx.core, "jvp", f, side, t, (a, b, out));
            sum = Some(match sum {
                Some(s) => s + d,
                None => d,
            });
        }
    }
    let so = ctx.shape(out);
    Ok(sum.map(|t| if t.shape() == so { t } else { t.broadcast_to(&so.to_array()[..so.rank()]) }))
}

/// Which operand a partial derivative is taken with respect to.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

/// `g ⊙ ∂f/∂side` (at `a`, `b`, with output `out`), in the broadcast shape of `g` and the
/// operands, as recorded ops: `g` is the output's gradient (reverse) or the operand's
/// tangent (forward), the Jacobian being diagonal after broadcasting.
/// Constants (masks) are recorded under `name`.
#[track_caller]
fn partial<'s, T: Float>(
    core: &'s Core<'s, T>,
    name: &'static str,
    f: BinaryFn,
    side: Side,
    g: Var<'s, T>,
    (a, b, out): (NodeId<'s>, NodeId<'s>, NodeId<'s>),
) -> Var<'s, T> {
    let var = |id| Var { core, id };
    let (va, vb, y) = (var(a), var(b), var(out));
    let (sa, sb, so) = {
        let tape = core.tape.borrow();
        (tape.shape(a), tape.shape(b), tape.shape(out))
    };
    // A constant of `out`'s shape computed from `a` and `b` elementwise.
    let mask = |m: fn(T, T) -> T| {
        core.constant(name, so, |tape, out| kernels::binary((tape.value(a), &sa), (tape.value(b), &sb), (out, &so), m))
    };
    match (f, side) {
        (BinaryFn::Add, _) | (BinaryFn::Sub, Side::A) => g,
        (BinaryFn::Sub, Side::B) => -g,
        (BinaryFn::Mul, Side::A) => g * vb,
        (BinaryFn::Mul, Side::B) => g * va,
        (BinaryFn::Div, Side::A) => g / vb,
        (BinaryFn::Div, Side::B) => -(g * va / vb.square()),
        (BinaryFn::Pow, Side::A) => {
            // b·a^(b−1), 0 where b = 0.
            let nonzero = mask(|_, b| if b == T::ZERO { T::ZERO } else { T::ONE });
            g * vb * va.pow(vb.add_scalar(-T::ONE)) * nonzero
        }
        (BinaryFn::Pow, Side::B) => {
            // a^b·ln a where a > 0, else 0; ln reads a where a > 0 and 1 elsewhere, so
            // that nothing infinite meets the mask's zeros.
            let pos = mask(|a, _| if a > T::ZERO { T::ONE } else { T::ZERO });
            let safe = va * pos - pos.add_scalar(-T::ONE);
            g * y * safe.log() * pos
        }
        // The table's `da` and `db` with dout = 1: ties split evenly.
        (BinaryFn::Maximum, Side::A) | (BinaryFn::Minimum, Side::B) => {
            g * mask(|a, b| {
                if a == b {
                    T::from_f64(0.5)
                } else if a < b {
                    T::ZERO
                } else {
                    T::ONE
                }
            })
        }
        (BinaryFn::Maximum, Side::B) | (BinaryFn::Minimum, Side::A) => {
            g * mask(|a, b| {
                if a == b {
                    T::from_f64(0.5)
                } else if a > b {
                    T::ZERO
                } else {
                    T::ONE
                }
            })
        }
    }
}
