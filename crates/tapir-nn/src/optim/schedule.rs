//! Learning-rate schedules: the learning rate as a function of the step number (from 0).
//! Apply one with `opt.set_lr(schedule.lr(step))` before each step.

use std::f64::consts::PI;

/// A learning rate per step.
pub trait Schedule {
    /// The learning rate at `step` (0 for the first).
    fn lr(&self, step: usize) -> f64;
}

/// The same rate at every step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Constant(pub f64);

impl Schedule for Constant {
    fn lr(&self, _step: usize) -> f64 {
        self.0
    }
}

/// `base · γ^⌊step/every⌋` (PyTorch's `StepLR`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StepDecay {
    /// Rate for the first `every` steps.
    pub base: f64,
    /// Steps between decays (0 is taken as 1).
    pub every: usize,
    /// Factor applied at each decay.
    pub gamma: f64,
}

impl Schedule for StepDecay {
    fn lr(&self, step: usize) -> f64 {
        let k = step / self.every.max(1);
        self.base * self.gamma.powi(k.min(i32::MAX as usize) as i32)
    }
}

/// Linear warm-up from `base/warmup` to `base` over `warmup` steps, then a half cosine
/// from `base` down to `min` at step `total`, and `min` after that:
/// `lr = min + (base − min)·(1 + cos(π·(step − warmup)/(total − warmup)))/2`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CosineWarmup {
    /// Peak rate, reached at the end of the warm-up.
    pub base: f64,
    /// Final rate.
    pub min: f64,
    /// Warm-up steps (0 for none).
    pub warmup: usize,
    /// Total steps.
    pub total: usize,
}

impl Schedule for CosineWarmup {
    fn lr(&self, step: usize) -> f64 {
        if step < self.warmup {
            return self.base * (step + 1) as f64 / self.warmup as f64;
        }
        let span = self.total.saturating_sub(self.warmup).max(1);
        let done = ((step - self.warmup) as f64 / span as f64).min(1.0);
        self.min + (self.base - self.min) * 0.5 * (1.0 + (PI * done).cos())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedules_by_hand() {
        let s = StepDecay { base: 1.0, every: 10, gamma: 0.5 };
        assert_eq!([s.lr(0), s.lr(9), s.lr(10), s.lr(25)], [1.0, 1.0, 0.5, 0.25]);
        let c = CosineWarmup { base: 1.0, min: 0.0, warmup: 4, total: 14 };
        assert_eq!([c.lr(0), c.lr(1), c.lr(3)], [0.25, 0.5, 1.0]);
        assert_eq!(c.lr(4), 1.0);
        assert!((c.lr(9) - 0.5).abs() < 1e-12);
        assert!(c.lr(14).abs() < 1e-12 && c.lr(100).abs() < 1e-12);
        assert_eq!(Constant(0.3).lr(7), 0.3);
    }
}
