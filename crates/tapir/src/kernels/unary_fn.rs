//! The table of elementwise unary functions ([`UnaryFn`]): each row of `unary_fns!` gives
//! a function's variant, its name, its forward formula and its derivative `f'` (in terms of
//! `x`, `y = f(x)` and the scalar arguments `c`), side by side. Scalar math only: the
//! recording methods, backward and the recorded derivative are in `ops/unary.rs`, and
//! `ops/unary.rs`'s module doc tabulates each function's edge cases.

use crate::dtype::Float;
use crate::kernels::scalar::{
    erf_grad, gelu_erf, gelu_erf_grad_given, gelu_tanh, gelu_tanh_grad, relu, sigmoid, sign, silu, silu_grad, softplus,
};
use crate::kernels::{ElementMap, GradMap};

/// A table row's derivative: `d |x, y, c| f'` in general, or `dconst |_, _, c| f'` for a
/// derivative that does not depend on `x` (backward is then `dx += f'·dout`, which reads
/// neither the input nor the output), or `dlong` for a long formula (an `exp` inside): its
/// loop runs out of line and under SIMD dispatch, so that the walk's dispatcher, into
/// which the other rows inline, stays small (shape-`[1]` backward of every op pays for its
/// size: 5% when every loop was inline, W3 under callgrind).
macro_rules! derivative {
    (d, $m:ident, |$x:ident, $y:ident| $e:expr) => {
        $m.map(move |$x: T, $y: T| $e)
    };
    (dconst, $m:ident, |$x:ident, $y:ident| $e:expr) => {
        $m.scale($e)
    };
    (dlong, $m:ident, |$x:ident, $y:ident| $e:expr) => {
        $m.map_long(
            #[inline(always)]
            move |$x: T, $y: T| $e,
        )
    };
}

/// A table row's forward formula: `f |x, c| y` in general, `flong |x, c| y` for a long
/// formula (a polynomial inside): its loop runs out of line, as slices under SIMD dispatch
/// with the formula forced inline, so that it vectorises and recording short tensors of
/// the other functions stays lean.
macro_rules! forward {
    (f, $m:ident, |$x:ident| $e:expr) => {
        $m.map(move |$x: T| $e)
    };
    (flong, $m:ident, |$x:ident| $e:expr) => {
        $m.map_long(
            #[inline(always)]
            move |$x: T| $e,
        )
    };
}

