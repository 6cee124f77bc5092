//! [`Tensor`]: an owned, contiguous, row-major tensor of `f32` or `f64`, for parameters,
//! inputs and inference. Its eager ops use the same kernels as the graph's ops.

use std::panic::Location;

use rand::{Rng, RngExt};
use rand_distr::{Distribution, StandardNormal};

use crate::dtype::Float;
use crate::error::{try_vec, Error, Loc, Result};
use crate::kernels;
use crate::kernels::matmul::MatMulDims;
use crate::shape::Shape;

/// An owned dense tensor.
#[derive(Clone, PartialEq)]
pub struct Tensor<T: Float = f32> {
    data: Vec<T>,
    shape: Shape,
}

impl<T: Float> std::fmt::Debug for Tensor<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Tensor<{}>{} ", T::NAME, self.shape)?;
        f.debug_list().entries(self.data.iter().take(16)).finish()?;
        if self.data.len() > 16 {
            write!(f, " … ({} elements)", self.data.len())?;
        }
        Ok(())
    }
}

#[track_caller]
fn shape_for(op: &'static str, dims: &[usize]) -> Result<Shape> {
    crate::error::shape_of(op, Shape::scalar(), dims)
}

/// Fills `out` from `N(0, 1)`.
pub(crate) fn fill_normal<T: Float, R: Rng + ?Sized>(out: &mut [T], rng: &mut R) {
    for v in out {
        let z: f64 = StandardNormal.sample(rng);
        *v = T::from_f64(z);
    }
}

impl<T: Float> Tensor<T> {
    /// A tensor of `shape` filled with `v`, allocated fallibly: every owned tensor is made
    /// through here, so the allocator refusing memory is an [`Error::TensorOutOfMemory`]
    /// naming `op`, the shape and `location`, never an abort.
    pub(crate) fn full_at(op: &'static str, shape: Shape, v: T, location: Loc) -> Result<Tensor<T>> {
        Ok(Tensor { data: try_vec(op, shape, shape.numel(), v, location)?, shape })
    }

    /// A tensor owning `data` (whose length is `shape`'s element count).
    pub(crate) fn from_parts(data: Vec<T>, shape: Shape) -> Tensor<T> {
        debug_assert_eq!(data.len(), shape.numel());
        Tensor { data, shape }
    }

    /// A tensor of `shape` copied from `data`, allocated fallibly (for copying values and
    /// gradients out of a scope, as the function transforms of `func` do); see
    /// [`Tensor::full_at`].
    pub(crate) fn copy_at(op: &'static str, shape: Shape, data: &[T], location: Loc) -> Result<Tensor<T>> {
        let mut t = Self::zeros_at(op, shape, location)?;
        t.data.copy_from_slice(data);
        Ok(t)
    }

    /// Zeros of `shape`; see [`Tensor::full_at`].
    pub(crate) fn zeros_at(op: &'static str, shape: Shape, location: Loc) -> Result<Tensor<T>> {
        Self::full_at(op, shape, T::ZERO, location)
    }

    /// A tensor with shape `dims` that owns `data` (row-major).
    ///
    /// # Errors
    /// [`Error::DataLength`] if `data.len()` is not the product of `dims`;
    /// [`Error::InvalidShape`] for a rank above 6 or an overflowing element count.
    /// On error `data` is dropped; use [`Tensor::from_slice`] to keep it.
    #[track_caller]
    pub fn from_vec(data: Vec<T>, dims: &[usize]) -> Result<Tensor<T>> {
        let shape = shape_for("from_vec", dims)?;
        if data.len() != shape.numel() {
            return Err(Error::DataLength { op: "from_vec", len: data.len(), shape, location: Location::caller() });
        }
        Ok(Tensor { data, shape })
    }

    /// A tensor with shape `dims` copied from `data`.
    ///
    /// # Errors
    /// As [`Tensor::from_vec`].
    #[track_caller]
    pub fn from_slice(data: &[T], dims: &[usize]) -> Result<Tensor<T>> {
        let shape = shape_for("from_slice", dims)?;
        if data.len() != shape.numel() {
            return Err(Error::DataLength { op: "from_slice", len: data.len(), shape, location: Location::caller() });
        }
        let mut t = Self::zeros_at("from_slice", shape, Location::caller())?;
        t.data.copy_from_slice(data);
        Ok(t)
    }

