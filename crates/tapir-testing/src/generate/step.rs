//! `Gen::step`: one step of any kind, with arguments that respect the shapes or, now and
//! then, do not.

use super::Gen;
use crate::codes::{self, Code, Format};
use crate::model;
use crate::program::Step;

impl Gen<'_> {
    /// Generates one step (and any constants it needs).
    pub(super) fn step(&mut self) {
        let (code, byte) = self.code();
        let step = match code {
            Code::Nop => Step::Nop { code: byte },
            Code::Binary(op) => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Binary { op, a, b }
            }
            Code::Compare(op) => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Compare { op, a, b }
            }
            Code::Scalar(op) => Step::Scalar { op, x: self.pick(), c: self.scalar() },
            Code::Clamp => {
                let (x, mut lo, mut hi) = (self.pick(), self.value(), self.value());
                if self.valid() && lo > hi {
                    std::mem::swap(&mut lo, &mut hi);
                }
                Step::Clamp { x, lo, hi }
            }
            Code::Unary(op) => Step::Unary { op, x: self.pick() },
            Code::MatMul => self.matmul(),
            Code::Linear => self.linear(),
            Code::LayerNorm => self.layer_norm(),
            Code::AttentionWeights => self.attention_weights(),
            Code::Attend => self.attend(),
            Code::Reshape => {
                let x = self.pick();
                let dims = if self.valid() {
                    let mut d = self.shape(x).to_vec();
                    for i in (1..d.len()).rev() {
                        d.swap(i, self.u.below(i + 1));
                    }
                    if d.len() < 6 && self.u.chance(1, 3) {
                        d.insert(self.u.below(d.len() + 1), 1);
                    }
                    if self.u.chance(1, 4) {
                        d = vec![model::numel(&d)];
                    }
                    d
                } else {
                    self.bad_dims()
                };
                Step::Reshape { x, dims }
            }
            Code::Permute => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let mut axes: Vec<usize> = (0..rank).collect();
                if self.valid() {
                    for i in (1..rank).rev() {
                        axes.swap(i, self.u.below(i + 1));
                    }
                } else {
                    axes =
                        (0..self.u.range(rank.saturating_sub(1), rank + 1)).map(|_| self.u.below(rank + 2)).collect();
                }
                Step::Permute { x, axes }
            }
            Code::Transpose => {
                let x = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                let (a0, a1) = if self.u.chance(1, 3) {
                    (-2, -1)
                } else {
                    (self.axis_for(rank, valid), self.axis_for(rank, valid))
                };
                Step::Transpose { x, a0, a1 }
            }
            Code::BroadcastTo => {
                let x = self.pick();
                let dims = if self.valid() {
                    let mut d = self.shape(x).to_vec();
                    for v in d.iter_mut().filter(|v| **v == 1) {
                        *v = self.u.range(1, 3);
                    }
                    for _ in 0..self.u.below(3) {
                        if d.len() < 6 {
                            d.insert(0, self.u.range(1, 3));
                        }
                    }
                    d
                } else {
                    self.bad_dims()
                };
                Step::BroadcastTo { x, dims }
            }
            Code::Squeeze => {
                let x = self.pick_where(|s| s.contains(&1)).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let ones: Vec<usize> = (0..shape.len()).filter(|&a| shape[a] == 1).collect();
                let axis = if self.valid() && !ones.is_empty() {
                    ones[self.u.below(ones.len())] as isize
                } else {
                    self.u.axis(shape.len())
                };
                Step::Squeeze { x, axis }
            }
            Code::Unsqueeze => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::Unsqueeze { x, axis: self.axis_for(rank + 1, valid) }
            }
            Code::Narrow => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let (start, len) = if valid {
                    let start = self.u.range(0, dim);
                    (start, self.u.range(0, dim - start))
                } else if self.u.chance(1, 4) {
                    (self.u.below(3), usize::MAX)
                } else {
                    (self.u.range(0, dim + 2), self.u.range(0, dim + 2))
                };
                Step::Narrow { x, axis, start, len }
            }
            Code::Concat | Code::Stack => {
                let x = self.pick_where(|s| !s.is_empty() || code == Code::Stack).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let stack = code == Code::Stack;
                let axis = self.axis_for(shape.len() + usize::from(stack), valid);
                let mut xs = vec![x];
                for _ in 0..self.u.below(3) {
                    let other = if !valid {
                        self.pick()
                    } else if stack {
                        self.pick_where(|s| s == shape).unwrap_or(x)
                    } else {
                        let ax = model::resolve(shape.len(), axis);
                        let agree = |s: &[usize]| {
                            s.len() == shape.len() && (0..s.len()).all(|d| Some(d) == ax || s[d] == shape[d])
                        };
                        self.pick_where(agree).unwrap_or(x)
                    };
                    xs.push(other);
                }
                if !valid && self.u.chance(1, 4) {
                    xs.clear();
                }
                if stack {
                    Step::Stack { xs, axis }
                } else {
                    Step::Concat { xs, axis }
                }
            }
            Code::IndexSelect => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let n = self.u.below(5);
                let indices = if valid {
                    (0..if dim == 0 { 0 } else { n }).map(|_| self.u.below(dim)).collect()
                } else if self.u.chance(1, 4) {
                    vec![(1 << 32) + self.u.below(2)]
                } else {
                    (0..n).map(|_| self.u.below(dim + 3)).collect()
                };
                Step::IndexSelect { x, axis, indices }
            }
            Code::PadAxis => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axis = self.axis_for(rank, valid);
                Step::PadAxis { x, axis, before: self.u.below(3), after: self.u.below(3) }
            }
            Code::ScatterAdd => {
                let x = self.pick();
                let shape = self.shape(x).to_vec();
                let valid = self.valid();
                let axis = self.axis_for(shape.len(), valid);
                let dim = model::resolve(shape.len(), axis).map_or(2, |a| shape[a]);
                let len = 1 + self.u.below(4);
                // As for the labels below: a huge operand (`[2^32 - 1, 3]` after a zero-size
                // reduction) must not make the generator allocate an index per row.
                let indices = if dim > 1 << 16 {
                    (0..self.u.below(4)).map(|_| self.u.below(len)).collect()
                } else if valid {
                    (0..dim).map(|_| self.u.below(len)).collect()
                } else if self.u.chance(1, 2) {
                    (0..dim + 1).map(|_| self.u.below(len)).collect()
                } else {
                    (0..dim).map(|_| self.u.below(len + 3)).collect()
                };
                Step::ScatterAdd { x, axis, indices, len }
            }
            Code::Where => {
                let a = self.pick();
                let cond = self.partner(a);
                let b = self.partner(a);
                Step::Where { cond, a, b }
            }
            Code::Reduce(op) => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axes = (!self.u.chance(1, 3)).then(|| self.axes_for(rank, valid));
                Step::Reduce { op, x, axes, keepdim: self.u.chance(1, 2) }
            }
            Code::Var => {
                let x = self.pick();
                let rank = self.shape(x).len();
                let valid = self.valid();
                let axes = self.axes_for(rank, valid);
                let correction = self.u.below(2);
                Step::Var { x, axes, keepdim: self.u.chance(1, 2), correction }
            }
            Code::LogSumExp => {
                let x = self.pick_where(|s| !s.is_empty() && !s.contains(&0)).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::LogSumExp { x, axis: self.axis_for(rank, valid), keepdim: self.u.chance(1, 2) }
            }
            Code::Softmax => {
                let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
                let rank = self.shape(x).len();
                let valid = self.valid();
                Step::Softmax { x, axis: self.axis_for(rank, valid), log: self.u.chance(1, 2) }
            }
            Code::CrossEntropy | Code::Nll => {
                let valid = self.valid();
                let x = match self.pick_where(|s| s.len() == 2 && s[1] > 0) {
                    Some(x) if self.u.chance(3, 4) || !valid => x,
                    _ => {
                        let dims = vec![self.u.range(1, 3), self.u.range(1, 4)];
                        self.constant(dims)
                    }
                };
                let shape = self.shape(x).to_vec();
                // A huge valid operand (a zero-size reduction can leave `[2^32 - 1, 3]`,
                // which the arena limit then stops) must not make the generator allocate
                // a label per row.
                let labels = if valid && shape.len() == 2 && shape[0] <= 1 << 16 {
                    (0..shape[0]).map(|_| self.u.below(shape[1])).collect()
                } else {
                    (0..self.u.below(4)).map(|_| self.u.below(5)).collect()
                };
                if code == Code::CrossEntropy {
                    Step::CrossEntropy { x, labels }
                } else {
                    Step::Nll { x, labels }
                }
            }
            Code::Bce => {
                let x = self.pick();
                let shape = self.shape(x).to_vec();
                let y = if !self.valid() {
                    self.pick()
                } else {
                    match self.pick_where(|s| s == shape) {
                        Some(y) if self.u.chance(1, 2) => y,
                        _ => self.constant(shape),
                    }
                };
                Step::Bce { x, y }
            }
            Code::Mse => {
                let a = self.pick();
                let b = self.partner(a);
                Step::Mse { a, b }
            }
            Code::Detach => Step::Detach { x: self.pick() },
            Code::WithGrad => Step::WithGrad { x: self.pick() },
            Code::NoGrad => {
                // A unary, scalar or binary op under no_grad.
                let x = self.pick();
                match self.no_grad_inner(x) {
                    Ok(inner) => Step::NoGrad(Box::new(inner)),
                    Err(code) => Step::Nop { code },
                }
            }
            Code::Const => {
                let dims = if self.valid() { self.small_dims() } else { self.bad_dims() };
                let mut n: usize = if model::valid_dims(&dims) { model::numel(&dims) } else { 2 };
                if !self.valid() {
                    n = (n + 1).saturating_sub(self.u.below(3));
                }
                let data = self.data(n);
                Step::Const { dims, data }
            }
            Code::Full => {
                let dims = if self.valid() { self.small_dims() } else { self.bad_dims() };
                Step::Full { dims, v: self.value() }
            }
            Code::Conv2d => self.conv2d(),
            Code::Window(op) => self.window(op),
            Code::ZeroHuge => self.zero_huge(),
            Code::RepeatedAxes => self.repeated_axes(),
            Code::Custom => self.custom(),
        };
        self.nops += usize::from(matches!(step, Step::Nop { .. }));
        self.push(step);
    }

    /// The op under `no_grad` on `x`: unary, scalar or binary; in format 1 the code byte
    /// of any other op, which makes the step a `Nop`.
    fn no_grad_inner(&mut self, x: usize) -> Result<Step, u8> {
        if self.format == Format::V1 {
            let b = self.u.byte();
            return match codes::FORMAT1[usize::from(b)] {
                Code::Unary(op) => Ok(Step::Unary { op, x }),
                Code::Scalar(op) => Ok(Step::Scalar { op, x, c: self.value() }),
                Code::Binary(op) => {
                    let b = self.partner(x);
                    Ok(Step::Binary { op, a: x, b })
                }
                _ => Err(b),
            };
        }
        Ok(match self.u.below(3) {
            0 => Step::Unary { op: codes::UNARY0[usize::from(self.u.byte())], x },
            1 => Step::Scalar { op: codes::SCALAR0[usize::from(self.u.byte())], x, c: self.value() },
            _ => {
                let b = self.partner(x);
                Step::Binary { op: codes::BINARY0[usize::from(self.u.byte())], a: x, b }
            }
        })
    }
}
