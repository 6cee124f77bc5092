//! [`Tensor`]: an owned, contiguous, row-major tensor of `f32` or `f64`, for parameters,
//! inputs and inference. Its eager ops use the same kernels as the graph's ops.

use std::panic::Location;

use rand::{Rng, RngExt};
use rand_distr::{Distribution, StandardNormal};

use crate::error::{Error, Result};
use crate::kernels;
use crate::kernels::matmul::MatMulDims;
use crate::shape::Shape;
use crate::Float;

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
    pub(crate) fn from_parts(data: Vec<T>, shape: Shape) -> Tensor<T> {
        debug_assert_eq!(data.len(), shape.numel());
        Tensor { data, shape }
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
        Ok(Tensor { data: data.to_vec(), shape })
    }

    /// A tensor filled with `v`.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] for a rank above 6 or an overflowing element count.
    #[track_caller]
    pub fn full(dims: &[usize], v: T) -> Result<Tensor<T>> {
        let shape = shape_for("full", dims)?;
        Ok(Tensor { data: vec![v; shape.numel()], shape })
    }

    /// Zeros. See [`Tensor::full`].
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn zeros(dims: &[usize]) -> Result<Tensor<T>> {
        Self::full(dims, T::ZERO)
    }

    /// Ones. See [`Tensor::full`].
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn ones(dims: &[usize]) -> Result<Tensor<T>> {
        Self::full(dims, T::ONE)
    }

    /// A scalar (shape `[]`).
    pub fn scalar(v: T) -> Tensor<T> {
        Tensor { data: vec![v], shape: Shape::scalar() }
    }

    /// `[start, start + step, ...]` below `end` (1-D).
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `step` is zero or not finite, or the bounds are not finite.
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
        let n = ((e - s) / st).ceil().max(0.0) as usize;
        let shape = shape_for("arange", &[n])?;
        Ok(Tensor { data: (0..n).map(|i| T::from_f64(s + st * i as f64)).collect(), shape })
    }

    /// The `n×n` identity matrix.
    ///
    /// # Errors
    /// [`Error::InvalidShape`] if `n²` overflows.
    #[track_caller]
    pub fn eye(n: usize) -> Result<Tensor<T>> {
        let mut t = Self::zeros(&[n, n])?;
        for i in 0..n {
            t.data[i * n + i] = T::ONE;
        }
        Ok(t)
    }

    /// Samples from `N(mean, std²)` with `rng` (seed it for reproducible runs).
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn normal<R: Rng + ?Sized>(dims: &[usize], mean: T, std: T, rng: &mut R) -> Result<Tensor<T>> {
        let mut t = Self::zeros(dims)?;
        fill_normal(&mut t.data, rng);
        for v in &mut t.data {
            *v = mean + std * *v;
        }
        Ok(t)
    }

    /// Samples uniformly from `[lo, hi)` with `rng`.
    ///
    /// # Errors
    /// As [`Tensor::full`].
    #[track_caller]
    pub fn uniform<R: Rng + ?Sized>(dims: &[usize], lo: T, hi: T, rng: &mut R) -> Result<Tensor<T>> {
        let mut t = Self::zeros(dims)?;
        let (l, h) = (lo.to_f64(), hi.to_f64());
        for v in &mut t.data {
            let u: f64 = rng.random();
            *v = T::from_f64(l + (h - l) * u);
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
    pub fn from_mat(m: faer::MatRef<'_, T>) -> Tensor<T> {
        let (r, c) = (m.nrows(), m.ncols());
        let data = (0..r).flat_map(|i| (0..c).map(move |j| m[(i, j)])).collect();
        let shape = Shape::new(&[r, c]).expect("an existing faer matrix has a valid element count");
        Tensor { data, shape }
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
        let mut out = vec![T::ZERO; so.numel()];
        kernels::binary((&self.data, &self.shape), (&other.data, &other.shape), (&mut out, &so), f);
        Ok(Tensor { data: out, shape: so })
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
    pub fn map(&self, f: impl Fn(T) -> T) -> Tensor<T> {
        let mut out = vec![T::ZERO; self.data.len()];
        kernels::map(&self.data, &mut out, f);
        Tensor { data: out, shape: self.shape }
    }

    /// `max(x, 0)` elementwise.
    pub fn relu(&self) -> Tensor<T> {
        self.map(crate::kernels::scalar::relu)
    }

    /// `eˣ` elementwise.
    pub fn exp(&self) -> Tensor<T> {
        self.map(T::exp)
    }

    /// Natural logarithm elementwise.
    pub fn log(&self) -> Tensor<T> {
        self.map(T::ln)
    }

    /// Square root elementwise.
    pub fn sqrt(&self) -> Tensor<T> {
        self.map(T::sqrt)
    }

    /// `tanh x` elementwise.
    pub fn tanh(&self) -> Tensor<T> {
        self.map(T::tanh)
    }

    /// Logistic sigmoid elementwise, the same stable formula as [`Var::sigmoid`](crate::Var::sigmoid).
    pub fn sigmoid(&self) -> Tensor<T> {
        self.map(crate::kernels::scalar::sigmoid)
    }

    /// `ln(1 + eˣ)` elementwise, as [`Var::softplus`](crate::Var::softplus).
    pub fn softplus(&self) -> Tensor<T> {
        self.map(crate::kernels::scalar::softplus)
    }

    /// GELU with the exact normal CDF, as [`Var::gelu`](crate::Var::gelu).
    pub fn gelu(&self) -> Tensor<T> {
        self.map(crate::kernels::scalar::gelu_erf)
    }

    /// GELU with the tanh approximation, as [`Var::gelu_tanh`](crate::Var::gelu_tanh).
    pub fn gelu_tanh(&self) -> Tensor<T> {
        self.map(crate::kernels::scalar::gelu_tanh)
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
    /// [`Error::BadAxis`] if `axis` is out of range.
    #[track_caller]
    pub fn sum_axis(&self, axis: isize) -> Result<Tensor<T>> {
        let ax = self.axis("sum_axis", axis)?;
        let shape = self.shape.with_dim(ax, 1).expect("a smaller dimension cannot overflow");
        let mut out = vec![T::ZERO; shape.numel()];
        kernels::sum_axis(&self.data, self.shape.split_at_axis(ax), &mut out);
        Ok(Tensor { data: out, shape })
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
        let mut out = vec![T::ZERO; self.data.len()];
        kernels::softmax_axis(&self.data, self.shape.split_at_axis(ax), &mut out, log);
        Ok(Tensor { data: out, shape: self.shape })
    }

    /// Sum of all elements.
    pub fn sum(&self) -> T {
        kernels::sum(&self.data)
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
        Ok(self
            .data
            .chunks(c)
            .map(|row| row.iter().enumerate().fold(0, |best, (j, &v)| if v > row[best] { j } else { best }))
            .collect())
    }

    /// Matrix product (batched, broadcast batch dimensions), through faer on `threads`
    /// threads (1: sequential; 0: all).
    ///
    /// # Errors
    /// [`Error::MatMulShape`] as for [`Var::matmul`](crate::Var::matmul).
    #[track_caller]
    pub fn matmul(&self, other: &Tensor<T>, threads: usize) -> Result<Tensor<T>> {
        let (dims, so) = MatMulDims::new(&self.shape, &other.shape)
            .map_err(|p| MatMulDims::error("matmul", self.shape, other.shape, p, Location::caller()))?;
        let par = if threads == 1 { faer::Par::Seq } else { faer::Par::rayon(threads) };
        let mut out = vec![T::ZERO; so.numel()];
        kernels::matmul::forward(&dims, &self.data, &other.data, &mut out, par);
        Ok(Tensor { data: out, shape: so })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constructors_check_lengths() {
        let e = Tensor::<f32>::from_vec(vec![1.0; 5], &[2, 3]).unwrap_err();
        assert!(matches!(e, Error::DataLength { len: 5, .. }));
        let msg = e.to_string();
        assert!(msg.contains("from_vec") && msg.contains("[2, 3]") && msg.contains("tensor.rs"), "{msg}");
        assert!(Tensor::<f32>::zeros(&[1 << 40, 1 << 40]).is_err());
        assert_eq!(Tensor::<f64>::arange(0.0, 1.0, 0.25).unwrap().data(), &[0.0, 0.25, 0.5, 0.75]);
        assert_eq!(Tensor::<f64>::eye(2).unwrap().data(), &[1.0, 0.0, 0.0, 1.0]);
    }

    #[test]
    fn eager_ops_agree_with_the_graph() {
        // The same kernels and scalar functions: results must be bitwise equal.
        let x = Tensor::<f64>::from_vec(vec![-1.5, -0.2, 0.0, 0.7, 2.5, 4.0], &[2, 3]).unwrap();
        let mut g = crate::Graph::<f64>::new();
        g.scope(|s| {
            let v = s.input(&x);
            let pairs = [
                (v.sigmoid(), x.sigmoid()),
                (v.softplus(), x.softplus()),
                (v.gelu(), x.gelu()),
                (v.gelu_tanh(), x.gelu_tanh()),
                (v.exp(), x.exp()),
                (v.relu(), x.relu()),
                (v.log_softmax(1), x.log_softmax(1).unwrap()),
                (v.softmax(0), x.softmax(0).unwrap()),
                (v.sum_axes(&[-1], true), x.sum_axis(-1).unwrap()),
            ];
            for (graph, eager) in pairs {
                assert_eq!(graph.to_tensor().unwrap(), eager);
            }
        });
        let e = x.sum_axis(2).unwrap_err();
        assert!(matches!(e, Error::BadAxis { op: "sum_axis", .. }), "{e}");
    }

    #[test]
    fn faer_round_trip_and_eager_matmul() {
        let a = Tensor::<f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
        let m = a.to_mat().unwrap();
        assert_eq!(m[(1, 2)], 6.0);
        assert_eq!(Tensor::from_mat(m.as_ref()), a);
        // [[1,2,3],[4,5,6]] · [[1],[1],[1]] = [[6],[15]]
        let ones = Tensor::<f64>::ones(&[3, 1]).unwrap();
        assert_eq!(a.matmul(&ones, 1).unwrap().data(), &[6.0, 15.0]);
    }
}
