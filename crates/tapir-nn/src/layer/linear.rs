//! [`Linear`] (`y = x·W + b`) and the [`Mlp`] builder.

use rand::Rng;
use tapir::{Float, ParamId, ParamStore, Var};

use crate::init::Init;
use crate::layer::{Activation, Ctx, Dropout, Module};

/// A fully connected layer: `y = x·W + b` with `W: [fan_in, fan_out]` (stored input-major,
/// like JAX's `kernel`, so no transpose is needed) and `b: [fan_out]`. `x` may have any
/// leading batch dimensions: `[..., fan_in] → [..., fan_out]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Linear {
    /// `"{name}.weight"`, `[fan_in, fan_out]`.
    pub weight: ParamId,
    /// `"{name}.bias"`, `[fan_out]`, if the layer has one.
    pub bias: Option<ParamId>,
    /// Input features.
    pub fan_in: usize,
    /// Output features.
    pub fan_out: usize,
}

impl Linear {
    /// A layer with Kaiming-uniform weights (ReLU gain) and zero bias, drawn from `rng`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if a size is zero or a name is taken;
    /// [`tapir::Error::InvalidShape`] or [`tapir::Error::TensorOutOfMemory`] if the
    /// weights cannot exist or be allocated. Every error names `Linear::new` and the
    /// caller's line, and the store is unchanged on error.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        fan_in: usize,
        fan_out: usize,
        rng: &mut R,
    ) -> tapir::Result<Linear> {
        Self::make("Linear::new", store, name, fan_in, fan_out, Init::RELU, true, rng)
    }

    /// A layer with weights drawn by `init`, and a zero bias if `bias`.
    ///
    /// # Errors
    /// As [`Linear::new`] (naming `Linear::with_init`), whatever `init` is (a
    /// [`Init::Constant`] too); [`tapir::Error::InvalidArgument`] if `init`'s scale is not
    /// finite.
    #[track_caller]
    pub fn with_init<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        fan_in: usize,
        fan_out: usize,
        init: Init,
        bias: bool,
        rng: &mut R,
    ) -> tapir::Result<Linear> {
        Self::make("Linear::with_init", store, name, fan_in, fan_out, init, bias, rng)
    }

    #[track_caller]
    #[allow(clippy::too_many_arguments)]
    fn make<T: Float, R: Rng + ?Sized>(
        op: &'static str,
        store: &mut ParamStore<T>,
        name: &str,
        fan_in: usize,
        fan_out: usize,
        init: Init,
        bias: bool,
        rng: &mut R,
    ) -> tapir::Result<Linear> {
        // Checked here, not left to `init`: `Init::Constant` ignores the fans, and a
        // failure must name this constructor.
        if fan_in == 0 || fan_out == 0 {
            return Err(crate::invalid(
                op,
                format!("fan_in {fan_in} and fan_out {fan_out} must be positive (weight [{fan_in}, {fan_out}])"),
            ));
        }
        let w = init.tensor(&[fan_in, fan_out], fan_in, fan_out, rng).map_err(crate::in_op(op))?;
        // Check the bias name before adding anything, so a failure leaves the store as it was.
        let bias_name = format!("{name}.bias");
        let weight_name = format!("{name}.weight");
        for n in [&weight_name, &bias_name] {
            if store.find(n).is_some() {
                return Err(crate::invalid(op, format!("a parameter named {n:?} already exists")));
            }
        }
        let weight = store.add(weight_name, w)?;
        let bias = if bias {
            let b = tapir::Tensor::zeros(&[fan_out]).map_err(crate::in_op(op))?;
            Some(store.add(bias_name, b)?)
        } else {
            None
        };
        Ok(Linear { weight, bias, fan_in, fan_out })
    }
}

impl<T: Float> Module<T> for Linear {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        match self.bias {
            // One node for the product and the bias (`Var::linear`): no separate value and
            // gradient for the product.
            Some(b) => x.linear(cx.param(self.weight), cx.param(b)),
            None => x.matmul(cx.param(self.weight)),
        }
    }
}

/// A multi-layer perceptron: [`Linear`] layers with an activation (and optional dropout)
/// between them, none after the last. Build it with [`Mlp::builder`].
#[derive(Debug)]
pub struct Mlp {
    layers: Vec<Linear>,
    activation: Activation,
    dropout: Option<Dropout>,
}

