//! Convolution and pooling layers over `[N, C, H, W]` tensors, on the engine's `conv2d`
//! (`im2col` then one GEMM, or one batched GEMM for grouped convolutions), `max_pool2d`
//! and `avg_pool2d`; and [`Flatten`].
//!
//! Output sizes follow PyTorch: `oh = (H + 2·ph − dh·(kh − 1) − 1)/sh + 1`, likewise `ow`
//! (dilation `dh = 1` unless set).

use rand::Rng;
use tapir::{Conv2dOptions, Float, ParamId, ParamStore, Tensor, Var};

use crate::init::Init;
use crate::layer::{Ctx, Module};

/// A 2-D convolution (cross-correlation): `y[n, o] = Σ_c w[o, c] ⋆ x[n, c] + b[o]`, with
/// weights `"{name}.weight"` `[out, in/groups, kh, kw]` and bias `"{name}.bias"` `[out]`,
/// as in PyTorch's `nn.Conv2d`. With `groups = g`, output channel block `k` sees input
/// channel block `k` only; `groups = in` is a depthwise convolution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2d {
    /// `[out_channels, in_channels/groups, kh, kw]`.
    pub weight: ParamId,
    /// `[out_channels]`, if the layer has one.
    pub bias: Option<ParamId>,
    /// Vertical and horizontal stride (default `[1, 1]`).
    pub stride: [usize; 2],
    /// Zero padding on each side, vertical and horizontal (default `[0, 0]`).
    pub padding: [usize; 2],
    /// Distance between the kernel's taps, vertical and horizontal (default `[1, 1]`).
    pub dilation: [usize; 2],
    /// Channel blocks (default 1); fixed by the weight's shape, so set at construction.
    pub groups: usize,
}

impl Conv2d {
    /// A convolution from `in_channels` to `out_channels` with a `kernel` window, stride 1,
    /// no padding, Kaiming-uniform weights (ReLU gain, `fan_in = in·kh·kw`) and zero bias.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] for a zero size or a taken name;
    /// [`tapir::Error::InvalidShape`] or [`tapir::Error::TensorOutOfMemory`] (naming
    /// `Conv2d::new`) if the weights cannot exist or be allocated.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        rng: &mut R,
    ) -> tapir::Result<Conv2d> {
        Conv2d::build("Conv2d::new", store, name, [in_channels, out_channels], kernel, Conv2dOptions::new(), rng)
    }

    /// A convolution with all of PyTorch's `nn.Conv2d` options (stride, padding,
    /// dilation, groups; see [`Conv2dOptions`]): weights `[out, in/groups, kh, kw]`,
    /// Kaiming-uniform with `fan_in = (in/groups)·kh·kw` as PyTorch's, and zero bias.
    ///
    /// ```
    /// # fn main() -> tapir::Result<()> {
    /// use rand::SeedableRng;
    /// use tapir::{Conv2dOptions, ParamStore};
    /// use tapir_nn::Conv2d;
    /// let (mut store, mut rng) = (ParamStore::<f32>::new(), rand::rngs::StdRng::seed_from_u64(0));
    /// // Depthwise 3×3 over 8 channels, dilation 2, padding keeping the size.
    /// let opts = Conv2dOptions::new().padding([2, 2]).dilation([2, 2]).groups(8);
    /// let dw = Conv2d::with_options(&mut store, "dw", 8, 8, [3, 3], opts, &mut rng)?;
    /// assert_eq!(store.get(dw.weight).unwrap().dims(), [8, 1, 3, 3]);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    /// As [`new`](Conv2d::new) (naming `Conv2d::with_options`), and
    /// [`tapir::Error::InvalidArgument`] unless `groups` is positive and divides both
    /// channel counts, or for a zero stride or dilation.
    #[track_caller]
    pub fn with_options<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        in_channels: usize,
        out_channels: usize,
        kernel: [usize; 2],
        options: Conv2dOptions,
        rng: &mut R,
    ) -> tapir::Result<Conv2d> {
        Conv2d::build("Conv2d::with_options", store, name, [in_channels, out_channels], kernel, options, rng)
    }

    #[track_caller]
    fn build<T: Float, R: Rng + ?Sized>(
        op: &'static str,
        store: &mut ParamStore<T>,
        name: &str,
        [in_channels, out_channels]: [usize; 2],
        kernel: [usize; 2],
        options: Conv2dOptions,
        rng: &mut R,
    ) -> tapir::Result<Conv2d> {
        let [kh, kw] = kernel;
        let Conv2dOptions { stride, padding, dilation, groups, .. } = options;
        if in_channels == 0 || out_channels == 0 || kh == 0 || kw == 0 {
            return Err(crate::invalid(
                op,
                format!(
                    "in_channels {in_channels}, out_channels {out_channels} and kernel {kernel:?} must be positive"
                ),
            ));
        }
        if groups == 0 || in_channels % groups != 0 || out_channels % groups != 0 {
            return Err(crate::invalid(
                op,
                format!("groups {groups} must be positive and divide in_channels {in_channels} and out_channels {out_channels}"),
            ));
        }
        if stride.contains(&0) || dilation.contains(&0) {
            return Err(crate::invalid(op, format!("stride {stride:?} and dilation {dilation:?} must be positive")));
        }
        // Saturating: absurd sizes fail as shapes in `tensor` rather than overflow here.
        let area = kh.saturating_mul(kw);
        let per_group = in_channels / groups;
        // PyTorch's fans for the weight [out, in/groups, kh, kw].
        let (fan_in, fan_out) = (per_group.saturating_mul(area), out_channels.saturating_mul(area));
        let w =
            Init::RELU.tensor(&[out_channels, per_group, kh, kw], fan_in, fan_out, rng).map_err(crate::in_op(op))?;
        let (wn, bn) = (format!("{name}.weight"), format!("{name}.bias"));
        if store.find(&bn).is_some() {
            return Err(crate::invalid(op, format!("a parameter named {bn:?} already exists")));
        }
        // Made before the weight is added, so that a failure leaves the store unchanged.
        let b = Tensor::zeros(&[out_channels]).map_err(crate::in_op(op))?;
        let weight = store.add(wn, w)?;
        let bias = Some(store.add(bn, b)?);
        Ok(Conv2d { weight, bias, stride, padding, dilation, groups })
    }

    /// The same layer with another stride.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }

    /// The same layer with another padding.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }

    /// The same layer with another dilation (the weights do not change shape).
    #[must_use]
    pub fn dilation(mut self, dilation: [usize; 2]) -> Self {
        self.dilation = dilation;
        self
    }

    /// The layer's stride, padding, dilation and groups as the engine's options.
    pub fn options(&self) -> Conv2dOptions {
        Conv2dOptions::new().stride(self.stride).padding(self.padding).dilation(self.dilation).groups(self.groups)
    }
}

