//! [`LayerNorm`]: normalises the last axis, then scales and shifts.
//!
//! `y = (x − μ)/√(σ² + ε) ⊙ γ + β` with `μ` and `σ²` the mean and (population) variance
//! over the last axis: the engine's one-node [`Var::layer_norm`], whose value and
//! gradients are those of the composition (`mean_axes`, `sub`, `square`, `rsqrt`, `mul`,
//! `add`) up to rounding, with one node's memory instead of ten.

use tapir::{Float, ParamId, ParamStore, Tensor, Var};

use crate::layer::{Ctx, Module};

/// Layer normalisation over a last axis of size `dim`, with learned `γ` (`"{name}.weight"`,
/// ones) and `β` (`"{name}.bias"`, zeros).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct LayerNorm {
    /// `γ`, `[dim]`.
    pub weight: ParamId,
    /// `β`, `[dim]`.
    pub bias: ParamId,
    /// Added to the variance (default `1e-5`).
    pub eps: f64,
}

impl LayerNorm {
    /// A layer norm over a last axis of `dim` elements, `eps = 1e-5`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if a name is taken or `dim` is zero.
    #[track_caller]
    pub fn new<T: Float>(store: &mut ParamStore<T>, name: &str, dim: usize) -> tapir::Result<LayerNorm> {
        if dim == 0 {
            return Err(crate::invalid("LayerNorm::new", format!("dim {dim} must be positive")));
        }
        let (wn, bn) = (format!("{name}.weight"), format!("{name}.bias"));
        if store.find(&bn).is_some() {
            return Err(crate::invalid("LayerNorm::new", format!("a parameter named {bn:?} already exists")));
        }
        let w = Tensor::ones(&[dim]).map_err(crate::in_op("LayerNorm::new"))?;
        let b = Tensor::zeros(&[dim]).map_err(crate::in_op("LayerNorm::new"))?;
        let weight = store.add(wn, w)?;
        let bias = store.add(bn, b)?;
        Ok(LayerNorm { weight, bias, eps: 1e-5 })
    }
}

impl<T: Float> Module<T> for LayerNorm {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        x.layer_norm(cx.param(self.weight), cx.param(self.bias), self.eps)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::testing::{gradcheck, GradcheckOptions};
    use tapir::Graph;

    #[test]
    fn normalises_rows() {
        let mut store = ParamStore::<f64>::new();
        let ln = LayerNorm::new(&mut store, "ln", 4).unwrap();
        let x = Tensor::from_vec(vec![1.0, 2.0, 3.0, 4.0, -1.0, 0.0, 0.0, 5.0], &[2, 4]).unwrap();
        let mut g = Graph::new();
        let y = g.scope(|s| ln.forward(Ctx::eval(s, &store), s.input(&x)).to_tensor().unwrap());
        for row in y.data().chunks(4) {
            let mean = row.iter().sum::<f64>() / 4.0;
            let var = row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / 4.0;
            assert!(mean.abs() < 1e-12 && (var - 1.0).abs() < 1e-4, "{mean} {var}");
        }
    }

    #[test]
    fn gradient_matches_finite_differences() {
        // LayerNorm as a function of x, γ and β; γ and β enter as plain inputs here.
        let x = Tensor::from_vec(vec![0.3, -1.2, 2.0, 0.5, 1.1, -0.7], &[2, 3]).unwrap();
        let gamma = Tensor::from_vec(vec![1.5, -0.5, 0.8], &[3]).unwrap();
        let beta = Tensor::from_vec(vec![0.1, 0.2, -0.3], &[3]).unwrap();
        gradcheck(&[x, gamma, beta], GradcheckOptions::default(), |_, v| {
            let c = v[0] - v[0].mean_axes(&[-1], true);
            let inv = c.square().mean_axes(&[-1], true).add_scalar(1e-5).sqrt().recip();
            c * inv * v[1] + v[2]
        })
        .unwrap();
    }
}
