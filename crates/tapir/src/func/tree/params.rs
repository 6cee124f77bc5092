//! A [`ParamStore`] as a structure: a handle per parameter in, a [`GradBuffer`] out.

use std::panic::Location;

use super::leaves::{Gradients, Leaves, Position, Tree};
use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::params::{GradBuffer, ParamId, ParamStore};
use crate::record::handles::Var;

/// What a function transformed over a [`ParamStore`] receives: one leaf per parameter, in
/// the store's order, looked up by [`ParamId`].
///
/// ```
/// # fn main() -> Result<(), tapir::Error> {
/// let mut store = tapir::ParamStore::<f64>::new();
/// let w = store.add("w", tapir::Tensor::from_vec(vec![1.0, 2.0], &[2])?)?;
/// let b = store.add("b", tapir::Tensor::from_vec(vec![0.5], &[1])?)?;
/// let mut graph = tapir::Graph::new();
/// let grads = tapir::func::tree::grad(&mut graph, &store, |_, p| p.get(w).square().sum() + p.get(b).sum())?;
/// assert_eq!(grads.get(w)?.data(), [2.0, 4.0]); // 2w
/// assert_eq!(grads.get(b)?.data(), [1.0]);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ParamVars<L> {
    store: u64,
    leaves: Vec<L>,
    /// A handle whose scope records the error of a bad [`get`](ParamVars::get).
    anchor: L,
}

impl<L> ParamVars<L> {
    /// The leaves in the store's order ([`ParamId::index`]).
    pub fn as_slice(&self) -> &[L] {
        &self.leaves
    }

    /// The number of parameters.
    pub fn len(&self) -> usize {
        self.leaves.len()
    }

    /// Whether the store had no parameters.
    pub fn is_empty(&self) -> bool {
        self.leaves.is_empty()
    }

    /// The identity of the store the leaves come from ([`ParamStore::id`]).
    pub fn store(&self) -> u64 {
        self.store
    }
}

impl<'s, T: Float> ParamVars<Var<'s, T>> {
    /// The handle of parameter `id`.
    ///
    /// # Errors
    /// A poisoned handle, with [`Error::WrongStore`] for an id of another store and
    /// [`Error::UnknownParam`] for one past the end recorded as the scope's error.
    #[track_caller]
    pub fn get(&self, id: ParamId) -> Var<'s, T> {
        let location = Location::caller();
        let op = "ParamVars::get";
        if id.store() != self.store {
            let what = format!("parameter #{}", id.index());
            return self.anchor.core.fail(Error::WrongStore {
                op,
                what,
                expected: id.store(),
                found: self.store,
                location,
            });
        }
        match self.leaves.get(id.index()) {
            Some(&v) => v,
            None => self.anchor.core.fail(Error::UnknownParam {
                op,
                detail: format!(
                    "parameter #{} is past the {} parameters the store held",
                    id.index(),
                    self.leaves.len()
                ),
                location,
            }),
        }
    }
}

impl<T: Float> Tree<T> for ParamStore<T> {
    type Map<L> = ParamVars<L>;
    type Grads = GradBuffer<T>;

    fn check(&self, t: &GradBuffer<T>, at: &mut Position) -> Result<()> {
        if t.store() != self.id() {
            let detail = format!(
                "the gradient buffer belongs to parameter store #{}, the input is store #{}",
                t.store(),
                self.id()
            );
            return Err(at.mismatch(detail));
        }
        if t.len() != self.len() {
            let detail = format!("the gradient buffer holds {} parameters, the store {}", t.len(), self.len());
            return Err(at.mismatch(detail));
        }
        self.iter().zip(t.iter()).try_for_each(|((_, name, x), (_, g))| {
            at.at(format_args!("[{name:?}]"), |at| at.shapes(x.shape(), g.shape()))
        })
    }

    fn record<'s, 'g>(&'g self, t: Option<&'g GradBuffer<T>>, leaves: &mut Leaves<'s, 'g, T>) -> ParamVars<Var<'s, T>> {
        let vars = self
            .iter()
            .map(|(id, _, x)| {
                let g = t.and_then(|t| t.get(id).ok());
                leaves.slices(x.shape(), x.data(), g.map(|g| (g.shape(), g.data())))
            })
            .collect();
        ParamVars { store: self.id(), leaves: vars, anchor: leaves.poison() }
    }

    fn grads(&self, g: &mut Gradients<'_, '_, T>) -> Result<GradBuffer<T>> {
        let mut buffer = self.zeros_like()?;
        for (id, _, _) in self.iter() {
            let v = g.next_var()?;
            let (mut slot, value) = (buffer.get_mut(id)?, v.value()?);
            if slot.numel() != value.len() {
                return Err(Error::InvalidArgument {
                    op: "grads",
                    detail: format!("a gradient of {} elements for a parameter of shape {}", value.len(), slot.shape()),
                    location: Location::caller(),
                });
            }
            slot.data_mut().copy_from_slice(value);
        }
        Ok(buffer)
    }
}
