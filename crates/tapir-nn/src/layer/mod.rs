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
pub use attention::CausalSelfAttention;
pub use conv::{AvgPool2d, Conv2d, Flatten, MaxPool2d};
pub use dropout::Dropout;
pub use embedding::Embedding;
pub use linear::{Linear, Mlp, MlpBuilder};
pub use norm::LayerNorm;
pub use transformer::{Gpt, GptConfig, PositionalEmbedding, TransformerBlock};

use tapir::{Checkpoint, Float, ParamId, ParamStore, Scope, Var};

/// What a layer sees during one scope: the scope, the store holding the parameters,
/// whether the model is training (dropout active) or evaluating, and, for a functional
/// call ([`Ctx::with_params`]), handles that replace some of the stored parameters.
pub struct Ctx<'s, 'g: 's, T: Float> {
    scope: &'s Scope<'s, 'g, T>,
    store: &'g ParamStore<T>,
    train: bool,
    overrides: Option<Overrides<'s, 'g, T>>,
}

/// The parameters `ids` replaced by consecutive blocks of the flat handle `flat`.
struct Overrides<'s, 'g, T: Float> {
    flat: Var<'s, T>,
    ids: &'g [ParamId],
}

impl<T: Float> Clone for Overrides<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Float> Copy for Overrides<'_, '_, T> {}

impl<T: Float> Clone for Ctx<'_, '_, T> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<T: Float> Copy for Ctx<'_, '_, T> {}

impl<'s, 'g: 's, T: Float> Ctx<'s, 'g, T> {
    /// A training context: dropout is active.
    pub fn train(scope: &'s Scope<'s, 'g, T>, store: &'g ParamStore<T>) -> Self {
        Ctx { scope, store, train: true, overrides: None }
    }

    /// An evaluation context: dropout is the identity.
    pub fn eval(scope: &'s Scope<'s, 'g, T>, store: &'g ParamStore<T>) -> Self {
        Ctx { scope, store, train: false, overrides: None }
    }

    /// A functional call (PyTorch's `torch.func.functional_call`): the same context, but
    /// parameters `ids` are read from the handle `flat` instead of the store, so that a
    /// model can run at parameters computed in this scope, for example MAML's adapted
    /// `θ' = θ − α∇L(θ)`, and gradients flow back through them. `flat` holds the `ids`'
    /// tensors flattened and concatenated in the order of `ids` (as
    /// [`flatten_params`](crate::flatten_params) lays them out), so it has
    /// [`flat_len`](crate::flat_len)`(store, ids)` elements. Parameters not in `ids` still
    /// come from the store.
    ///
    /// Every id of `ids` is checked against the store here, at the call: an id of another
    /// store poisons the scope with [`tapir::Error::WrongStore`] (op `Ctx::with_params`,
    /// the caller's line), and one past the store's end with
    /// [`tapir::Error::UnknownParam`], rather than leaving the layers to read the store's
    /// own values and ignore `flat`. A `flat` with the wrong number of elements poisons the
    /// scope with `reshape`'s [`tapir::Error::InvalidShape`] at the first parameter read.
    ///
    /// ```
    /// use rand::SeedableRng;
    /// use tapir::{Graph, ParamStore, Tensor};
    /// use tapir_nn::{flatten_params, Ctx, Linear, Module};
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    /// let mut store = ParamStore::<f64>::new();
    /// let fc = Linear::new(&mut store, "fc", 2, 1, &mut rng)?;
    /// let ids = [fc.weight, fc.bias.unwrap()];
    /// let theta = flatten_params(&store, &ids)?; // [w0, w1, b]
    /// let x = Tensor::from_vec(vec![1.0, 2.0], &[1, 2])?;
    /// let mut graph = Graph::new();
    /// let (y, y_store) = graph.scope(|s| {
    ///     let t = s.leaf(&theta);
    ///     let doubled = Ctx::eval(s, &store).with_params(t * 2.0, &ids);
    ///     let y = fc.forward(doubled, s.input(&x)).item()?;
    ///     Ok::<_, tapir::Error>((y, fc.forward(Ctx::eval(s, &store), s.input(&x)).item()?))
    /// })?;
    /// assert!((y - 2.0 * y_store).abs() < 1e-12); // every parameter doubled
    /// # Ok(()) }
    /// ```
    #[must_use]
    #[track_caller]
    pub fn with_params(self, flat: Var<'s, T>, ids: &'g [ParamId]) -> Self {
        // A `for` loop, not `find_map`: `#[track_caller]` does not pass through closures.
        for &id in ids {
            if let Err(e) = self.store.check("Ctx::with_params", id) {
                self.scope.fail(e);
                break;
            }
        }
        Ctx { overrides: Some(Overrides { flat, ids }), ..self }
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

    /// Parameter `id` as a leaf of the scope (no copy), or its block of the handle given to
    /// [`with_params`](Ctx::with_params); an id foreign to the store poisons the scope
    /// with [`tapir::Error::UnknownParam`].
    #[track_caller]
    pub fn param(self, id: ParamId) -> Var<'s, T> {
        match self.overrides {
            Some(o) if o.ids.contains(&id) => self.overridden(o, id),
            _ => self.scope.param(self.store, id),
        }
    }

    /// `id`'s block of the flat override, reshaped to the stored tensor's shape.
    #[track_caller]
    fn overridden(self, o: Overrides<'s, 'g, T>, id: ParamId) -> Var<'s, T> {
        let mut start = 0;
        for &other in o.ids {
            if other == id {
                break;
            }
            match self.store.get(other) {
                Ok(t) => start += t.numel(),
                // Reading the foreign id through the store poisons the scope with its error.
                Err(_) => return self.scope.param(self.store, other),
            }
        }
        let t = match self.store.get(id) {
            Ok(t) => t,
            Err(_) => return self.scope.param(self.store, id),
        };
        // A flat handle of the wrong size poisons the scope through `reshape`'s error.
        let total = crate::functional::flat_len(self.store, o.ids).unwrap_or(0);
        let (dims, rank) = crate::dims(t.shape());
        o.flat.reshape(&[total]).narrow(0, start, t.numel()).reshape(&dims[..rank])
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

    /// This stack recorded with a checkpoint around every `every` layers (the last group
    /// may be shorter): each group's intermediate values are freed after its forward and
    /// recomputed during backward (see [`Scope::checkpoint`]). The layers read their
    /// parameters from `store`. Make the view before the scope, since the scope's
    /// backward calls it again:
    ///
    /// ```
    /// use rand::SeedableRng;
    /// use tapir_nn::{Activation, Ctx, Linear, Sequential};
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    /// let mut store = tapir::ParamStore::<f32>::new();
    /// let mut model = Sequential::new();
    /// for i in 0..8 {
    ///     model = model.push(Linear::new(&mut store, &format!("fc{i}"), 16, 16, &mut rng)?).push(Activation::Relu);
    /// }
    /// let x = tapir::Tensor::<f32>::normal(&[4, 16], 0.0, 1.0, &mut rng)?;
    /// let mut grads = store.zeros_like()?;
    /// let mut graph = tapir::Graph::new();
    /// let checkpointed = model.checkpointed(&store, 4)?; // groups of 4: two checkpoints
    /// graph.scope(|s| {
    ///     let y = checkpointed.forward(Ctx::train(s, &store), s.input(&x));
    ///     s.backward_into(y.square().mean(), &mut grads)
    /// })?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if `every` is 0.
    #[track_caller]
    pub fn checkpointed<'a>(&'a self, store: &'a ParamStore<T>, every: usize) -> tapir::Result<Checkpointed<'a, T>> {
        if every == 0 {
            return Err(crate::invalid("Sequential::checkpointed", "a group must hold at least one layer".into()));
        }
        Ok(Checkpointed { layers: &self.layers, store, every })
    }
}

