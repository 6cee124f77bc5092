//! [`Scope::fail`]: a caller's own check, reported through the scope like an op's error.

use crate::dtype::Float;
use crate::error::Error;
use crate::record::handles::{Scope, Var};

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Records `e` as the scope's error (unless it already holds one, which is kept) and
    /// returns a poisoned handle, as a failed op does: every later op on the handle is
    /// skipped, and `value`, `item` and `backward` return the scope's first error. This is
    /// [`invalid`](Scope::invalid) for a typed error other than `InvalidArgument`, for
    /// example `tapir_nn::Ctx::with_params` reporting a parameter id of another store
    /// with the [`Error::WrongStore`] that [`ParamStore::check`](crate::ParamStore::check)
    /// returned.
    ///
    /// ```
    /// use tapir::{Error, Graph, ParamStore, Tensor};
    /// # fn main() -> Result<(), Error> {
    /// let (ours, mut theirs) = (ParamStore::<f32>::new(), ParamStore::<f32>::new());
    /// let id = theirs.add("w", Tensor::zeros(&[2])?)?;
    /// let mut g = Graph::new();
    /// let e = g.scope(|s| {
    ///     let w = match ours.check("my_layer", id) {
    ///         Ok(_) => s.param(&ours, id),
    ///         Err(e) => s.fail(e), // the check's own error, not a later op's
    ///     };
    ///     (w * 2.0).sum().item()
    /// });
    /// assert!(matches!(e, Err(Error::WrongStore { op: "my_layer", .. })));
    /// # Ok(()) }
    /// ```
    pub fn fail(&'s self, e: Error) -> Var<'s, T> {
        self.core.fail(e)
    }
}
