//! Elementwise binary ops with NumPy broadcasting: `add`, `sub`, `mul`, `div`, `pow`,
//! `maximum`, `minimum`, and the operators `+ - * /` between handles and with scalars.
//!
//! Forward, for `out = f(a, b)` with `a` and `b` broadcast to `out`'s shape.
//! Backward, with `dout = ∂L/∂out`, summed over every dimension along which the input was
//! broadcast:
//!
//! | op        | `da +=`                    | `db +=`                          |
//! |-----------|----------------------------|----------------------------------|
//! | `a + b`   | `dout`                     | `dout`                           |
//! | `a - b`   | `dout`                     | `-dout`                          |
//! | `a * b`   | `dout ⊙ b`                 | `dout ⊙ a`                       |
//! | `a / b`   | `dout / b`                 | `-dout ⊙ a / b²`                 |
//! | `a ^ b`   | `dout ⊙ b ⊙ a^(b-1)`       | `dout ⊙ a^b ⊙ ln a` (0 where a ≤ 0) |
//! | `max`     | `dout` where `a > b`, half on ties | `dout` where `b > a`, half on ties |
//!
//! Both inputs stay in the arena during backward, so nothing extra is saved.

use std::ops::{Add, Div, Mul, Neg, Sub};

use crate::error::{Error, Result};
use crate::graph::backward::BackwardCtx;
use crate::graph::{NodeId, Var};
use crate::kernels;
use crate::ops::Op;
use crate::Float;

impl<'s, T: Float> Var<'s, T> {
    #[track_caller]
    #[inline]
    fn binary(
        self,
        other: Var<'s, T>,
        name: &'static str,
        op: fn(NodeId<'s>, NodeId<'s>) -> Op<'s, T>,
        f: impl Fn(T, T) -> T,
    ) -> Var<'s, T> {
        self.core.record(name, |r| {
            let (sa, sb) = (r.shape(self.id), r.shape(other.id));
            let so = sa.broadcast(&sb).ok_or(Error::Broadcast { op: name, lhs: sa, rhs: sb, location: r.location })?;
            let (a, b) = (r.value(self.id), r.value(other.id));
            let out = if sa == so && sb == so {
                r.alloc_iter(a.iter().zip(b).map(|(&x, &y)| f(x, y)))?
            } else {
                let out = r.alloc(so.numel())?;
                kernels::binary((a, &sa), (b, &sb), (&mut *out, &so), f);
                out
            };
            Ok((op(self.id, other.id), so, out))
        })
    }

    /// `self ^ e` elementwise, with broadcasting.
    #[track_caller]
    pub fn pow(self, e: Var<'s, T>) -> Var<'s, T> {
        self.binary(e, "pow", |a, b| Op::Pow { a, b }, |x, y| x.powf(y))
    }

    /// The elementwise maximum, with broadcasting; on ties the gradient is split evenly.
    #[track_caller]
    pub fn maximum(self, other: Var<'s, T>) -> Var<'s, T> {
        self.binary(other, "maximum", |a, b| Op::Maximum { a, b }, |x, y| if y > x { y } else { x })
    }

    /// The elementwise minimum, with broadcasting; on ties the gradient is split evenly.
    #[track_caller]
    pub fn minimum(self, other: Var<'s, T>) -> Var<'s, T> {
        self.binary(other, "minimum", |a, b| Op::Minimum { a, b }, |x, y| if y < x { y } else { x })
    }
}

macro_rules! operator {
    ($trait:ident, $method:ident, $name:literal, $variant:ident, $f:expr) => {
        impl<'s, T: Float> $trait for Var<'s, T> {
            type Output = Var<'s, T>;
            #[track_caller]
            fn $method(self, rhs: Var<'s, T>) -> Var<'s, T> {
                self.binary(rhs, $name, |a, b| Op::$variant { a, b }, $f)
            }
        }
    };
}

operator!(Add, add, "add", Add, |x, y| x + y);
operator!(Sub, sub, "sub", Sub, |x, y| x - y);
operator!(Mul, mul, "mul", Mul, |x, y| x * y);
operator!(Div, div, "div", Div, |x, y| x / y);

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

/// Runs `ga` into `da` and `gb` into `db`: `g(dout, this input, the other input)`.
fn backward_with<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
    ga: impl Fn(T, T, T) -> T,
    gb: impl Fn(T, T, T) -> T,
) -> Result<()> {
    let (so, sa, sb) = (ctx.shape(out), ctx.shape(a), ctx.shape(b));
    let (va, vb) = (ctx.value(a), ctx.value(b));
    if let Some((dout, da)) = ctx.grad_pair(out, a)? {
        kernels::binary_grad((dout, &so), (va, &sa), (vb, &sb), da, ga);
    }
    // For `x * x`, `a == b`: this second pass adds the second contribution.
    if let Some((dout, db)) = ctx.grad_pair(out, b)? {
        kernels::binary_grad((dout, &so), (vb, &sb), (va, &sa), db, gb);
    }
    Ok(())
}

pub(crate) fn backward_add<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    backward_with(ctx, out, a, b, |d, _, _| d, |d, _, _| d)
}

pub(crate) fn backward_sub<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    backward_with(ctx, out, a, b, |d, _, _| d, |d, _, _| -d)
}

pub(crate) fn backward_mul<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    backward_with(ctx, out, a, b, |d, _, y| d * y, |d, _, x| d * x)
}

pub(crate) fn backward_div<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    backward_with(ctx, out, a, b, |d, _, y| d / y, |d, y, x| -d * x / (y * y))
}

pub(crate) fn backward_pow<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
) -> Result<()> {
    backward_with(
        ctx,
        out,
        a,
        b,
        |d, x, e| if e == T::ZERO { T::ZERO } else { d * e * x.powf(e - T::ONE) },
        |d, e, x| if x > T::ZERO { d * x.powf(e) * x.ln() } else { T::ZERO },
    )
}

/// Maximum (`max == true`) or minimum: the gradient goes to the selected input, half each on ties.
pub(crate) fn backward_select<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    a: NodeId<'s>,
    b: NodeId<'s>,
    max: bool,
) -> Result<()> {
    let half = T::from_f64(0.5);
    let pick = move |d: T, this: T, other: T| {
        if this == other {
            d * half
        } else if (this > other) == max {
            d
        } else {
            T::ZERO
        }
    };
    backward_with(ctx, out, a, b, pick, pick)
}