    /// A tensor filled with `v`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for a rank above 6 or an overflowing element count;
    /// [`Error::TensorOutOfMemory`] if the allocator refuses the memory.
    #[track_caller]
    pub fn full(dims: &[usize], v: T) -> Result<Tensor<T>> {
        Self::full_named("full", dims, v)
    }

    #[track_caller]
    fn full_named(op: &'static str, dims: &[usize], v: T) -> Result<Tensor<T>> {
        Self::full_at(op, shape_for(op, dims)?, v, Location::caller())
    }

    /// Zeros. See [`Tensor::full`].
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn zeros(dims: &[usize]) -> Result<Tensor<T>> {
        Self::full_named("zeros", dims, T::ZERO)
    }

    /// Ones. See [`Tensor::full`].
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn ones(dims: &[usize]) -> Result<Tensor<T>> {
        Self::full_named("ones", dims, T::ONE)
    }

    /// A scalar (shape `[]`).
    pub fn scalar(v: T) -> Tensor<T> {
        Tensor { data: vec![v], shape: Shape::scalar() }
    }

    /// `[start, start + step, ...]` below `end` (1-D).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `step` is zero or not finite, or the bounds are not finite;
    /// [`Error::InvalidShape`] if the element count overflows; [`Error::TensorOutOfMemory`].
    #[track_caller]
    pub fn arange(start: T, end: T, step: T) -> Result<Tensor<T>> {
        let (s, e, st) = (start.to_f64(), end.to_f64(), step.to_f64());
        if !(s.is_finite() && e.is_finite() && st.is_finite()) || st == 0.0 {
            return Err(Error::InvalidArgument {
                op: "arange",
                detail: format!("needs finite bounds and a finite non-zero step, got start {s}, end {e}, step {st}"),
                location: Location::caller(),
            });
        }
        // The float-to-int cast saturates, so a huge count becomes usize::MAX and fails the
        // shape check below rather than wrapping.
        let n = ((e - s) / st).ceil().max(0.0) as usize;
        let shape = shape_for("arange", &[n])?;
        let mut t = Self::zeros_at("arange", shape, Location::caller())?;
        for (i, v) in t.data.iter_mut().enumerate() {
            *v = T::from_f64(s + st * i as f64);
        }
        Ok(t)
    }

    /// The `n×n` identity matrix.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if `n²` overflows; [`Error::TensorOutOfMemory`].
    #[track_caller]
    pub fn eye(n: usize) -> Result<Tensor<T>> {
        let mut t = Self::full_named("eye", &[n, n], T::ZERO)?;
        for i in 0..n {
            t.data[i * n + i] = T::ONE;
        }
        Ok(t)
    }

    /// Samples from `N(mean, std²)` with `rng` (seed it for reproducible runs).
    ///
    /// # Errors
    /// As [`Tensor::full`]; [`Error::InvalidArgument`] unless `mean` and `std` are finite
    /// and `std ≥ 0`.
    #[track_caller]
    pub fn normal<R: Rng + ?Sized>(dims: &[usize], mean: T, std: T, rng: &mut R) -> Result<Tensor<T>> {
        if !(mean.is_finite() && std.is_finite() && std >= T::ZERO) {
            return Err(Error::InvalidArgument {
                op: "normal",
                detail: format!("needs a finite mean and a finite std >= 0, got mean {mean}, std {std}"),
                location: Location::caller(),
            });
        }
        let mut t = Self::full_named("normal", dims, T::ZERO)?;
        fill_normal(&mut t.data, rng);
        for v in &mut t.data {
            *v = mean + std * *v;
        }
        Ok(t)
    }

    /// Samples uniformly from `[lo, hi)` with `rng`.
    ///
    /// # Errors
    /// As [`Tensor::full`]; [`Error::InvalidArgument`] unless `lo` and `hi` are finite and
    /// `lo ≤ hi`.
    #[track_caller]
    pub fn uniform<R: Rng + ?Sized>(dims: &[usize], lo: T, hi: T, rng: &mut R) -> Result<Tensor<T>> {
        if !(lo.is_finite() && hi.is_finite() && lo <= hi) {
            return Err(Error::InvalidArgument {
                op: "uniform",
                detail: format!("needs finite bounds with lo <= hi, got lo {lo}, hi {hi}"),
                location: Location::caller(),
            });
        }
        let mut t = Self::full_named("uniform", dims, T::ZERO)?;
        let (l, h) = (lo.to_f64(), hi.to_f64());
        for v in &mut t.data {
            let u: f64 = rng.random();
            // A convex combination, so `hi − lo` cannot overflow for bounds near the
            // largest finite value.
            *v = T::from_f64(l * (1.0 - u) + h * u);
        }
        Ok(t)
    }

