//! [`Shape`]: the dimensions of a dense, row-major tensor (rank at most [`MAX_RANK`]).
//!
//! A `Shape` is `Copy` and 28 bytes, so tape nodes carry it inline. Its element count is
//! checked when it is made (it fits in `isize::MAX / 8`), so later arithmetic on it can
//! neither overflow nor wrap.

use std::fmt;

/// The largest rank a tensor may have.
pub const MAX_RANK: usize = 6;

/// The largest number of elements a tensor may have: a buffer of `f64` of this length still
/// fits in `isize::MAX` bytes.
const MAX_NUMEL: usize = (isize::MAX as usize) / 8;

/// Dimensions of a row-major tensor. `Display` prints `[2, 3]`; a scalar prints `[]`.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Shape {
    dims: [u32; MAX_RANK],
    rank: u8,
}

/// Why a list of dimensions is not a valid [`Shape`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShapeProblem {
    /// More than [`MAX_RANK`] dimensions.
    Rank(usize),
    /// A dimension above `u32::MAX`, or an element count above `isize::MAX / 8`.
    Overflow,
}

impl Shape {
    /// A shape from a list of dimensions.
    ///
    /// # Errors
    /// [`ShapeProblem`] if the rank exceeds [`MAX_RANK`], a dimension does not fit a `u32`
    /// or the element count overflows. A shape with a zero dimension has no element
    /// whatever the others are, in any order (`[2^32-1, 2^32-1, 2^31, 0]` is valid).
    pub fn new(dims: &[usize]) -> Result<Shape, ShapeProblem> {
        if dims.len() > MAX_RANK {
            return Err(ShapeProblem::Rank(dims.len()));
        }
        let mut out = Shape { dims: [0; MAX_RANK], rank: dims.len() as u8 };
        let mut numel: Option<usize> = Some(1);
        for (slot, &d) in out.dims.iter_mut().zip(dims) {
            *slot = u32::try_from(d).map_err(|_| ShapeProblem::Overflow)?;
            numel = numel.and_then(|n| n.checked_mul(d));
        }
        let empty = dims.contains(&0);
        match numel {
            _ if empty => Ok(out),
            Some(n) if n <= MAX_NUMEL => Ok(out),
            _ => Err(ShapeProblem::Overflow),
        }
    }

    /// The shape of a scalar: rank 0, one element.
    pub const fn scalar() -> Shape {
        Shape { dims: [0; MAX_RANK], rank: 0 }
    }

    /// Number of dimensions.
    #[inline]
    pub fn rank(&self) -> usize {
        usize::from(self.rank)
    }

    /// The dimensions as a slice of `u32`.
    #[inline]
    pub fn dims(&self) -> &[u32] {
        &self.dims[..self.rank()]
    }

    /// Dimension `axis` (which must be below the rank).
    #[inline]
    pub fn dim(&self, axis: usize) -> usize {
        self.dims()[axis] as usize
    }

    /// The dimensions as `usize`s, in a fixed array with the rank beside it.
    pub fn to_vec(&self) -> Vec<usize> {
        self.dims().iter().map(|&d| d as usize).collect()
    }

    /// The dimensions as `usize`s in a fixed array (entries past the rank are 0), for
    /// building new dimension lists without allocating: `&a[..shape.rank()]`.
    pub fn to_array(&self) -> [usize; MAX_RANK] {
        let mut a = [0; MAX_RANK];
        for (slot, &d) in a.iter_mut().zip(self.dims()) {
            *slot = d as usize;
        }
        a
    }

    /// Number of elements (1 for a scalar, 0 if any dimension is 0).
    #[inline]
    pub fn numel(&self) -> usize {
        if self.is_empty() {
            return 0;
        }
        // Saturating: a shape made by `leading` may exceed the limit that `new` checks.
        self.dims().iter().fold(1usize, |n, &d| n.saturating_mul(d as usize))
    }

    /// The first `rank` dimensions as a shape of their own. Not checked against the element
    /// limit: only for broadcasting the batch part of a shape whose other part may be empty.
    pub(crate) fn leading(&self, rank: usize) -> Shape {
        let mut out = *self;
        out.rank = rank.min(self.rank()) as u8;
        let r = out.rank();
        out.dims[r..].fill(0);
        out
    }