impl<T: Float> Module<T> for Conv2d {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let w = cx.param(self.weight);
        // The plain form records the same ops; it keeps `conv2d` as the name in errors.
        let y = if self.dilation == [1, 1] && self.groups == 1 {
            x.conv2d(w, self.stride, self.padding)
        } else {
            x.conv2d_with(w, self.options())
        };
        match self.bias {
            Some(b) => {
                let b = cx.param(b);
                let c = b.shape().numel();
                y + b.reshape(&[c, 1, 1])
            }
            None => y,
        }
    }
}

/// Max pooling over `kernel` windows (PyTorch's `nn.MaxPool2d`; padding never wins).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxPool2d {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on each side, at most half the kernel.
    pub padding: [usize; 2],
    /// Distance between a window's taps (default `[1, 1]`).
    pub dilation: [usize; 2],
}

impl MaxPool2d {
    /// Non-overlapping `k×k` windows (stride `k`, no padding, no dilation).
    pub fn new(k: usize) -> MaxPool2d {
        MaxPool2d { kernel: [k, k], stride: [k, k], padding: [0, 0], dilation: [1, 1] }
    }

    /// The same pooling with another stride.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }

    /// The same pooling with another padding.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }

    /// The same pooling with another dilation.
    #[must_use]
    pub fn dilation(mut self, dilation: [usize; 2]) -> Self {
        self.dilation = dilation;
        self
    }
}

impl<T: Float> Module<T> for MaxPool2d {
    fn forward<'s, 'g>(&self, _cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        if self.dilation == [1, 1] {
            x.max_pool2d(self.kernel, self.stride, self.padding)
        } else {
            x.max_pool2d_dilated(self.kernel, self.stride, self.padding, self.dilation)
        }
    }
}