    /// The shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// The dimensions.
    pub fn dims(&self) -> Vec<usize> {
        self.shape.to_vec()
    }

    /// The elements, row-major.
    pub fn data(&self) -> &[T] {
        &self.data
    }

    /// The elements, mutably.
    pub fn data_mut(&mut self) -> &mut [T] {
        &mut self.data
    }

    /// The elements, by value.
    pub fn into_vec(self) -> Vec<T> {
        self.data
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The single element of a one-element tensor.
    ///
    /// # Errors
    /// [`Error::NotScalar`] otherwise.
    #[track_caller]
    pub fn item(&self) -> Result<T> {
        match self.data[..] {
            [v] => Ok(v),
            _ => Err(Error::NotScalar { op: "item", shape: self.shape, location: Location::caller() }),
        }
    }

    /// The same elements under another shape.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if the element counts differ.
    #[track_caller]
    pub fn reshape(mut self, dims: &[usize]) -> Result<Tensor<T>> {
        let shape = crate::error::shape_of("reshape", self.shape, dims)?;
        if shape.numel() != self.shape.numel() {
            return Err(Error::InvalidShape {
                op: "reshape",
                shape: self.shape,
                detail: format!("cannot view {} elements as {dims:?}", self.shape.numel()),
                location: Location::caller(),
            });
        }
        self.shape = shape;
        Ok(self)
    }

    /// A faer view of a 2-D tensor, or `None` for another rank.
    pub fn as_mat(&self) -> Option<faer::MatRef<'_, T>> {
        (self.shape.rank() == 2)
            .then(|| faer::MatRef::from_row_major_slice(&self.data, self.shape.dim(0), self.shape.dim(1)))
    }

    /// A tensor copied from a faer matrix (any strides).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if a dimension exceeds `u32::MAX` (a faer view of `2³² × 0`
    /// exists without memory); [`Error::TensorOutOfMemory`].
    #[track_caller]
    pub fn from_mat(m: faer::MatRef<'_, T>) -> Result<Tensor<T>> {
        let (r, c) = (m.nrows(), m.ncols());
        let shape = shape_for("from_mat", &[r, c])?;
        let mut t = Self::zeros_at("from_mat", shape, Location::caller())?;
        if c > 0 {
            for (i, row) in t.data.chunks_exact_mut(c).enumerate() {
                for (j, v) in row.iter_mut().enumerate() {
                    *v = m[(i, j)];
                }
            }
        }
        Ok(t)
    }

    /// A faer matrix copied from a 2-D tensor, or `None` for another rank.
    pub fn to_mat(&self) -> Option<faer::Mat<T>> {
        self.as_mat().map(|m| faer::Mat::from_fn(m.nrows(), m.ncols(), |i, j| m[(i, j)]))
    }

    #[track_caller]
    fn zip_with(&self, other: &Tensor<T>, op: &'static str, f: impl Fn(T, T) -> T) -> Result<Tensor<T>> {
        let so = self.shape.broadcast(&other.shape).ok_or(Error::Broadcast {
            op,
            lhs: self.shape,
            rhs: other.shape,
            location: Location::caller(),
        })?;
        let mut out = Self::zeros_at(op, so, Location::caller())?;
        kernels::binary((&self.data, &self.shape), (&other.data, &other.shape), (&mut out.data, &so), f);
        Ok(out)
    }

    /// Elementwise sum with broadcasting.
    ///
    /// # Errors
    /// [`Error::Broadcast`] if the shapes do not broadcast.
    #[track_caller]
    pub fn add(&self, other: &Tensor<T>) -> Result<Tensor<T>> {
        self.zip_with(other, "add", |x, y| x + y)
    }

    /// Elementwise difference with broadcasting.
    ///
    /// # Errors
    /// [`Error::Broadcast`] if the shapes do not broadcast.
    #[track_caller]
    pub fn sub(&self, other: &Tensor<T>) -> Result<Tensor<T>> {
        self.zip_with(other, "sub", |x, y| x - y)
    }

