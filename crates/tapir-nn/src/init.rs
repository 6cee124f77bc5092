//! Seeded weight initialisers.
//!
//! With `fan_in` inputs and `fan_out` outputs per unit (for a convolution, both are
//! multiplied by the kernel area):
//!
//! | initialiser       | distribution                    | scale                                   |
//! |-------------------|---------------------------------|-----------------------------------------|
//! | `KaimingUniform`  | `U(−b, b)`                      | `b = gain·√(3/fan_in)`                  |
//! | `KaimingNormal`   | `N(0, σ²)`                      | `σ = gain/√fan_in`                      |
//! | `XavierUniform`   | `U(−b, b)`                      | `b = gain·√(6/(fan_in + fan_out))`      |
//! | `XavierNormal`    | `N(0, σ²)`                      | `σ = gain·√(2/(fan_in + fan_out))`      |
//!
//! `gain` is `√2` for ReLU (He et al., 2015) and 1 for linear or tanh layers (Glorot and
//! Bengio, 2010), as in `torch.nn.init`. The same seed gives the same tensor.

use rand::Rng;
use tapir::{Float, Tensor};

/// How to draw a layer's initial weights.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Init {
    /// He uniform: `U(−b, b)`, `b = gain·√(3/fan_in)`.
    KaimingUniform {
        /// `√2` for ReLU, 1 for linear.
        gain: f64,
    },
    /// He normal: `N(0, (gain/√fan_in)²)`.
    KaimingNormal {
        /// `√2` for ReLU, 1 for linear.
        gain: f64,
    },
    /// Glorot uniform: `U(−b, b)`, `b = gain·√(6/(fan_in + fan_out))`.
    XavierUniform {
        /// 1 for linear or tanh layers.
        gain: f64,
    },
    /// Glorot normal: `N(0, gain²·2/(fan_in + fan_out))`.
    XavierNormal {
        /// 1 for linear or tanh layers.
        gain: f64,
    },
    /// Every element equal to the value (biases, LayerNorm's scale and shift).
    Constant(f64),
}

impl Init {
    /// Kaiming uniform with the ReLU gain `√2`: the default for layers followed by ReLU.
    pub const RELU: Init = Init::KaimingUniform { gain: std::f64::consts::SQRT_2 };
    /// Xavier uniform with gain 1: the default for linear or tanh layers.
    pub const LINEAR: Init = Init::XavierUniform { gain: 1.0 };

    /// A tensor of shape `dims` drawn with `rng`, for a layer with `fan_in` inputs and
    /// `fan_out` outputs per unit.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidShape`] if `dims` is not a valid shape;
    /// [`tapir::Error::InvalidArgument`] if the fans are zero, the scale (or the constant)
    /// is not finite in `T`, or a drawn value is not finite in `T`;
    /// [`tapir::Error::TensorOutOfMemory`] if the tensor cannot be allocated.
    #[track_caller]
    pub fn tensor<T: Float, R: Rng + ?Sized>(
        self,
        dims: &[usize],
        fan_in: usize,
        fan_out: usize,
        rng: &mut R,
    ) -> tapir::Result<Tensor<T>> {
        let (fi, fo) = (fan_in as f64, fan_out as f64);
        let (uniform, scale) = match self {
            Init::Constant(v) => {
                return finite::<T>("Init::Constant", v).and_then(|v| Tensor::full(dims, T::from_f64(v)))
            }
            Init::KaimingUniform { gain } => (true, gain * (3.0 / fi).sqrt()),
            Init::KaimingNormal { gain } => (false, gain / fi.sqrt()),
            Init::XavierUniform { gain } => (true, gain * (6.0 / (fi + fo)).sqrt()),
            Init::XavierNormal { gain } => (false, gain * (2.0 / (fi + fo)).sqrt()),
        };
        if fan_in == 0 || fan_out == 0 {
            return Err(crate::invalid(
                "Init::tensor",
                format!("fan_in {fan_in} and fan_out {fan_out} must be positive"),
            ));
        }
        let scale = finite::<T>("Init::tensor", scale)?;
        if scale < 0.0 {
            return Err(crate::invalid("Init::tensor", format!("gain must be non-negative, got scale {scale}")));
        }
        let s = T::from_f64(scale);
        let t = if uniform { Tensor::uniform(dims, -s, s, rng)? } else { Tensor::normal(dims, T::ZERO, s, rng)? };
        // A finite scale can still draw values past the dtype's range (a normal sample a
        // few σ out with σ near `f32::MAX`), so check what was drawn, in the target dtype.
        if !t.data().iter().all(|v| v.is_finite()) {
            return Err(crate::invalid(
                "Init::tensor",
                format!("scale {scale} draws values that are not finite in {}", T::NAME),
            ));
        }
        Ok(t)
    }
}

/// `v`, if it is finite both as an `f64` and in the target element type `T` (`1e300` is a
/// finite `f64` but an infinite `f32`).
#[track_caller]
fn finite<T: Float>(op: &'static str, v: f64) -> tapir::Result<f64> {
    if v.is_finite() && T::from_f64(v).is_finite() {
        Ok(v)
    } else {
        Err(crate::invalid(op, format!("scale {v} is not finite in {}", T::NAME)))
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn moments(t: &Tensor<f64>) -> (f64, f64, f64) {
        let n = t.numel() as f64;
        let mean = t.data().iter().sum::<f64>() / n;
        let var = t.data().iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        let max = t.data().iter().fold(0.0f64, |m, v| m.max(v.abs()));
        (mean, var, max)
    }

    #[test]
    fn scales_match_the_formulas() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let (fi, fo) = (200, 100);
        // U(−b, b) has variance b²/3: Kaiming uniform gives gain²/fan_in.
        let t = Init::RELU.tensor::<f64, _>(&[fi, fo], fi, fo, &mut rng).unwrap();
        let (mean, var, max) = moments(&t);
        assert!(mean.abs() < 0.01 && (var - 2.0 / 200.0).abs() < 0.001, "{mean} {var}");
        assert!(max <= (6.0f64 / 200.0).sqrt());
        let t = Init::XavierNormal { gain: 1.0 }.tensor::<f64, _>(&[fi, fo], fi, fo, &mut rng).unwrap();
        let (_, var, _) = moments(&t);
        assert!((var - 2.0 / 300.0).abs() < 0.001, "{var}");
        let t = Init::KaimingNormal { gain: 1.0 }.tensor::<f64, _>(&[fi, fo], fi, fo, &mut rng).unwrap();
        assert!((moments(&t).1 - 1.0 / 200.0).abs() < 0.0005);
        let t = Init::LINEAR.tensor::<f64, _>(&[fi, fo], fi, fo, &mut rng).unwrap();
        assert!(moments(&t).2 <= (6.0f64 / 300.0).sqrt());
    }

    #[test]
    fn same_seed_same_tensor_and_bad_fans_are_errors() {
        let draw = |seed| {
            let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
            Init::RELU.tensor::<f32, _>(&[3, 4], 3, 4, &mut rng).unwrap()
        };
        assert_eq!(draw(7), draw(7));
        assert_ne!(draw(7), draw(8));
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let e = Init::RELU.tensor::<f32, _>(&[0, 4], 0, 4, &mut rng).unwrap_err();
        assert!(e.to_string().contains("fan_in 0"), "{e}");
        assert!(Init::Constant(f64::NAN).tensor::<f32, _>(&[2], 1, 1, &mut rng).is_err());
        assert_eq!(Init::Constant(0.5).tensor::<f32, _>(&[2], 1, 1, &mut rng).unwrap().data(), &[0.5, 0.5]);
    }
}
