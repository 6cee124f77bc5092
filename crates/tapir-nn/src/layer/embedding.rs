//! [`Embedding`]: a lookup table of vectors, `out[j] = W[indices[j]]`, through the
//! engine's `index_select` on axis 0, whose gradient scatter-adds `dout` rows into `dW`
//! (an index used twice gets both rows).

use rand::Rng;
use tapir::{Float, ParamId, ParamStore, Tensor, Var};

use crate::layer::Ctx;

/// A table of `count` vectors of `dim` elements (`"{name}.weight"`, `[count, dim]`,
/// drawn from `N(0, 1)` as in PyTorch).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Embedding {
    /// The table, `[count, dim]`.
    pub weight: ParamId,
    /// Number of vectors.
    pub count: usize,
    /// Elements per vector.
    pub dim: usize,
}

impl Embedding {
    /// A table of `count` vectors of size `dim`, drawn from `N(0, 1)` with `rng`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] if `count` or `dim` is zero or the name is taken;
    /// [`tapir::Error::InvalidShape`] or [`tapir::Error::TensorOutOfMemory`] (naming
    /// `Embedding::new`) if the table cannot exist or be allocated.
    #[track_caller]
    pub fn new<T: Float, R: Rng + ?Sized>(
        store: &mut ParamStore<T>,
        name: &str,
        count: usize,
        dim: usize,
        rng: &mut R,
    ) -> tapir::Result<Embedding> {
        const OP: &str = "Embedding::new";
        if count == 0 || dim == 0 {
            return Err(crate::invalid(OP, format!("count {count} and dim {dim} must be positive")));
        }
        let w = Tensor::normal(&[count, dim], T::ZERO, T::ONE, rng).map_err(crate::in_op(OP))?;
        let weight = store.add(format!("{name}.weight"), w)?;
        Ok(Embedding { weight, count, dim })
    }

    /// The vectors at `indices`, `[indices.len(), dim]`.
    ///
    /// # Errors
    /// [`tapir::Error::IndexOutOfRange`] (recorded) for an index `≥ count`.
    #[track_caller]
    pub fn forward<'s, T: Float>(&self, cx: Ctx<'s, '_, T>, indices: &[usize]) -> Var<'s, T> {
        cx.param(self.weight).index_select(0, indices)
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;
    use tapir::Graph;

    #[test]
    fn looks_up_rows_and_scatters_gradients() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0);
        let mut store = ParamStore::<f64>::new();
        let emb = Embedding::new(&mut store, "emb", 5, 3, &mut rng).unwrap();
        let mut grads = store.zeros_like().unwrap();
        let table = store.get(emb.weight).unwrap().clone();
        let mut g = Graph::new();
        g.scope(|s| {
            let v = emb.forward(Ctx::train(s, &store), &[4, 1, 4]);
            assert_eq!(v.value().unwrap()[..3], table.data()[12..15]);
            // L = Σ v: row 4 is read twice, so its gradient is 2; row 1 once; others 0.
            s.backward_into(v.sum(), &mut grads).unwrap();
        });
        let dw = grads.get(emb.weight).unwrap().data();
        assert_eq!(&dw[12..15], &[2.0; 3]);
        assert_eq!(&dw[3..6], &[1.0; 3]);
        assert_eq!(&dw[0..3], &[0.0; 3]);
        let e = g.scope(|s| emb.forward(Ctx::train(s, &store), &[5]).value().map(|_| ()).unwrap_err());
        assert!(matches!(e, tapir::Error::IndexOutOfRange { index: 5, len: 5, .. }), "{e}");
    }
}