    /// Elementwise product with broadcasting.
    ///
    /// # Errors
    /// [`Error::Broadcast`] if the shapes do not broadcast.
    #[track_caller]
    pub fn mul(&self, other: &Tensor<T>) -> Result<Tensor<T>> {
        self.zip_with(other, "mul", |x, y| x * y)
    }

    /// Elementwise quotient with broadcasting.
    ///
    /// # Errors
    /// [`Error::Broadcast`] if the shapes do not broadcast.
    #[track_caller]
    pub fn div(&self, other: &Tensor<T>) -> Result<Tensor<T>> {
        self.zip_with(other, "div", |x, y| x / y)
    }

    /// `f` applied to every element.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn map(&self, f: impl Fn(T) -> T) -> Result<Tensor<T>> {
        self.map_named("map", f)
    }

    #[track_caller]
    fn map_named(&self, op: &'static str, f: impl Fn(T) -> T) -> Result<Tensor<T>> {
        let mut out = Self::zeros_at(op, self.shape, Location::caller())?;
        kernels::map(&self.data, &mut out.data, f);
        Ok(out)
    }

    /// `max(x, 0)` elementwise.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn relu(&self) -> Result<Tensor<T>> {
        self.map_named("relu", crate::kernels::scalar::relu)
    }

    /// `eˣ` elementwise.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn exp(&self) -> Result<Tensor<T>> {
        self.map_named("exp", T::exp)
    }

    /// Natural logarithm elementwise.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn log(&self) -> Result<Tensor<T>> {
        self.map_named("log", T::ln)
    }

    /// Square root elementwise.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn sqrt(&self) -> Result<Tensor<T>> {
        self.map_named("sqrt", T::sqrt)
    }

    /// `tanh x` elementwise.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn tanh(&self) -> Result<Tensor<T>> {
        self.map_named("tanh", T::tanh)
    }

    /// Logistic sigmoid elementwise, the same stable formula as [`Var::sigmoid`](crate::Var::sigmoid).
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn sigmoid(&self) -> Result<Tensor<T>> {
        self.map_named("sigmoid", crate::kernels::scalar::sigmoid)
    }

    /// `ln(1 + eˣ)` elementwise, as [`Var::softplus`](crate::Var::softplus).
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn softplus(&self) -> Result<Tensor<T>> {
        self.map_named("softplus", crate::kernels::scalar::softplus)
    }

    /// GELU with the exact normal CDF, as [`Var::gelu`](crate::Var::gelu).
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn gelu(&self) -> Result<Tensor<T>> {
        self.map_named("gelu", crate::kernels::scalar::gelu_erf)
    }

    /// GELU with the tanh approximation, as [`Var::gelu_tanh`](crate::Var::gelu_tanh).
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the result cannot be allocated.
    #[track_caller]
    pub fn gelu_tanh(&self) -> Result<Tensor<T>> {
        self.map_named("gelu_tanh", crate::kernels::scalar::gelu_tanh)
    }

    /// Log-softmax along `axis`, as [`Var::log_softmax`](crate::Var::log_softmax).
    ///
    /// # Errors
    /// [`Error::BadAxis`] if `axis` is out of range.
    #[track_caller]
    pub fn log_softmax(&self, axis: isize) -> Result<Tensor<T>> {
        self.softmax_impl(axis, true, "log_softmax")
    }

    /// Sum over `axis`, keeping it as size 1, as [`Var::sum_axes`](crate::Var::sum_axes).
    ///
    /// # Errors
    /// [`Error::BadAxis`] if `axis` is out of range; [`Error::InvalidShape`] if the result
    /// has too many elements (the axis has size 0 and the other dimensions' product
    /// overflows, as for `[0, 2³¹, 2³¹]`); [`Error::TensorOutOfMemory`].
    #[track_caller]
    pub fn sum_axis(&self, axis: isize) -> Result<Tensor<T>> {
        let ax = self.axis("sum_axis", axis)?;
        // Setting a size-0 axis to 1 can grow the element count from 0 past the limit, so
        // the new shape is checked like any caller-given one.
        let mut dims = self.shape.to_array();
        dims[ax] = 1;
        let shape = crate::error::shape_of("sum_axis", self.shape, &dims[..self.shape.rank()])?;
        let mut out = Self::zeros_at("sum_axis", shape, Location::caller())?;
        if self.data.is_empty() {
            return Ok(out); // the sum of nothing: zeros, already in place
        }
        kernels::reduce::sum_axis(&self.data, self.shape.split_at_axis(ax), &mut out.data);
        Ok(out)
    }

    #[track_caller]
    fn axis(&self, op: &'static str, axis: isize) -> Result<usize> {
        crate::shape::resolve_axis(self.shape.rank(), axis).ok_or(Error::BadAxis {
            op,
            axis,
            shape: self.shape,
            location: Location::caller(),
        })
    }

    #[track_caller]
    fn softmax_impl(&self, axis: isize, log: bool, op: &'static str) -> Result<Tensor<T>> {
        let ax = self.axis(op, axis)?;
        let mut out = Self::zeros_at(op, self.shape, Location::caller())?;
        // The kernel walks every (outer, inner) pair even when the axis is empty, which for
        // `[0, 2³¹, 2³¹]` is 2⁶² pairs and nothing to compute.
        if self.data.is_empty() {
            return Ok(out);
        }
        kernels::reduce::softmax_axis(&self.data, self.shape.split_at_axis(ax), &mut out.data, log);
        Ok(out)
    }

    /// Sum of all elements.
    pub fn sum(&self) -> T {
        kernels::reduce::sum(&self.data)
    }

    /// Softmax along `axis`.
    ///
    /// # Errors
    /// [`Error::BadAxis`] if `axis` is out of range.
    #[track_caller]
    pub fn softmax(&self, axis: isize) -> Result<Tensor<T>> {
        self.softmax_impl(axis, false, "softmax")
    }

    /// Index of the largest element of each row of a 2-D tensor (first on ties).
    ///
    /// # Errors
    /// [`Error::InvalidShape`] unless the tensor is 2-D with at least one column.
    #[track_caller]
    pub fn argmax_rows(&self) -> Result<Vec<usize>> {
        if self.shape.rank() != 2 || self.shape.dim(1) == 0 {
            return Err(Error::InvalidShape {
                op: "argmax_rows",
                shape: self.shape,
                detail: "needs a 2-D tensor with at least one column".into(),
                location: Location::caller(),
            });
        }
        let c = self.shape.dim(1);
        let mut out = try_vec("argmax_rows", self.shape, self.shape.dim(0), 0, Location::caller())?;
        for (slot, row) in out.iter_mut().zip(self.data.chunks(c)) {
            *slot = row.iter().enumerate().fold(0, |best, (j, &v)| if v > row[best] { j } else { best });
        }
        Ok(out)
    }

    /// Matrix product (batched, broadcast batch dimensions), through faer on `threads`
    /// threads (1: sequential; 0: all of rayon's global pool; counts above
    /// [`MAX_THREADS`](crate::MAX_THREADS) are clamped to it, as in
    /// [`Graph::set_threads`](crate::Graph::set_threads)).
    ///
    /// # Errors
    /// [`Error::MatMulShape`] as for [`Var::matmul`](crate::Var::matmul);
    /// [`Error::TensorOutOfMemory`].
    #[track_caller]
    pub fn matmul(&self, other: &Tensor<T>, threads: usize) -> Result<Tensor<T>> {
        let (dims, so) = MatMulDims::new(&self.shape, &other.shape)
            .map_err(|p| MatMulDims::error("matmul", self.shape, other.shape, p, Location::caller()))?;
        let (par, _) = crate::threads::par(threads);
        let mut out = Self::zeros_at("matmul", so, Location::caller())?;
        kernels::matmul::forward(&dims, &self.data, &other.data, &mut out.data, par);
        Ok(out)
    }

    /// Copies another tensor's elements into this one.
    ///
    /// # Errors
    /// [`Error::ShapeMismatch`] if the shapes differ; nothing is copied then.
    #[track_caller]
    pub fn copy_from(&mut self, src: &Tensor<T>) -> Result<()> {
        if self.shape != src.shape {
            return Err(Error::ShapeMismatch {
                op: "copy_from",
                lhs: self.shape,
                rhs: src.shape,
                location: Location::caller(),
            });
        }
        self.data.copy_from_slice(&src.data);
        Ok(())
    }
}
