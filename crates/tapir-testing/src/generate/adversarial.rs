//! Step kinds that aim at the edges of the shape rules (issue "Hardening"): tensors with a
//! zero dimension next to huge ones, where an element count computed without the zero
//! overflows, reductions over an axis list that names one axis twice, and a custom op
//! whose backward misbehaves (issue 31).

use super::Gen;
use crate::codes;
use crate::program::{Misbehave, Step, WindowOp, MAX_CUSTOM_INPUTS};

/// Dimensions to put next to a zero: their product overflows `u32`, `usize` or the
/// addressable element count as soon as the zero is dropped.
const HUGE: [usize; 4] = [1 << 31, u32::MAX as usize, 1 << 20, 3];

impl Gen<'_> {
    /// `full` of a shape like `[0, 2^31, 2^31]` (no element, so it is cheap), then an op on
    /// it that drops, keeps or moves the zero: a reduction over the zero axis, a product
    /// that contracts it, a reshape, a softmax or a window.
    pub(super) fn zero_huge(&mut self) -> Step {
        let rank = self.u.range(2, 4);
        let zero = self.u.below(rank);
        let dims: Vec<usize> = (0..rank).map(|d| if d == zero { 0 } else { HUGE[self.u.below(HUGE.len())] }).collect();
        let v = self.value();
        let x = self.push(Step::Full { dims: dims.clone(), v });
        // The zero axis, spelled from the front or from the back.
        let axis = zero as isize - if self.u.chance(1, 2) { rank as isize } else { 0 };
        let keepdim = self.u.chance(1, 2);
        match self.u.below(9) {
            0 => Step::Reduce { op: self.reduce_op(), x, axes: Some(vec![axis]), keepdim },
            1 => {
                let axes = self.axes_for(rank, true);
                Step::Reduce { op: self.reduce_op(), x, axes: Some(axes), keepdim }
            }
            2 => Step::Reduce { op: self.reduce_op(), x, axes: None, keepdim },
            3 => Step::Var { x, axes: vec![axis], keepdim, correction: self.u.below(2) },
            4 => Step::LogSumExp { x, axis, keepdim },
            5 => Step::Softmax { x, axis: self.axis_for(rank, true), log: self.u.chance(1, 2) },
            6 => {
                // `x @ xᵀ`-shaped: contracting the zero leaves a huge × huge product.
                let mut t = dims;
                t.swap(rank - 2, rank - 1);
                let b = self.push(Step::Full { dims: t, v });
                Step::MatMul { a: x, b }
            }
            7 => {
                let mut d = dims;
                d.rotate_left(1 + self.u.below(rank));
                Step::Reshape { x, dims: d }
            }
            _ => {
                let op = [WindowOp::Im2Col, WindowOp::MaxPool2d, WindowOp::AvgPool2d][self.u.below(3)];
                Step::Window { op, x, kernel: [1, 1], stride: [1, 1], padding: [0, 0] }
            }
        }
    }

    /// `sum_axes`, `mean_axes`, `max_axes`, `min_axes` or `var` over axes that repeat one
    /// axis, written the same way (`[1, 1]`) or once from each end (`[0, -2]` on rank 2).
    pub(super) fn repeated_axes(&mut self) -> Step {
        let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
        let rank = self.shape(x).len() as isize;
        let a = self.axis_for(rank as usize, true);
        let again = match (self.u.chance(1, 2), a < 0) {
            (true, _) => a,
            (false, true) => a + rank,
            (false, false) => a - rank,
        };
        let mut axes = vec![a, again];
        if self.u.chance(1, 3) {
            let other = self.axis_for(rank as usize, true);
            axes.insert(self.u.below(3), other);
        }
        let keepdim = self.u.chance(1, 2);
        if self.u.chance(1, 5) {
            Step::Var { x, axes, keepdim, correction: self.u.below(2) }
        } else {
            Step::Reduce { op: self.reduce_op(), x, axes: Some(axes), keepdim }
        }
    }

    /// The custom op on one to three operands of any shapes (one may repeat), its backward
    /// misbehaving as two bytes say (see [`Misbehave::decode`]); well-behaved in smooth
    /// programs, where it is gradient-checked.
    pub(super) fn custom(&mut self) -> Step {
        let n = self.u.range(1, MAX_CUSTOM_INPUTS);
        let xs: Vec<usize> = (0..n).map(|_| self.pick()).collect();
        let mode = if self.smooth {
            Misbehave::Not
        } else {
            let (kind, index) = (self.u.byte(), self.u.byte());
            Misbehave::decode(kind, index, n)
        };
        Step::Custom { xs, mode }
    }

    fn reduce_op(&mut self) -> crate::program::ReduceOp {
        codes::REDUCE0[usize::from(self.u.byte())]
    }
}
