//! `tapir.Var`'s ops beyond the operators: elementwise functions, reductions, shape ops,
//! losses and the network ops, each recorded on the handle's scope.

use pyo3::prelude::*;
use pyo3::types::PyTuple;
use tapir::{Conv2dOptions, Float};

use crate::convert;
use crate::errors;
use crate::registry::on_scope;
use crate::var::{finish, record, PyVar};

macro_rules! unary {
    ($($(#[$doc:meta])* $name:ident),* $(,)?) => {
        #[pymethods]
        impl PyVar {
            $(
                $(#[$doc])*
                fn $name(&self, py: Python<'_>) -> PyResult<PyVar> {
                    record!(self, py, stringify!($name), |s, x, T| x.$name())
                }
            )*
        }
    };
}

unary!(
    /// `eˣ`, elementwise.
    exp,
    /// Natural logarithm, elementwise.
    log,
    /// `ln(1 + x)`, elementwise.
    log1p,
    /// `eˣ − 1`, elementwise.
    expm1,
    /// Square root, elementwise.
    sqrt,
    /// `1/√x`, elementwise.
    rsqrt,
    /// `x²`, elementwise.
    square,
    /// `1/x`, elementwise.
    recip,
    /// `|x|`, elementwise.
    abs,
    /// Sine, elementwise.
    sin,
    /// Cosine, elementwise.
    cos,
    /// Hyperbolic tangent, elementwise.
    tanh,
    /// Arctangent, elementwise.
    atan,
    /// The error function, elementwise.
    erf,
    /// `1/(1 + e⁻ˣ)`, elementwise.
    sigmoid,
    /// `max(x, 0)`, elementwise.
    relu,
    /// GELU (exact, with erf), elementwise.
    gelu,
    /// GELU, tanh approximation, elementwise.
    gelu_tanh,
    /// `ln(1 + eˣ)`, elementwise.
    softplus,
    /// `x·sigmoid(x)`, elementwise.
    silu,
    /// A copy that is a constant: no gradient flows back through it.
    detach,
);

/// Axes from `axis=None | int | tuple`; `None` means all.
fn axes(axis: Option<&Bound<'_, PyAny>>, rank: usize) -> PyResult<Vec<isize>> {
    match axis {
        None => Ok((0..rank as isize).collect()),
        Some(a) if a.is_none() => Ok((0..rank as isize).collect()),
        Some(a) => match a.extract::<isize>() {
            Ok(i) => Ok(vec![i]),
            Err(_) => a.extract::<Vec<isize>>(),
        },
    }
}

/// Integers from `reshape(2, 3)` or `reshape((2, 3))`, negative ones included (each op
/// says what a negative one means).
fn dims_of(args: &Bound<'_, PyTuple>) -> PyResult<Vec<i64>> {
    if args.len() == 1 {
        if let Ok(d) = args.get_item(0)?.extract::<Vec<i64>>() {
            return Ok(d);
        }
    }
    args.extract::<Vec<i64>>()
}

/// An error of class `class` for `op` on `me`, naming the handle (its op and shape) and
/// the caller's `file:line`.
fn refuse(py: Python<'_>, me: &PyVar, class: &str, op: &str, detail: String) -> PyErr {
    let at = errors::caller(py);
    errors::raise(py, class, format!("{op}: {detail} for {} (at {at})", crate::var::describe(me.index, &me.meta)))
}

impl PyVar {
    /// `reshape`'s dimensions, one `-1` inferred from the element count (NumPy's and
    /// PyTorch's rule).
    fn reshape_dims(&self, py: Python<'_>, dims: &[i64]) -> PyResult<Vec<usize>> {
        let numel = self.meta.shape.numel();
        let (mut infer, mut known, mut out) = (None, 1usize, Vec::with_capacity(dims.len()));
        for (k, &d) in dims.iter().enumerate() {
            match (d, usize::try_from(d)) {
                (_, Ok(d)) => {
                    known = known.saturating_mul(d);
                    out.push(d);
                }
                (-1, _) if infer.is_none() => {
                    infer = Some(k);
                    out.push(0);
                }
                _ => {
                    let detail = format!("dimensions {dims:?} (one -1 at most, no other negative size)");
                    return Err(refuse(py, self, "ShapeError", "reshape", detail));
                }
            }
        }
        if let Some(k) = infer {
            if known == 0 || numel % known != 0 {
                let detail = format!("dimensions {dims:?} cannot hold {numel} elements");
                return Err(refuse(py, self, "ShapeError", "reshape", detail));
            }
            out[k] = numel / known;
        }
        Ok(out)
    }

    /// Axes counted from the end where negative, as PyTorch's `permute` takes them.
    fn axes_from_end(&self, py: Python<'_>, op: &str, axes: &[i64]) -> PyResult<Vec<usize>> {
        let rank = self.meta.shape.rank() as i64;
        axes.iter()
            .map(|&a| {
                usize::try_from(if a < 0 { a + rank } else { a }).map_err(|_| {
                    refuse(py, self, "ShapeError", op, format!("axes {axes:?} out of range for rank {rank}"))
                })
            })
            .collect()
    }

    /// `broadcast_to`'s dimensions, `-1` keeping the matching dimension of this value
    /// (aligned from the last axis), as PyTorch's `expand`.
    fn broadcast_dims(&self, py: Python<'_>, dims: &[i64]) -> PyResult<Vec<usize>> {
        let shape = self.meta.shape.to_vec();
        let lead = dims.len() as i64 - shape.len() as i64;
        dims.iter()
            .enumerate()
            .map(|(k, &d)| match (d, usize::try_from(d)) {
                (_, Ok(d)) => Ok(d),
                (-1, _) if k as i64 >= lead => Ok(shape[(k as i64 - lead) as usize]),
                _ => Err(refuse(
                    py,
                    self,
                    "ShapeError",
                    "broadcast_to",
                    format!("dimensions {dims:?} (-1 only where this value has an axis, no other negative size)"),
                )),
            })
            .collect()
    }

    /// Non-negative integer options of `op` (sizes, strides, counts), or `ArgumentError`.
    fn sizes<const N: usize>(&self, py: Python<'_>, op: &str, what: &str, values: [i64; N]) -> PyResult<[usize; N]> {
        let mut out = [0; N];
        for (o, &v) in out.iter_mut().zip(&values) {
            *o = usize::try_from(v).map_err(|_| {
                let shown = if N == 1 { v.to_string() } else { format!("{values:?}") };
                refuse(py, self, "ArgumentError", op, format!("{what} {shown} must not be negative"))
            })?;
        }
        Ok(out)
    }
}

#[pymethods]
impl PyVar {
    /// `maximum(x, y)`, elementwise with broadcasting.
    fn maximum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "maximum", |s, x, T| x.maximum(self.operand(py, s, other, "maximum")?))
    }
    /// `minimum(x, y)`, elementwise with broadcasting.
    fn minimum(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "minimum", |s, x, T| x.minimum(self.operand(py, s, other, "minimum")?))
    }
    /// `x ** y` with a handle or array exponent.
    fn pow(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.__pow__(py, other, None)
    }
    /// Matrix product (batched over leading dimensions).
    fn matmul(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.__matmul__(py, other)
    }
    /// `max(x, slope·x)`.
    #[pyo3(signature = (slope=0.01))]
    fn leaky_relu(&self, py: Python<'_>, slope: f64) -> PyResult<PyVar> {
        record!(self, py, "leaky_relu", |s, x, T| x.leaky_relu(T::from_f64(slope)))
    }
    /// `min(max(x, lo), hi)`.
    fn clamp(&self, py: Python<'_>, lo: f64, hi: f64) -> PyResult<PyVar> {
        record!(self, py, "clamp", |s, x, T| x.clamp(T::from_f64(lo), T::from_f64(hi)))
    }

    /// Sum over `axis` (None: all; an int or a tuple), keeping reduced axes if `keepdims`.
    #[pyo3(signature = (axis=None, keepdims=false))]
    fn sum(&self, py: Python<'_>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyVar> {
        let ax = axes(axis, self.meta.shape.rank())?;
        record!(self, py, "sum", |s, x, T| x.sum_axes(&ax, keepdims))
    }
    /// Mean over `axis`, as `sum`.
    #[pyo3(signature = (axis=None, keepdims=false))]
    fn mean(&self, py: Python<'_>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyVar> {
        let ax = axes(axis, self.meta.shape.rank())?;
        record!(self, py, "mean", |s, x, T| x.mean_axes(&ax, keepdims))
    }
    /// Maximum over `axis`, as `sum`.
    #[pyo3(signature = (axis=None, keepdims=false))]
    fn max(&self, py: Python<'_>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyVar> {
        let ax = axes(axis, self.meta.shape.rank())?;
        record!(self, py, "max", |s, x, T| x.max_axes(&ax, keepdims))
    }
    /// Minimum over `axis`, as `sum`.
    #[pyo3(signature = (axis=None, keepdims=false))]
    fn min(&self, py: Python<'_>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool) -> PyResult<PyVar> {
        let ax = axes(axis, self.meta.shape.rank())?;
        record!(self, py, "min", |s, x, T| x.min_axes(&ax, keepdims))
    }
    /// Variance over `axis` with `correction` (1: Bessel's, as `torch.var`'s default).
    #[pyo3(signature = (axis=None, keepdims=false, correction=1))]
    fn var(&self, py: Python<'_>, axis: Option<&Bound<'_, PyAny>>, keepdims: bool, correction: i64) -> PyResult<PyVar> {
        let [correction] = self.sizes(py, "var", "correction", [correction])?;
        let ax = axes(axis, self.meta.shape.rank())?;
        record!(self, py, "var", |s, x, T| x.var(&ax, keepdims, correction))
    }
    /// `log Σ exp(x)` along `axis`.
    #[pyo3(signature = (axis=-1, keepdims=false))]
    fn logsumexp(&self, py: Python<'_>, axis: isize, keepdims: bool) -> PyResult<PyVar> {
        record!(self, py, "logsumexp", |s, x, T| x.logsumexp(axis, keepdims))
    }
    /// Softmax along `axis`.
    #[pyo3(signature = (axis=-1))]
    fn softmax(&self, py: Python<'_>, axis: isize) -> PyResult<PyVar> {
        record!(self, py, "softmax", |s, x, T| x.softmax(axis))
    }
    /// Log-softmax along `axis`.
    #[pyo3(signature = (axis=-1))]
    fn log_softmax(&self, py: Python<'_>, axis: isize) -> PyResult<PyVar> {
        record!(self, py, "log_softmax", |s, x, T| x.log_softmax(axis))
    }
    /// Mean cross-entropy of logits `[N, C]` against integer `labels` `[N]`.
    fn cross_entropy(&self, py: Python<'_>, labels: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        let labels = convert::indices(py, labels, "cross_entropy")?;
        record!(self, py, "cross_entropy", |s, x, T| x.cross_entropy(&labels))
    }
    /// Mean negative log-likelihood of log-probabilities `[N, C]` against `labels`.
    fn nll_loss(&self, py: Python<'_>, labels: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        let labels = convert::indices(py, labels, "nll_loss")?;
        record!(self, py, "nll_loss", |s, x, T| x.nll_loss(&labels))
    }
    /// Mean squared error against `target` (a handle or an array of the same shape).
    fn mse_loss(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "mse_loss", |s, x, T| x.mse_loss(self.operand(py, s, target, "mse_loss")?))
    }
    /// Mean binary cross-entropy of logits against targets in [0, 1].
    fn bce_with_logits(&self, py: Python<'_>, target: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "bce_with_logits", |s, x, T| x.bce_with_logits(self.operand(
            py,
            s,
            target,
            "bce_with_logits"
        )?))
    }

    /// The same elements with dimensions `dims` (`reshape(2, 3)` or `reshape((2, 3))`); one
    /// of them may be `-1`, inferred from the element count.
    #[pyo3(signature = (*dims))]
    fn reshape(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyVar> {
        let dims = self.reshape_dims(py, &dims_of(dims)?)?;
        record!(self, py, "reshape", |s, x, T| x.reshape(&dims))
    }
    /// Swaps axes `a0` and `a1` (default: the last two).
    #[pyo3(signature = (a0=-2, a1=-1))]
    fn transpose(&self, py: Python<'_>, a0: isize, a1: isize) -> PyResult<PyVar> {
        record!(self, py, "transpose", |s, x, T| x.transpose(a0, a1))
    }
    /// The last two axes swapped.
    #[getter(T)]
    fn t_(&self, py: Python<'_>) -> PyResult<PyVar> {
        record!(self, py, "t", |s, x, T| x.t())
    }
    /// Axes reordered: `permute(1, 0, 2)`; negative axes count from the end.
    #[pyo3(signature = (*axes))]
    fn permute(&self, py: Python<'_>, axes: &Bound<'_, PyTuple>) -> PyResult<PyVar> {
        let axes = self.axes_from_end(py, "permute", &dims_of(axes)?)?;
        record!(self, py, "permute", |s, x, T| x.permute(&axes))
    }
    /// Removes axis `axis`, which must have size 1.
    fn squeeze(&self, py: Python<'_>, axis: isize) -> PyResult<PyVar> {
        record!(self, py, "squeeze", |s, x, T| x.squeeze(axis))
    }
    /// Inserts an axis of size 1 at `axis`.
    fn unsqueeze(&self, py: Python<'_>, axis: isize) -> PyResult<PyVar> {
        record!(self, py, "unsqueeze", |s, x, T| x.unsqueeze(axis))
    }
    /// Broadcast to `dims`; `-1` keeps the matching dimension (PyTorch's `expand`).
    #[pyo3(signature = (*dims))]
    fn broadcast_to(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyVar> {
        let dims = self.broadcast_dims(py, &dims_of(dims)?)?;
        record!(self, py, "broadcast_to", |s, x, T| x.broadcast_to(&dims))
    }
    /// `length` elements of `axis` from `start`.
    fn narrow(&self, py: Python<'_>, axis: isize, start: i64, length: i64) -> PyResult<PyVar> {
        let [start, length] = self.sizes(py, "narrow", "start and length", [start, length])?;
        record!(self, py, "narrow", |s, x, T| x.narrow(axis, start, length))
    }
    /// The entries `indices` of `axis` (repeats allowed): an embedding lookup on axis 0.
    fn index_select(&self, py: Python<'_>, axis: isize, indices: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        let idx = convert::indices(py, indices, "index_select")?;
        record!(self, py, "index_select", |s, x, T| x.index_select(axis, &idx))
    }
    /// `x[i]`, `x[a:b]` (step 1) and tuples of them, on the leading axes.
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        let keys: Vec<Bound<'_, PyAny>> = match key.cast::<PyTuple>() {
            Ok(t) => t.iter().collect(),
            Err(_) => vec![key.clone()],
        };
        let dims = self.meta.shape.to_vec();
        if keys.len() > dims.len() {
            return Err(errors::raise(
                py,
                "TapirIndexError",
                format!("{} has {} axes, indexed with {}", self.name(), dims.len(), keys.len()),
            ));
        }
        // Each key as (axis start, length, drop the axis).
        let mut plan = Vec::with_capacity(keys.len());
        for (axis, k) in keys.iter().enumerate() {
            let n = dims[axis] as isize;
            if let Ok(sl) = k.cast::<pyo3::types::PySlice>() {
                let ind = sl.indices(n)?;
                if ind.step != 1 {
                    return Err(errors::raise(
                        py,
                        "ArgumentError",
                        format!("{}: slices with a step other than 1 are not supported", self.name()),
                    ));
                }
                plan.push((ind.start as usize, ind.slicelength, false));
            } else {
                let i: isize = k.extract()?;
                let j = if i < 0 { i + n } else { i };
                if !(0..n).contains(&j) {
                    return Err(errors::raise(
                        py,
                        "TapirIndexError",
                        format!("index {i} is out of range for axis {axis} of {}", self.name()),
                    ));
                }
                plan.push((j as usize, 1, true));
            }
        }
        record!(self, py, "getitem", |s, x, T| {
            let mut y = x;
            for (axis, &(start, len, _)) in plan.iter().enumerate() {
                if start != 0 || len != dims[axis] {
                    y = y.narrow(axis as isize, start, len);
                }
            }
            for (axis, &(_, _, drop)) in plan.iter().enumerate().rev() {
                if drop {
                    y = y.squeeze(axis as isize);
                }
            }
            y
        })
    }

    /// `x @ w + b` with `w` `[in, out]`.
    fn linear(&self, py: Python<'_>, w: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "linear", |s, x, T| x
            .linear(self.operand(py, s, w, "linear")?, self.operand(py, s, b, "linear")?))
    }
    /// Layer normalisation over the last axis with weight `w` and bias `b`.
    #[pyo3(signature = (w, b, eps=1e-5))]
    fn layer_norm(&self, py: Python<'_>, w: &Bound<'_, PyAny>, b: &Bound<'_, PyAny>, eps: f64) -> PyResult<PyVar> {
        record!(self, py, "layer_norm", |s, x, T| x.layer_norm(
            self.operand(py, s, w, "layer_norm")?,
            self.operand(py, s, b, "layer_norm")?,
            eps
        ))
    }
    /// 2-D convolution (cross-correlation) of `[N, C, H, W]` with `w` `[O, C/groups, kh,
    /// kw]`, as PyTorch's `F.conv2d`: `dilation` spaces the kernel's taps, `groups` splits
    /// the channels into blocks that see only their own (`groups = C`: depthwise).
    #[pyo3(signature = (w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1))]
    fn conv2d(
        &self,
        py: Python<'_>,
        w: &Bound<'_, PyAny>,
        stride: (i64, i64),
        padding: (i64, i64),
        dilation: (i64, i64),
        groups: i64,
    ) -> PyResult<PyVar> {
        let stride = self.sizes(py, "conv2d", "stride", [stride.0, stride.1])?;
        let padding = self.sizes(py, "conv2d", "padding", [padding.0, padding.1])?;
        let dilation = self.sizes(py, "conv2d", "dilation", [dilation.0, dilation.1])?;
        let [groups] = self.sizes(py, "conv2d", "groups", [groups])?;
        // With the default options `conv2d_with` records what `conv2d` records, so one
        // call serves both; its errors are renamed to the method the caller called.
        let options = Conv2dOptions::new().stride(stride).padding(padding).dilation(dilation).groups(groups);
        record!(self, py, "conv2d", |s, x, T| x.conv2d_with(self.operand(py, s, w, "conv2d")?, options))
            .map_err(|e| errors::renamed(py, e, "conv2d_with", "conv2d"))
    }
    /// Causal (or full) self-attention weights from packed `qkv` `[B, T, 3·D]` with
    /// `heads` heads: `softmax(q·kᵀ/√d)` per head, `[B, heads, T, T]`.
    #[pyo3(signature = (heads, causal=true))]
    fn attention_weights(&self, py: Python<'_>, heads: i64, causal: bool) -> PyResult<PyVar> {
        let [heads] = self.sizes(py, "attention_weights", "heads", [heads])?;
        record!(self, py, "attention_weights", |s, x, T| x.attention_weights(heads, causal))
    }
    /// The weights (this handle, `[B, H, T, T]`) applied to the value blocks of `qkv`: `[B, T, D]`.
    fn attend(&self, py: Python<'_>, qkv: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "attend", |s, x, T| x.attend(self.operand(py, s, qkv, "attend")?))
    }
    /// 2-D max pooling, as PyTorch's `F.max_pool2d`: `stride` defaults to `kernel`, and
    /// `dilation` spaces a window's taps.
    #[pyo3(signature = (kernel, stride=None, padding=(0, 0), dilation=(1, 1)))]
    fn max_pool2d(
        &self,
        py: Python<'_>,
        kernel: (i64, i64),
        stride: Option<(i64, i64)>,
        padding: (i64, i64),
        dilation: (i64, i64),
    ) -> PyResult<PyVar> {
        let op = "max_pool2d";
        let st = stride.unwrap_or(kernel);
        let (kernel, st) =
            (self.sizes(py, op, "kernel", [kernel.0, kernel.1])?, self.sizes(py, op, "stride", [st.0, st.1])?);
        let padding = self.sizes(py, op, "padding", [padding.0, padding.1])?;
        let dilation = self.sizes(py, op, "dilation", [dilation.0, dilation.1])?;
        // Dilation [1, 1] runs the undilated loops (the engine compiles them apart).
        record!(self, py, "max_pool2d", |s, x, T| x.max_pool2d_dilated(kernel, st, padding, dilation))
            .map_err(|e| errors::renamed(py, e, "max_pool2d_dilated", "max_pool2d"))
    }
    /// 2-D average pooling.
    #[pyo3(signature = (kernel, stride=None, padding=(0, 0)))]
    fn avg_pool2d(
        &self,
        py: Python<'_>,
        kernel: (i64, i64),
        stride: Option<(i64, i64)>,
        padding: (i64, i64),
    ) -> PyResult<PyVar> {
        let op = "avg_pool2d";
        let st = stride.unwrap_or(kernel);
        let (kernel, st) =
            (self.sizes(py, op, "kernel", [kernel.0, kernel.1])?, self.sizes(py, op, "stride", [st.0, st.1])?);
        let padding = self.sizes(py, op, "padding", [padding.0, padding.1])?;
        record!(self, py, "avg_pool2d", |s, x, T| x.avg_pool2d(kernel, st, padding))
    }

    /// `1.0` where `x > y`, else `0.0` (a constant).
    fn gt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "gt", |s, x, T| x.gt(self.operand(py, s, other, "gt")?))
    }
    /// `1.0` where `x >= y`, else `0.0`.
    fn ge(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "ge", |s, x, T| x.ge(self.operand(py, s, other, "ge")?))
    }
    /// `1.0` where `x < y`, else `0.0`.
    fn lt(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "lt", |s, x, T| x.lt(self.operand(py, s, other, "lt")?))
    }
    /// `1.0` where `x <= y`, else `0.0`.
    fn le(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "le", |s, x, T| x.le(self.operand(py, s, other, "le")?))
    }
    /// `1.0` where `x == y`, else `0.0`.
    fn equal(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        record!(self, py, "equal", |s, x, T| x.equal(self.operand(py, s, other, "equal")?))
    }
    fn __gt__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.gt(py, other)
    }
    fn __ge__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.ge(py, other)
    }
    fn __lt__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.lt(py, other)
    }
    fn __le__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyVar> {
        self.le(py, other)
    }
}
