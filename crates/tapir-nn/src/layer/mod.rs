//! Layers: plain structs of [`ParamId`]s and hyper-parameters. Their
//! tensors live in a [`ParamStore`] (made by the constructors, named `"{name}.weight"`,
//! `"{name}.bias"`, ...), so a layer is cheap to copy around and never borrows the store;
//! each scope reads the parameters through a [`Ctx`].

mod activation;
mod attention;
mod conv;
mod dropout;
mod embedding;
mod linear;
mod norm;
mod transformer;

pub use activation::Activation;
pub use attention::{CausalSelfAttention, MASKED_SCORE};
pub use conv::{AvgPool2d, Conv2d, Flatten, MaxPool2d};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use linear::{Linear, Mlp, MlpBuilder};
pub use norm::LayerNorm;
pub use transformer::{Gpt, GptConfig, PositionalEmbedding, TransformerBlock};

use tapir::{Float, ParamId, ParamStore, Scope, Var};

/// What a layer sees during one scope: the scope, the store holding the parameters, and
/// whether the model is training (dropout active) or evaluating.
pub struct Ctx<'s, 'g: 's, T: Float> {
    scope: &'s Scope<'s, 'g, T>,
    store: &'g ParamStore<T>,
    train: bool,
}

impl<T: Float> Clone for Ctx<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Float> Copy for Ctx<'_, '_, T> {}

impl<'s, 'g: 's, T: Float> Ctx<'s, 'g, T> {
    /// A training context: dropout is active.
    pub fn train(scope: &'s Scope<'s, 'g, T>, store: &'g ParamStore<T>) -> Self {
        Ctx { scope, store, train: true }
    }

    /// An evaluation context: dropout is the identity.
    pub fn eval(scope: &'s Scope<'s, 'g, T>, store: &'g ParamStore<T>) -> Self {
        Ctx { scope, store, train: false }
    }

    /// The scope.
    pub fn scope(self) -> &'s Scope<'s, 'g, T> {
        self.scope
    }

    /// The parameter store.
    pub fn store(self) -> &'g ParamStore<T> {
        self.store
    }

    /// Whether this is a training context.
    pub fn is_train(self) -> bool {
        self.train
    }

    /// Parameter `id` as a leaf of the scope (no copy); an id foreign to the store poisons
    /// the scope with [`tapir::Error::UnknownParam`].
    #[track_caller]
    pub fn param(self, id: ParamId) -> Var<'s, T> {
        self.scope.param(self.store, id)
    }
}

/// A layer or model mapping one tensor to another.
///
/// Like the engine's ops, `forward` never fails directly: a shape mistake is recorded in
/// the scope and comes out of `backward`, `value` or `item`.
///
/// `forward` is `#[track_caller]` (every implementation inherits it, calls through
/// `Box<dyn Module>` included), so an error recorded inside a layer names the line that
/// called `forward`, not the layer's source. Implementations must not call the engine's
/// ops from inside a closure (`iter().fold(..)`, `map`): `#[track_caller]` does not pass
/// through closures, so such ops would report the closure's line; use a `for` loop.
pub trait Module<T: Float> {
    /// Applies the layer to `x`.
    #[track_caller]
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T>;
}

/// Layers applied in order.
///
/// ```
/// use rand::SeedableRng;
/// use tapir_nn::{Activation, Linear, Sequential};
/// # fn main() -> Result<(), tapir::Error> {
/// let mut rng = rand::rngs::StdRng::seed_from_u64(0);
/// let mut store = tapir::ParamStore::<f32>::new();
/// let model = Sequential::<f32>::new()
///     .push(Linear::new(&mut store, "fc1", 4, 8, &mut rng)?)
///     .push(Activation::Relu)
///     .push(Linear::new(&mut store, "fc2", 8, 2, &mut rng)?);
/// assert_eq!(model.len(), 3);
/// # Ok(()) }
/// ```
pub struct Sequential<T: Float> {
    layers: Vec<Box<dyn Module<T>>>,
}

impl<T: Float> Default for Sequential<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Float> Sequential<T> {
    /// No layers (the identity).
    pub fn new() -> Self {
        Sequential { layers: Vec::new() }
    }

    /// Appends a layer.
    #[must_use]
    pub fn push(mut self, layer: impl Module<T> + 'static) -> Self {
        self.layers.push(Box::new(layer));
        self
    }

    /// Number of layers.
    pub fn len(&self) -> usize {
        self.layers.len()
    }

    /// Whether there are no layers.
    pub fn is_empty(&self) -> bool {
        self.layers.is_empty()
    }
}

impl<T: Float> Module<T> for Sequential<T> {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        // A loop, not a fold: the caller's location does not pass through a closure.
        let mut x = x;
        for layer in &self.layers {
            x = layer.forward(cx, x);
        }
        x
    }
}
