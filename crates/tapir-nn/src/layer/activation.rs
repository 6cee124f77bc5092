//! [`Activation`]: the elementwise nonlinearities as a layer.

use tapir::{Float, Var};

use crate::layer::{Ctx, Module};

/// An elementwise nonlinearity, usable as a layer (its formulas and gradients are the
/// engine ops of the same names).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Activation {
    /// `max(x, 0)`.
    Relu,
    /// `x` for `x > 0`, else `slope·x`.
    LeakyRelu(f64),
    /// `tanh x`.
    Tanh,
    /// `1/(1 + e⁻ˣ)`.
    Sigmoid,
    /// `x·Φ(x)` with the exact normal CDF.
    Gelu,
    /// GELU with the tanh approximation.
    GeluTanh,
    /// `ln(1 + eˣ)`.
    Softplus,
    /// `x` unchanged.
    Identity,
}

impl Activation {
    /// Applies the activation to `x`.
    #[track_caller]
    pub fn apply<'s, T: Float>(self, x: Var<'s, T>) -> Var<'s, T> {
        match self {
            Activation::Relu => x.relu(),
            Activation::LeakyRelu(slope) => x.leaky_relu(T::from_f64(slope)),
            Activation::Tanh => x.tanh(),
            Activation::Sigmoid => x.sigmoid(),
            Activation::Gelu => x.gelu(),
            Activation::GeluTanh => x.gelu_tanh(),
            Activation::Softplus => x.softplus(),
            Activation::Identity => x,
        }
    }
}

impl<T: Float> Module<T> for Activation {
    fn forward<'s, 'g>(&self, _cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        self.apply(x)
    }
}
