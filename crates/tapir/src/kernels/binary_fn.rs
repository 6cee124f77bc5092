//! The table of elementwise binary functions ([`BinaryFn`]): each row of `binary_fns!`
//! gives a function's variant, its name, its forward formula and the derivative with
//! respect to each input, side by side. Scalar math and the broadcasting loops only: the
//! recording methods and the derivatives' bookkeeping are in `ops/binary.rs`, whose module
//! doc tabulates the formulas.

use faer::Par;

use crate::dtype::Float;
use crate::kernels::{channel, PairMap};
use crate::shape::Shape;

macro_rules! binary_fns {
    ($(
        $(#[$doc:meta])*
        $f:ident $name:literal: |$a:ident, $b:ident| $forward:expr,
            da |$ga:ident, $xa:ident, $ya:ident| $da:expr,
            db |$gb:ident, $xb:ident, $yb:ident| $db:expr;
    )*) => {
        /// An elementwise binary function with broadcasting: the kind of `a + b`,
        /// [`pow`](crate::Var::pow), [`maximum`](crate::Var::maximum), ...
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        pub enum BinaryFn {
            $($(#[$doc])* $f,)*
        }

        impl BinaryFn {
            /// Every function, in table order.
            pub const ALL: &'static [BinaryFn] = &[$(BinaryFn::$f),*];

            /// The name of the method (or operator's method) that records it.
            #[inline]
            pub const fn name(self) -> &'static str {
                match self {
                    $(BinaryFn::$f => $name,)*
                }
            }

            /// Hands `m` the function's scalar forward formula.
            #[inline]
            pub(crate) fn forward<T: Float, M: PairMap<T>>(self, m: M) -> M::Out {
                match self {
                    $(BinaryFn::$f => m.map(|$a: T, $b: T| $forward),)*
                }
            }

            /// `da += g(dout, a, b)`, summed over `a`'s broadcast dimensions; with
            /// `first` (`da`'s elements unspecified), `da = 0 + g(dout, a, b)`, the bits
            /// that adding into zeros gives.
            #[inline]
            pub(crate) fn grad_a<T: Float>(self, par: Par, dout: (&[T], &Shape), a: (&[T], &Shape), b: (&[T], &Shape), da: (&mut [T], bool)) {
                match self {
                    $(BinaryFn::$f => channel::binary_grad(par, dout, a, b, da, |$ga: T, $xa: T, $ya: T| $da),)*
                }
            }

            /// `db += g(dout, a, b)`, summed over `b`'s broadcast dimensions; `first` as
            /// for [`grad_a`](Self::grad_a).
            #[inline]
            pub(crate) fn grad_b<T: Float>(self, par: Par, dout: (&[T], &Shape), a: (&[T], &Shape), b: (&[T], &Shape), db: (&mut [T], bool)) {
                // `binary_grad` sums into its second operand, so `b` goes there.
                match self {
                    $(BinaryFn::$f => channel::binary_grad(par, dout, b, a, db, |$gb: T, $yb: T, $xb: T| $db),)*
                }
            }
        }
    };
}

binary_fns! {
    /// `a + b`.
    Add "add": |a, b| a + b, da |d, _a, _b| d, db |d, _a, _b| d;
    /// `a - b`.
    Sub "sub": |a, b| a - b, da |d, _a, _b| d, db |d, _a, _b| -d;
    /// `a ⊙ b`.
    Mul "mul": |a, b| a * b, da |d, _a, b| d * b, db |d, a, _b| d * a;
    /// `a / b`.
    Div "div": |a, b| a / b, da |d, _a, b| d / b, db |d, a, b| -d * a / (b * b);
    /// `a ^ b`.
    Pow "pow": |a, b| a.powf(b),
        da |d, a, b| if b == T::ZERO { T::ZERO } else { d * b * a.powf(b - T::ONE) },
        db |d, a, b| if a > T::ZERO { d * a.powf(b) * ln_outlined(a) } else { T::ZERO };
    /// The larger of `a` and `b`; NaN if either is.
    Maximum "maximum": |a, b| if a.is_nan() || a > b { a } else { b },
        da |d, a, b| if a == b { d * T::from_f64(0.5) } else if a < b { T::ZERO } else { d },
        db |d, a, b| if a == b { d * T::from_f64(0.5) } else if a > b { T::ZERO } else { d };
    /// The smaller of `a` and `b`; NaN if either is.
    Minimum "minimum": |a, b| if a.is_nan() || a < b { a } else { b },
        da |d, a, b| if a == b { d * T::from_f64(0.5) } else if a > b { T::ZERO } else { d },
        db |d, a, b| if a == b { d * T::from_f64(0.5) } else if a < b { T::ZERO } else { d };
}

/// `ln x` as a call: `pow`'s gradient loop calls libm's `powf` anyway and does not
/// vectorise, and inlining the `ln` polynomial there would grow the walk's dispatcher
/// (shape-`[1]` backward of every op pays for its size).
#[inline(never)]
fn ln_outlined<T: Float>(x: T) -> T {
    x.ln()
}