/// A [`Sequential`] recorded with a checkpoint every few layers; made by
/// [`Sequential::checkpointed`].
pub struct Checkpointed<'a, T: Float> {
    layers: &'a [Box<dyn Module<T>>],
    store: &'a ParamStore<T>,
    every: usize,
}

impl<'a, T: Float> Checkpointed<'a, T> {
    /// Applies the layers to `x`, one checkpoint per group. Borrowed for `'g`, so the view
    /// must be made before the scope.
    #[track_caller]
    pub fn forward<'s, 'g>(&'g self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let s = cx.scope();
        let mut x = x;
        // A checkpoint's `part` holds the group's index and whether this is training.
        let groups = self.layers.len().div_ceil(self.every);
        for group in 0..groups {
            let part = u32::try_from(group).map_or(u32::MAX, |g| (g << 1) | u32::from(cx.is_train()));
            x = s.checkpoint_part(self, part, &[x]);
        }
        x
    }
}

impl<T: Float> Checkpoint<T> for Checkpointed<'_, T> {
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, T>, x: &[Var<'c, T>], part: u32) -> Var<'c, T> {
        let cx = if part & 1 == 1 { Ctx::train(s, self.store) } else { Ctx::eval(s, self.store) };
        let start = (part >> 1) as usize * self.every;
        let mut h = x[0];
        for layer in &self.layers[start..(start + self.every).min(self.layers.len())] {
            h = layer.forward(cx, h);
        }
        h
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