impl Mlp {
    /// Starts an MLP taking `fan_in` features.
    ///
    /// ```
    /// use rand::SeedableRng;
    /// # fn main() -> Result<(), tapir::Error> {
    /// let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    /// let mut store = tapir::ParamStore::<f32>::new();
    /// let mlp = tapir_nn::Mlp::builder(64).hidden(128).output(10).build(&mut store, "mlp", &mut rng)?;
    /// assert_eq!(mlp.layers().len(), 2);
    /// assert!(store.find("mlp.1.weight").is_some());
    /// # Ok(()) }
    /// ```
    pub fn builder(fan_in: usize) -> MlpBuilder {
        MlpBuilder { sizes: vec![fan_in], output: None, activation: Activation::Relu, dropout: None, init: None }
    }

    /// The linear layers, in order (named `"{name}.0"`, `"{name}.1"`, ...).
    pub fn layers(&self) -> &[Linear] {
        &self.layers
    }
}

impl<T: Float> Module<T> for Mlp {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let last = self.layers.len().saturating_sub(1);
        let mut x = x;
        for (i, layer) in self.layers.iter().enumerate() {
            x = layer.forward(cx, x);
            if i < last {
                x = self.activation.forward(cx, x);
                if let Some(d) = &self.dropout {
                    x = d.forward(cx, x);
                }
            }
        }
        x
    }
}

/// Configures an [`Mlp`]; see [`Mlp::builder`].
#[derive(Debug, Clone)]
pub struct MlpBuilder {
    sizes: Vec<usize>,
    output: Option<usize>,
    activation: Activation,
    dropout: Option<(f64, u64)>,
    init: Option<Init>,
}

impl MlpBuilder {
    /// Adds a hidden layer of `width` units.
    #[must_use]
    pub fn hidden(mut self, width: usize) -> Self {
        self.sizes.push(width);
        self
    }

    /// Sets the output width (required).
    #[must_use]
    pub fn output(mut self, width: usize) -> Self {
        self.output = Some(width);
        self
    }

    /// The activation between layers (default ReLU).
    #[must_use]
    pub fn activation(mut self, activation: Activation) -> Self {
        self.activation = activation;
        self
    }

    /// Dropout with probability `p` after each hidden activation, seeded with `seed`.
    #[must_use]
    pub fn dropout(mut self, p: f64, seed: u64) -> Self {
        self.dropout = Some((p, seed));
        self
    }

    /// The weight initialiser (default: Kaiming uniform with the ReLU gain for ReLU-like
    /// activations, Xavier uniform otherwise).
    #[must_use]
    pub fn init(mut self, init: Init) -> Self {
        self.init = Some(init);
        self
    }

    /// Creates the parameters in `store`, named `"{name}.{i}.weight"` and `"{name}.{i}.bias"`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] without an output width, for a zero width, a
    /// taken name or a dropout probability outside `[0, 1)`. On error, layers made before
    /// the failing one stay in the store.
    #[track_caller]
    pub fn build<T: Float, R: Rng + ?Sized>(
        self,
        store: &mut ParamStore<T>,
        name: &str,
        rng: &mut R,
    ) -> tapir::Result<Mlp> {
        let Some(out) = self.output else {
            return Err(crate::invalid("Mlp::build", "call .output(width) before .build()".into()));
        };
        let dropout = match self.dropout {
            Some((p, seed)) => Some(Dropout::new(p, seed)?),
            None => None,
        };
        let init = self.init.unwrap_or(match self.activation {
            Activation::Relu | Activation::LeakyRelu(_) | Activation::Gelu | Activation::GeluTanh => Init::RELU,
            _ => Init::LINEAR,
        });
        let mut sizes = self.sizes;
        sizes.push(out);
        let mut layers = Vec::with_capacity(sizes.len() - 1);
        for (i, pair) in sizes.windows(2).enumerate() {
            layers.push(Linear::with_init(store, &format!("{name}.{i}"), pair[0], pair[1], init, true, rng)?);
        }
        Ok(Mlp { layers, activation: self.activation, dropout })
    }
}
