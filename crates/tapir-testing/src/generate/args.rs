//! The arguments of the window, convolution, matmul, linear, layer-norm and attention
//! steps: operands that fit each other when the step is valid, any nodes when not.

use super::Gen;
use crate::model;
use crate::program::{Step, WindowOp};

impl Gen<'_> {
    /// A 4-D operand `[N, C, H, W]` (made as a constant if none exists or now and then).
    fn image(&mut self) -> usize {
        match self.pick_where(|s| s.len() == 4 && s[2] > 0 && s[3] > 0) {
            Some(x) if self.u.chance(1, 2) => x,
            _ => {
                let dims = vec![self.u.range(1, 2), self.u.range(1, 3), self.u.range(1, 5), self.u.range(1, 5)];
                self.constant(dims)
            }
        }
    }

    /// Kernel, stride and padding: fitting `[h, w]` if `valid`, else small and often
    /// wrong, now and then huge.
    fn window_args(&mut self, hw: [usize; 2], valid: bool, pool: bool) -> [[usize; 2]; 3] {
        if !valid {
            let mut arg = || if self.u.chance(1, 8) { (1 << 31) + self.u.below(2) } else { self.u.below(4) };
            return [[arg(), arg()], [arg(), arg()], [arg(), arg()]];
        }
        let mut out = [[1; 2]; 3];
        for d in 0..2 {
            let k = self.u.range(1, hw[d].clamp(1, 3));
            let p = self.u.below(if pool { k / 2 + 1 } else { 2 });
            out[0][d] = k;
            out[1][d] = self.u.range(1, 2);
            out[2][d] = p;
        }
        out
    }

    pub(super) fn window(&mut self, op: WindowOp) -> Step {
        let valid = self.valid();
        let x = if valid || self.u.chance(1, 2) { self.image() } else { self.pick() };
        let sx = self.shape(x).to_vec();
        let hw = if sx.len() == 4 { [sx[2], sx[3]] } else { [1, 1] };
        let [kernel, stride, padding] = self.window_args(hw, valid, op != WindowOp::Im2Col);
        Step::Window { op, x, kernel, stride, padding }
    }

    pub(super) fn conv2d(&mut self) -> Step {
        let valid = self.valid();
        let x = if valid { self.image() } else { self.pick() };
        let sx = self.shape(x).to_vec();
        let hw = if sx.len() == 4 { [sx[2], sx[3]] } else { [1, 1] };
        let [kernel, stride, padding] = self.window_args(hw, valid, false);
        let w = if valid && sx.len() == 4 {
            let dims = vec![self.u.range(1, 3), sx[1], kernel[0], kernel[1]];
            self.constant(dims)
        } else {
            self.pick()
        };
        Step::Conv2d { x, w, stride, padding }
    }

    pub(super) fn matmul(&mut self) -> Step {
        let a = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
        let sa = self.shape(a).to_vec();
        if sa.len() < 2 || !self.valid() {
            return Step::MatMul { a, b: self.pick() };
        }
        let (batch, k) = (&sa[..sa.len() - 2], sa[sa.len() - 1]);
        let fits =
            |s: &[usize]| s.len() >= 2 && s[s.len() - 2] == k && model::broadcast(&s[..s.len() - 2], batch).is_some();
        let b = match self.pick_where(fits) {
            Some(b) if self.u.chance(1, 2) => b,
            _ => {
                let mut dims = self.broadcastable(batch);
                dims.extend([k, self.u.range(1, 4)]);
                self.constant(dims)
            }
        };
        Step::MatMul { a, b }
    }

    /// `x.linear(w, b)`: valid, `w: [k, n]` and `b: [n]` fit `x`'s last dimension `k`
    /// (existing nodes when some fit, else new constants); invalid, any three nodes.
    pub(super) fn linear(&mut self) -> Step {
        let x = self.pick_where(|s| s.len() >= 2).unwrap_or_else(|| self.pick());
        let sx = self.shape(x).to_vec();
        if sx.len() < 2 || !self.valid() {
            return Step::Linear { x, w: self.pick(), b: self.pick() };
        }
        let k = sx[sx.len() - 1];
        let w = match self.pick_where(|s| s.len() == 2 && s[0] == k) {
            Some(w) if self.u.chance(1, 2) => w,
            _ => {
                let n = self.u.range(1, 4);
                self.constant(vec![k, n])
            }
        };
        // A constant too large to draw comes back as a scalar: an invalid step then.
        let n = match *self.shape(w) {
            [_, n] => n,
            _ => return Step::Linear { x, w, b: self.pick() },
        };
        let b = match self.pick_where(|s| s == [n]) {
            Some(b) if self.u.chance(1, 2) => b,
            _ => self.constant(vec![n]),
        };
        Step::Linear { x, w, b }
    }

    /// `x.layer_norm(w, b, eps)`: valid, `w` and `b` are `[C]` for `x`'s last dimension
    /// `C` (existing nodes when some fit, else new constants) and `eps` is `0.5` in smooth
    /// programs (a row of nearly equal values then stays well conditioned for finite
    /// differences), else `1e-5` or `0`; invalid, any three nodes or a bad `eps`.
    pub(super) fn layer_norm(&mut self) -> Step {
        let x = self.pick_where(|s| !s.is_empty()).unwrap_or_else(|| self.pick());
        let sx = self.shape(x).to_vec();
        let eps = if self.smooth { 0.5 } else { [1e-5, 0.0, 0.5][self.u.below(3)] };
        let Some(&c) = sx.last() else {
            return Step::LayerNorm { x, w: self.pick(), b: self.pick(), eps };
        };
        if !self.valid() {
            let eps = if self.u.chance(1, 2) { [-1.0, f64::NAN, f64::INFINITY][self.u.below(3)] } else { eps };
            return Step::LayerNorm { x, w: self.pick(), b: self.pick(), eps };
        }
        let mut row = || match self.pick_where(|s| s == [c]) {
            Some(v) if self.u.chance(1, 2) => v,
            _ => self.constant(vec![c]),
        };
        let (w, b) = (row(), row());
        Step::LayerNorm { x, w, b, eps }
    }

    /// A packed attention input `[B, T, 3·H·D]` for `heads = H`: an existing node of that
    /// shape when there is one, else a new constant (`B` 1–2, `T` 1–4, `D` 1–2).
    fn qkv_for(&mut self, heads: usize) -> usize {
        let fits = move |s: &[usize]| matches!(*s, [_, _, c3] if c3 > 0 && c3 % (3 * heads) == 0);
        match self.pick_where(fits) {
            Some(x) if self.u.chance(1, 2) => x,
            _ => {
                let (b, t, d) = (self.u.range(1, 2), self.u.range(1, 4), self.u.range(1, 2));
                self.constant(vec![b, t, 3 * heads * d])
            }
        }
    }

    /// `qkv.attention_weights(heads, causal)`: valid, `heads` 1–2 and `qkv` from
    /// [`qkv_for`](Self::qkv_for); invalid, any node and `heads` from 0 to 3 (0, or a
    /// width it does not divide, is the recorded error).
    pub(super) fn attention_weights(&mut self) -> Step {
        let causal = self.u.chance(1, 2);
        if !self.valid() {
            return Step::AttentionWeights { qkv: self.pick(), heads: self.u.below(4), causal };
        }
        let heads = self.u.range(1, 2);
        Step::AttentionWeights { qkv: self.qkv_for(heads), heads, causal }
    }

    /// `p.attend(qkv)`: valid, `p: [B, H, T, T]` (an existing node when one fits `qkv`,
    /// else a constant) for a `qkv` from [`qkv_for`](Self::qkv_for); invalid, any two nodes.
    pub(super) fn attend(&mut self) -> Step {
        if !self.valid() {
            return Step::Attend { p: self.pick(), qkv: self.pick() };
        }
        let heads = self.u.range(1, 2);
        let qkv = self.qkv_for(heads);
        // After a step that errs, every shape reads `[]` (the program is poisoned).
        let [b, t, _] = *self.shape(qkv) else {
            return Step::Attend { p: self.pick(), qkv };
        };
        let p = match self.pick_where(|s| s == [b, heads, t, t]) {
            Some(p) if self.u.chance(1, 2) => p,
            _ => self.constant(vec![b, heads, t, t]),
        };
        Step::Attend { p, qkv }
    }
}