/// Average pooling over `kernel` windows, padding counted as zeros (PyTorch's
/// `nn.AvgPool2d` with `count_include_pad=True`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AvgPool2d {
    /// Window size.
    pub kernel: [usize; 2],
    /// Step between windows.
    pub stride: [usize; 2],
    /// Padding on each side, at most half the kernel.
    pub padding: [usize; 2],
}

impl AvgPool2d {
    /// Non-overlapping `k×k` windows (stride `k`, no padding).
    pub fn new(k: usize) -> AvgPool2d {
        AvgPool2d { kernel: [k, k], stride: [k, k], padding: [0, 0] }
    }

    /// The same pooling with another stride.
    #[must_use]
    pub fn stride(mut self, stride: [usize; 2]) -> Self {
        self.stride = stride;
        self
    }

    /// The same pooling with another padding.
    #[must_use]
    pub fn padding(mut self, padding: [usize; 2]) -> Self {
        self.padding = padding;
        self
    }
}

impl<T: Float> Module<T> for AvgPool2d {
    fn forward<'s, 'g>(&self, _cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        x.avg_pool2d(self.kernel, self.stride, self.padding)
    }
}

/// Flattens every axis after the first: `[N, ...] → [N, Π ...]` (no copy). The product
/// is taken over the trailing axes themselves, so an empty batch keeps its row size
/// (`[0, 3, 4] → [0, 12]`); a scalar becomes `[1, 1]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Flatten;

impl<T: Float> Module<T> for Flatten {
    fn forward<'s, 'g>(&self, _cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        let shape = x.shape();
        let n = if shape.rank() == 0 { 1 } else { shape.dim(0) };
        // Each trailing dimension fits in a u32 and the product of all of them is at most
        // the product over the whole shape when n > 0; with n = 0 it can exceed it, so it
        // saturates and `reshape` reports the overflow as a shape error.
        let rest = (1..shape.rank()).fold(1usize, |acc, i| acc.saturating_mul(shape.dim(i)));
        x.reshape(&[n, rest])
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use crate::layer::Sequential;
    use tapir::Graph;

    #[test]
    fn conv_matches_a_direct_loop() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(1);
        let mut store = ParamStore::<f64>::new();
        let conv = Conv2d::new(&mut store, "c", 2, 3, [3, 2], &mut rng).unwrap().stride([2, 1]).padding([1, 1]);
        store.get_mut(conv.bias.unwrap()).unwrap().data_mut().copy_from_slice(&[0.5, -0.5, 1.0]);
        let x = Tensor::<f64>::normal(&[2, 2, 5, 4], 0.0, 1.0, &mut rng).unwrap();
        let mut g = Graph::new();
        let y = g.scope(|s| conv.forward(Ctx::eval(s, &store), s.input(&x)).to_tensor().unwrap());
        // oh = (5 + 2 − 3)/2 + 1 = 3, ow = (4 + 2 − 2)/1 + 1 = 5.
        assert_eq!(y.dims(), [2, 3, 3, 5]);
        let (w, b, xd) = (store.get(conv.weight).unwrap().data(), [0.5, -0.5, 1.0], x.data());
        for n in 0..2 {
            for o in 0..3 {
                for i in 0..3 {
                    for j in 0..5 {
                        let mut acc = b[o];
                        for c in 0..2 {
                            for a in 0..3 {
                                for bb in 0..2 {
                                    let (r, q) = ((i * 2 + a) as isize - 1, (j + bb) as isize - 1);
                                    if (0..5).contains(&r) && (0..4).contains(&q) {
                                        acc += w[((o * 2 + c) * 3 + a) * 2 + bb]
                                            * xd[((n * 2 + c) * 5 + r as usize) * 4 + q as usize];
                                    }
                                }
                            }
                        }
                        let got = y.data()[((n * 3 + o) * 3 + i) * 5 + j];
                        assert!((got - acc).abs() < 1e-12, "{got} vs {acc}");
                    }
                }
            }
        }
    }