macro_rules! unary_fns {
    ($(
        $(#[$doc:meta])*
        $f:ident $name:literal: $fk:ident |$x:ident, $c:ident| $forward:expr, $d:ident |$dx:ident, $dy:ident, $dc:ident| $derivative:expr;
    )*) => {
        /// An elementwise unary function: the kind of a [`Var`](crate::Var) method such as
        /// [`exp`](crate::Var::exp) or [`clamp`](crate::Var::clamp). Its [`name`](UnaryFn::name) is the method's.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        #[non_exhaustive]
        #[repr(u8)]
        pub enum UnaryFn {
            $($(#[$doc])* $f,)*
        }

        impl UnaryFn {
            /// Every function, in table order.
            pub const ALL: &'static [UnaryFn] = &[$(UnaryFn::$f),*];

            /// The function whose discriminant is `code` (a `const` generic argument of
            /// the recording method, so that each method's `match` folds away).
            pub(crate) const fn from_code(code: u8) -> UnaryFn {
                $(if code == UnaryFn::$f as u8 {
                    return UnaryFn::$f;
                })*
                panic!("a code made from a UnaryFn")
            }

            /// The name of the method that records it.
            #[inline]
            pub const fn name(self) -> &'static str {
                match self {
                    $(UnaryFn::$f => $name,)*
                }
            }

            /// Hands `m` the function's scalar forward formula, with scalar arguments `c`.
            /// Always inlined: every caller passes a constant `self`, so the match folds to
            /// one arm (left to the inliner, it went out of line in W3's chain, +88
            /// instructions per recorded `x*c+d`).
            #[inline(always)]
            pub(crate) fn forward<T: Float, M: ElementMap<T>>(self, c: [T; 2], m: M) -> M::Out {
                match self {
                    $(UnaryFn::$f => {
                        let $c = c;
                        forward!($fk, m, |$x| $forward)
                    })*
                }
            }

            /// Hands `m` the derivative `f'(x)` as a function of `x` and `y = f(x)`.
            #[inline]
            pub(crate) fn derivative<T: Float, M: GradMap<T>>(self, c: [T; 2], m: M) -> M::Out {
                match self {
                    $(UnaryFn::$f => {
                        let $dc = c;
                        derivative!($d, m, |$dx, $dy| $derivative)
                    })*
                }
            }
        }
    };
}

unary_fns! {
    /// `-x`.
    Neg "neg": f |x, _c| -x, dconst |_x, _y, _c| -T::ONE;
    /// `x + c`.
    AddScalar "add_scalar": f |x, c| x + c[0], dconst |_x, _y, _c| T::ONE;
    /// `c·x`.
    MulScalar "mul_scalar": f |x, c| x * c[0], dconst |_x, _y, c| c[0];
    /// `x^p`.
    Powf "powf": f |x, c| x.powf(c[0]),
        d |x, _y, c| if c[0] == T::ZERO { T::ZERO } else { c[0] * x.powf(c[0] - T::ONE) };
    /// `eˣ`.
    Exp "exp": f |x, _c| x.exp(), d |_x, y, _c| y;
    /// `ln x`.
    Log "log": f |x, _c| x.ln(), d |x, _y, _c| T::ONE / x;
    /// `ln(1 + x)`.
    Log1p "log1p": f |x, _c| x.ln_1p(), d |x, _y, _c| T::ONE / (T::ONE + x);
    /// `eˣ − 1`.
    Expm1 "expm1": f |x, _c| x.exp_m1(), d |_x, y, _c| y + T::ONE;
    /// `√x`.
    Sqrt "sqrt": f |x, _c| x.sqrt(), d |_x, y, _c| T::from_f64(0.5) / y;
    /// `1/√x`.
    Rsqrt "rsqrt": f |x, _c| T::ONE / x.sqrt(), d |_x, y, _c| T::from_f64(-0.5) * y * y * y;
    /// `x²`.
    Square "square": f |x, _c| x * x, d |x, _y, _c| x + x;
    /// `1/x`.
    Recip "recip": f |x, _c| T::ONE / x, d |_x, y, _c| -(y * y);
    /// `|x|`.
    Abs "abs": f |x, _c| x.abs(), d |x, _y, _c| sign(x);
    /// `sin x`.
    Sin "sin": f |x, _c| x.sin(), d |x, _y, _c| x.cos();
    /// `cos x`.
    Cos "cos": f |x, _c| x.cos(), d |x, _y, _c| -x.sin();
    /// `tanh x`.
    Tanh "tanh": f |x, _c| x.tanh(), d |_x, y, _c| T::ONE - y * y;
    /// `atan x`.
    Atan "atan": f |x, _c| x.atan(), d |x, _y, _c| T::ONE / (T::ONE + x * x);
    /// The error function.
    Erf "erf": flong |x, _c| x.erf(), dlong |x, _y, _c| erf_grad(x);
    /// `1/(1+e⁻ˣ)`.
    Sigmoid "sigmoid": f |x, _c| sigmoid(x), d |_x, y, _c| y * (T::ONE - y);
    /// `max(x, 0)`.
    Relu "relu": f |x, _c| relu(x), d |_x, y, _c| if y <= T::ZERO { T::ZERO } else { T::ONE };
    /// `x` for `x > 0`, else `c·x`.
    LeakyRelu "leaky_relu": f |x, c| if x > T::ZERO { x } else { c[0] * x },
        d |x, _y, c| if x > T::ZERO { T::ONE } else { c[0] };
    /// `x·Φ(x)`.
    Gelu "gelu": flong |x, _c| gelu_erf(x), dlong |x, y, _c| gelu_erf_grad_given(x, y);
    /// GELU with the tanh approximation.
    GeluTanh "gelu_tanh": flong |x, _c| gelu_tanh(x), dlong |x, _y, _c| gelu_tanh_grad(x);
    /// `ln(1 + eˣ)`.
    Softplus "softplus": flong |x, _c| softplus(x), dlong |x, _y, _c| sigmoid(x);
    /// `x·σ(x)`.
    Silu "silu": flong |x, _c| silu(x), dlong |x, _y, _c| silu_grad(x);
    /// `min(max(x, lo), hi)` with `c = [lo, hi]`.
    Clamp "clamp": f |x, c| if x < c[0] { c[0] } else if x > c[1] { c[1] } else { x },
        d |x, _y, c| if x >= c[0] && x <= c[1] { T::ONE } else { T::ZERO };
}

impl UnaryFn {
    /// Whether backward reads only the output (or nothing): then the op may overwrite its
    /// input in place, where nothing else reads the input (a checkpoint's recomputation
    /// knows; see `engine/checkpoint/in_place.rs`). The test `in_place_derivatives_ignore_the_input`
    /// checks this list against the derivative table.
    pub(crate) const fn reads_only_output(self) -> bool {
        use UnaryFn::*;
        matches!(self, Neg | AddScalar | MulScalar | Exp | Expm1 | Sqrt | Rsqrt | Recip | Tanh | Sigmoid | Relu)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Evaluates a derivative at `(x, y)` pairs.
    struct Probe<'a>(&'a [(f64, f64)]);

    impl GradMap<f64> for Probe<'_> {
        type Out = Vec<f64>;
        fn map(self, d: impl Fn(f64, f64) -> f64 + Sync) -> Vec<f64> {
            self.0.iter().map(|&(x, y)| d(x, y)).collect()
        }
        fn scale(self, c: f64) -> Vec<f64> {
            vec![c; self.0.len()]
        }
        fn map_long(self, d: impl Fn(f64, f64) -> f64 + Sync) -> Vec<f64> {
            self.map(d)
        }
    }

    /// What an in-place op's backward sees as its input is its output: the derivative of
    /// every function listed by `reads_only_output` must not change when `x` does.
    #[test]
    fn in_place_derivatives_ignore_the_input() {
        let c = [0.7, 1.3];
        let xs = [-2.5, -0.3, 0.0, 0.4, 1.7, 3.0];
        for &f in UnaryFn::ALL {
            let y = |x: f64| f.forward(c, ScalarMap(x));
            let true_x: Vec<_> = xs.iter().map(|&x| (x, y(x))).collect();
            let other_x: Vec<_> = xs.iter().map(|&x| (x * 1.9 + 0.37, y(x))).collect();
            let (a, b) = (f.derivative(c, Probe(&true_x)), f.derivative(c, Probe(&other_x)));
            let same = a.iter().zip(&b).all(|(a, b)| a == b || (a.is_nan() && b.is_nan()));
            if f.reads_only_output() {
                assert!(same, "{}: the derivative reads x", f.name());
            } else {
                assert!(!same, "{}: the derivative reads only y, so it could be listed", f.name());
            }
        }
    }

    /// `f(x)` for one scalar.
    struct ScalarMap(f64);

    impl ElementMap<f64> for ScalarMap {
        type Out = f64;
        fn map(self, f: impl Fn(f64) -> f64 + Sync) -> f64 {
            f(self.0)
        }
        fn map_long(self, f: impl Fn(f64) -> f64 + Sync) -> f64 {
            f(self.0)
        }
    }
}
