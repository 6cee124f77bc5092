//! `conv2d`, composed from `im2col`, `reshape` and `matmul`, and its options (stride,
//! padding, dilation, groups), so that its gradients and their derivatives need no code
//! of their own.
//!
//! One group: `out = reshape(w, [O, C·kh·kw]) · im2col(x)`, reshaped to `[N, O, oh, ow]`.
//! `g` groups: input channel block `k` (channels `k·C/g .. (k + 1)·C/g`) feeds output
//! channel block `k` only, so the columns `[N, C·kh·kw, L]` are viewed as
//! `[N, g, (C/g)·kh·kw, L]` (a group's rows are contiguous, since a column row's channel
//! is its slowest index), the weights `[O, C/g, kh, kw]` as `[g, O/g, (C/g)·kh·kw]`, and
//! one batched matmul (the weights broadcast over `N`) gives `[N, g, O/g, L]`, which is
//! `[N, O, oh, ow]` in memory order. With one group the recording is the one-GEMM form
//! above, unchanged.

use crate::dtype::Float;
use crate::error::Error;
use crate::record::handles::Var;

use super::window::{Args, Window};

/// The options of [`Var::conv2d_with`], as PyTorch's `F.conv2d` keyword arguments:
/// `stride` (default `[1, 1]`), zero `padding` on each side (`[0, 0]`), kernel
/// `dilation` (`[1, 1]`: taps `dilation` apart) and `groups` (1: every output channel
/// sees every input channel; `g`: the channels split into `g` blocks that see only their
/// own; the number of input channels: depthwise).
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// use tapir::{Conv2dOptions, Graph, Tensor};
/// let x = Tensor::<f64>::ones(&[1, 4, 9, 7])?;
/// let w = Tensor::<f64>::ones(&[4, 1, 3, 3])?; // depthwise: [C, C/groups = 1, kh, kw]
/// let mut g = Graph::new();
/// let dims = g.scope(|s| {
///     let opts = Conv2dOptions::new().padding([1, 1]).dilation([2, 2]).groups(4);
///     s.input(&x).conv2d_with(s.input(&w), opts).shape().to_vec()
/// });
/// // oh = (9 + 2·1 − 2·(3 − 1) − 1)/1 + 1 = 7, ow = (7 + 2 − 4 − 1)/1 + 1 = 5.
/// assert_eq!(dims, [1, 4, 7, 5]);
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Conv2dOptions {
    /// Vertical and horizontal step between windows.
    pub stride: [usize; 2],
    /// Zero padding on each side, vertical and horizontal.
    pub padding: [usize; 2],
    /// Distance between a kernel's taps, vertical and horizontal.
    pub dilation: [usize; 2],
    /// Number of channel blocks; divides both the input and the output channels.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions::new()
    }
}

impl Conv2dOptions {
    /// Stride 1, no padding, no dilation, one group: PyTorch's defaults.
    pub const fn new() -> Conv2dOptions {
        Conv2dOptions { stride: [1, 1], padding: [0, 0], dilation: [1, 1], groups: 1 }
    }

    /// These options with another stride.
    #[must_use]
    pub const fn stride(mut self, stride: [usize; 2]) -> Conv2dOptions {
        self.stride = stride;
        self
    }

    /// These options with another padding.
    #[must_use]
    pub const fn padding(mut self, padding: [usize; 2]) -> Conv2dOptions {
        self.padding = padding;
        self
    }

    /// These options with another dilation.
    #[must_use]
    pub const fn dilation(mut self, dilation: [usize; 2]) -> Conv2dOptions {
        self.dilation = dilation;
        self
    }

    /// These options with another number of groups.
    #[must_use]
    pub const fn groups(mut self, groups: usize) -> Conv2dOptions {
        self.groups = groups;
        self
    }
}