    /// Whether some dimension is 0 (then the other dimensions may multiply past `usize`).
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.dims().contains(&0)
    }

    /// Row-major strides in elements.
    pub fn strides(&self) -> [usize; MAX_RANK] {
        let mut s = [0; MAX_RANK];
        let mut acc: usize = 1;
        for i in (0..self.rank()).rev() {
            s[i] = acc;
            // Saturating: the strides of an empty shape are never used to index.
            acc = acc.saturating_mul(self.dims[i] as usize);
        }
        s
    }

    /// This shape with dimension `axis` replaced by `len`, checked like any new shape.
    /// It can fail even for `len = 1`: when the old dimension is 0 the original has no
    /// elements whatever the others are, and the result has their product (`[0, 2³¹, 2³¹]`
    /// with axis 0 set to 1 has 2⁶² elements), so callers must not `expect` it.
    pub(crate) fn with_dim(&self, axis: usize, len: usize) -> Result<Shape, ShapeProblem> {
        let mut dims = self.to_array();
        dims[axis] = len;
        Shape::new(&dims[..self.rank()])
    }

    /// This shape with `axis` removed.
    pub(crate) fn without(&self, axis: usize) -> Shape {
        let mut out = Shape::scalar();
        for (i, &d) in self.dims().iter().enumerate() {
            if i != axis {
                out.dims[out.rank()] = d;
                out.rank += 1;
            }
        }
        out
    }

    /// `(outer, len, inner)`: the sizes before, at and after `axis`, for axis-wise kernels.
    /// For an empty shape `outer` is 0, so that a kernel's loops (outer first) do no work,
    /// however large the other dimensions are.
    pub(crate) fn split_at_axis(&self, axis: usize) -> (usize, usize, usize) {
        if self.is_empty() {
            return (0, self.dim(axis), 0);
        }
        let outer = self.dims()[..axis].iter().map(|&d| d as usize).product();
        let inner = self.dims()[axis + 1..].iter().map(|&d| d as usize).product();
        (outer, self.dim(axis), inner)
    }

    /// The NumPy broadcast of two shapes, or `None` if some aligned pair of dimensions
    /// differs with neither equal to 1.
    pub fn broadcast(&self, other: &Shape) -> Option<Shape> {
        // Every output dimension is one of the inputs' dimensions and the output has at
        // most as many elements as the larger input times the smaller's broadcast factor;
        // re-check rather than argue.
        let out = self.broadcast_dims(other)?;
        Shape::new(&out.to_array()[..out.rank()]).ok()
    }

    /// [`broadcast`](Shape::broadcast) without the element limit: for the batch parts of
    /// a product, which are broadcast but never allocated on their own.
    pub(crate) fn broadcast_dims(&self, other: &Shape) -> Option<Shape> {
        let rank = self.rank().max(other.rank());
        let mut out = Shape { dims: [0; MAX_RANK], rank: rank as u8 };
        for i in 0..rank {
            let a = self.dim_from_right(rank - 1 - i);
            let b = other.dim_from_right(rank - 1 - i);
            out.dims[i] = match (a, b) {
                (x, y) if x == y => x,
                (1, y) => y,
                (x, 1) => x,
                _ => return None,
            };
        }
        Some(out)
    }

    /// Dimension counted from the right (0 is the last), with 1 past the rank.
    fn dim_from_right(&self, k: usize) -> u32 {
        if k < self.rank() {
            self.dims[self.rank() - 1 - k]
        } else {
            1
        }
    }

    /// Strides of `self` viewed as broadcast to `target` (0 along broadcast dimensions),
    /// aligned to `target`'s rank. `self` must broadcast to `target`.
    pub(crate) fn broadcast_strides(&self, target: &Shape) -> [usize; MAX_RANK] {
        let own = self.strides();
        let mut out = [0; MAX_RANK];
        let offset = target.rank() - self.rank();
        for i in 0..self.rank() {
            if self.dims[i] == target.dims[i + offset] && self.dims[i] != 1 {
                out[i + offset] = own[i];
            }
        }
        out
    }
}

/// `axis` in `-rank..rank`, made non-negative (`-1` is the last axis), or `None` outside.
pub(crate) fn resolve_axis(rank: usize, axis: isize) -> Option<usize> {
    let r = rank as isize;
    let a = if axis < 0 { axis + r } else { axis };
    (0..r).contains(&a).then_some(a as usize)
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, d) in self.dims().iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn broadcast_follows_numpy() {
        let a = Shape::new(&[4, 1, 3]).unwrap();
        let b = Shape::new(&[5, 1]).unwrap();
        assert_eq!(a.broadcast(&b).unwrap().to_vec(), vec![4, 5, 3]);
        let c = Shape::new(&[2]).unwrap();
        assert!(a.broadcast(&c).is_none());
        assert_eq!(Shape::scalar().broadcast(&a), Some(a));
    }

    #[test]
    fn overflow_and_rank_are_errors() {
        assert_eq!(Shape::new(&[1usize << 32]), Err(ShapeProblem::Overflow));
        assert_eq!(Shape::new(&[1 << 31, 1 << 31, 4]), Err(ShapeProblem::Overflow));
        assert_eq!(Shape::new(&[1; 7]), Err(ShapeProblem::Rank(7)));
        assert_eq!(Shape::new(&[2, 0, 3]).unwrap().numel(), 0);
    }

    #[test]
    fn broadcast_strides_zero_on_expanded_axes() {
        let a = Shape::new(&[3, 1]).unwrap();
        let t = Shape::new(&[2, 3, 4]).unwrap();
        assert_eq!(&a.broadcast_strides(&t)[..3], &[0, 1, 0]);
        assert_eq!(format!("{t}"), "[2, 3, 4]");
    }
}