    #[test]
    fn grouped_dilated_conv_is_the_engine_op_plus_bias() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let mut store = ParamStore::<f64>::new();
        let opts = Conv2dOptions::new().stride([1, 2]).padding([2, 1]).dilation([2, 1]).groups(2);
        let conv = Conv2d::with_options(&mut store, "c", 4, 6, [3, 2], opts, &mut rng).unwrap();
        assert_eq!(store.get(conv.weight).unwrap().dims(), [6, 2, 3, 2]);
        assert_eq!(conv.options(), opts);
        // Kaiming-uniform with fan_in = (4/2)·3·2 = 12: |w| ≤ √2·√(3/12).
        let bound = (2.0f64).sqrt() * (3.0f64 / 12.0).sqrt();
        assert!(store.get(conv.weight).unwrap().data().iter().all(|w| w.abs() <= bound));
        store.get_mut(conv.bias.unwrap()).unwrap().data_mut().copy_from_slice(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let x = Tensor::<f64>::normal(&[2, 4, 6, 5], 0.0, 1.0, &mut rng).unwrap();
        let w = store.get(conv.weight).unwrap().clone();
        let mut g = Graph::new();
        let (y, bare) = g.scope(|s| {
            let y = conv.forward(Ctx::eval(s, &store), s.input(&x)).to_tensor().unwrap();
            (y, s.input(&x).conv2d_with(s.input(&w), opts).to_tensor().unwrap())
        });
        // oh = (6 + 4 − 4 − 1)/1 + 1 = 6, ow = (5 + 2 − 1 − 1)/2 + 1 = 3.
        assert_eq!(y.dims(), [2, 6, 6, 3]);
        for (k, (a, b)) in y.data().iter().zip(bare.data()).enumerate() {
            assert_eq!(*a, b + ((k / 18) % 6 + 1) as f64);
        }
    }

    #[test]
    fn bad_groups_are_errors_naming_the_constructor() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut store = ParamStore::<f32>::new();
        for (c_in, c_out, g) in [(4, 6, 0), (4, 6, 3), (3, 6, 2)] {
            let e =
                Conv2d::with_options(&mut store, "c", c_in, c_out, [3, 3], Conv2dOptions::new().groups(g), &mut rng)
                    .unwrap_err();
            assert_eq!(e.op(), "Conv2d::with_options", "{e}");
            assert!(e.to_string().contains(&format!("groups {g}")), "{e}");
        }
        assert!(store.is_empty());
    }

    #[test]
    fn dilated_max_pool_is_the_engine_op() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(4);
        let x = Tensor::<f64>::normal(&[1, 2, 7, 7], 0.0, 1.0, &mut rng).unwrap();
        let pool = MaxPool2d::new(3).stride([2, 2]).padding([1, 1]).dilation([2, 2]);
        let store = ParamStore::<f64>::new();
        let mut g = Graph::new();
        let (y, bare) = g.scope(|s| {
            let y = pool.forward(Ctx::eval(s, &store), s.input(&x)).to_tensor().unwrap();
            (y, s.input(&x).max_pool2d_dilated([3, 3], [2, 2], [1, 1], [2, 2]).to_tensor().unwrap())
        });
        // oh = (7 + 2 − 5)/2 + 1 = 3.
        assert_eq!(y.dims(), [1, 2, 3, 3]);
        assert_eq!(y.data(), bare.data());
    }

    #[test]
    fn absurd_sizes_are_errors() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut store = ParamStore::<f32>::new();
        let big = 1usize << 40;
        assert!(Conv2d::new(&mut store, "c", big, big, [big, big], &mut rng).is_err());
        assert!(Conv2d::new(&mut store, "c", 0, 4, [3, 3], &mut rng).is_err());
        assert!(store.is_empty());
    }

    #[test]
    fn small_cnn_shapes_and_gradients_flow() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(2);
        let mut store = ParamStore::<f32>::new();
        let model = Sequential::new()
            .push(Conv2d::new(&mut store, "c1", 1, 4, [3, 3], &mut rng).unwrap().padding([1, 1]))
            .push(crate::layer::Activation::Relu)
            .push(MaxPool2d::new(2))
            .push(AvgPool2d::new(2))
            .push(Flatten)
            .push(crate::layer::Linear::new(&mut store, "fc", 16, 3, &mut rng).unwrap());
        let x = Tensor::<f32>::normal(&[5, 1, 8, 8], 0.0, 1.0, &mut rng).unwrap();
        let mut grads = store.zeros_like().unwrap();
        let mut g = Graph::new();
        g.scope(|s| {
            let y = model.forward(Ctx::train(s, &store), s.input(&x));
            assert_eq!(y.shape().to_vec(), [5, 3]);
            s.backward_into(y.cross_entropy(&[0, 1, 2, 0, 1]), &mut grads).unwrap();
        });
        for (id, gr) in grads.iter() {
            assert!(gr.data().iter().any(|&v| v != 0.0), "no gradient for {:?}", store.name(id));
        }
    }
}