impl<'s, T: Float> Var<'s, T> {
    /// 2-D convolution (cross-correlation, as in PyTorch) of `x: [N, C, H, W]` with
    /// weights `w: [O, C, kh, kw]`: `out: [N, O, oh, ow]`,
    /// `out[n, o, oi, oj] = Σ_{c,a,b} w[o, c, a, b] · x[n, c, oi·sh + a − ph, oj·sw + b − pw]`.
    /// Composed as `reshape(w, [O, C·kh·kw]) · im2col(x)`, so gradients need no new code.
    /// For dilation and groups, see [`conv2d_with`](Var::conv2d_with).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] (recorded) unless `w` is 4-D with `C` input channels, and
    /// as [`im2col`](Var::im2col).
    #[track_caller]
    pub fn conv2d(self, w: Var<'s, T>, stride: [usize; 2], padding: [usize; 2]) -> Var<'s, T> {
        let _name = self.core.composite("conv2d");
        self.conv2d_with(w, Conv2dOptions::new().stride(stride).padding(padding))
    }

    /// 2-D convolution with PyTorch's `F.conv2d` options (see [`Conv2dOptions`]): `x: [N,
    /// C, H, W]`, weights `w: [O, C/g, kh, kw]` for `g` groups, `out: [N, O, oh, ow]` with
    /// `oh = (H + 2·ph − dh·(kh − 1) − 1)/sh + 1` and likewise `ow`, and
    /// `out[n, o, oi, oj] = Σ_{c,a,b} w[o, c, a, b] · x[n, k·C/g + c, oi·sh + a·dh − ph,
    /// oj·sw + b·dw − pw]`, where `k = o/(O/g)` is the output channel's group and `c` runs
    /// over the group's `C/g` channels. Groups `C` with `O = m·C` is a depthwise
    /// convolution (`m` filters per channel).
    ///
    /// Composed from [`im2col_dilated`](Var::im2col_dilated), `reshape` and one (batched,
    /// for `g > 1`) `matmul`, so gradients of every order come from those; with default
    /// options it records what [`conv2d`](Var::conv2d) records.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] (recorded) for zero groups, and as
    /// [`im2col_dilated`](Var::im2col_dilated) for the window; [`Error::InvalidShape`]
    /// unless `x` and `w` are 4-D, `C` and `O` are multiples of `g` and `w` has `C/g`
    /// input channels. Each error names the op, the input and weight shapes and the
    /// caller's line.
    #[track_caller]
    pub fn conv2d_with(self, w: Var<'s, T>, options: Conv2dOptions) -> Var<'s, T> {
        let _name = self.core.composite("conv2d_with");
        let Conv2dOptions { stride, padding, dilation, groups } = options;
        let (sx, sw) = (self.shape(), w.shape());
        let location = std::panic::Location::caller();
        if groups == 0 {
            return self.core.fail_as("conv2d_with", |op| Error::InvalidArgument {
                op,
                detail: format!("groups must be positive, got 0 (input shape {sx}, weights {sw})"),
                location,
            });
        }
        let fits = sw.rank() == 4
            && sx.rank() == 4
            && sx.dim(1) % groups == 0
            && sw.dim(0) % groups == 0
            && sx.dim(1) / groups == sw.dim(1);
        if !fits {
            let detail = if groups == 1 {
                format!("needs input [N, C, H, W] and weights [O, C, kh, kw] with equal C, got weights {sw}")
            } else {
                format!(
                    "needs input [N, C, H, W] and weights [O, C/groups, kh, kw] with C and O multiples of \
                     groups = {groups}, got weights {sw}"
                )
            };
            return self.core.fail_as("conv2d_with", |op| Error::InvalidShape { op, shape: sx, detail, location });
        }
        let (o, cg, kh, kw) = (sw.dim(0), sw.dim(1), sw.dim(2), sw.dim(3));
        let args = Args { kernel: [kh, kw], stride, padding, dilation };
        let cols = self.im2col_args(args);
        // Saturating: with huge zero-size weights the product overflows; reshape then fails.
        let k = cg.saturating_mul(kh).saturating_mul(kw);
        let Some(win) = Window::new(sx, args.geom()) else {
            // im2col has recorded the error already; this handle is poisoned.
            return cols;
        };
        if groups == 1 {
            return w.reshape(&[o, k]).matmul(cols).reshape(&[win.n, o, win.oh, win.ow]);
        }
        // The window fitted, so the column count `oh·ow` is im2col's, which fitted.
        let cols = cols.reshape(&[win.n, groups, k, win.oh * win.ow]);
        w.reshape(&[groups, o / groups, k]).matmul(cols).reshape(&[win.n, o, win.oh, win.ow])
    }
}
