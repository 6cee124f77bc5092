//! Parameters: owned tensors that live outside the arena, across iterations, in a
//! [`ParamStore`] with stable [`ParamId`]s; and [`GradBuffer`], the caller-owned,
//! allocate-once buffer that [`Scope::backward_into`](crate::Scope::backward_into) fills.

use std::panic::Location;

use crate::error::{Error, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;
use crate::Float;

/// A stable handle to a parameter of one [`ParamStore`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId(u32);

impl ParamId {
    /// Position in the store.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// Named parameters, in insertion order.
#[derive(Debug, Clone, Default)]
pub struct ParamStore<T: Float = f32> {
    tensors: Vec<Tensor<T>>,
    names: Vec<String>,
}

impl<T: Float> ParamStore<T> {
    /// An empty store.
    pub fn new() -> ParamStore<T> {
        ParamStore { tensors: Vec::new(), names: Vec::new() }
    }

    /// Adds a parameter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `name` is already taken.
    #[track_caller]
    pub fn add(&mut self, name: impl Into<String>, value: Tensor<T>) -> Result<ParamId> {
        let name = name.into();
        if self.names.contains(&name) {
            return Err(Error::InvalidArgument {
                op: "ParamStore::add",
                detail: format!("a parameter named {name:?} already exists"),
                location: Location::caller(),
            });
        }
        let id = u32::try_from(self.tensors.len()).map_err(|_| Error::InvalidArgument {
            op: "ParamStore::add",
            detail: "more than u32::MAX parameters".into(),
            location: Location::caller(),
        })?;
        self.tensors.push(value);
        self.names.push(name);
        Ok(ParamId(id))
    }

    /// Number of parameters.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// Total number of scalar parameters.
    pub fn numel(&self) -> usize {
        self.tensors.iter().map(Tensor::numel).sum()
    }

    /// The parameter `id`, if it belongs to this store.
    pub fn get(&self, id: ParamId) -> Option<&Tensor<T>> {
        self.tensors.get(id.index())
    }

    /// The parameter `id`, mutably (only between scopes: a scope borrows the store).
    pub fn get_mut(&mut self, id: ParamId) -> Option<&mut Tensor<T>> {
        self.tensors.get_mut(id.index())
    }

    /// The name of parameter `id`.
    pub fn name(&self, id: ParamId) -> Option<&str> {
        self.names.get(id.index()).map(String::as_str)
    }

    /// The id of the parameter called `name`.
    pub fn find(&self, name: &str) -> Option<ParamId> {
        self.names.iter().position(|n| n == name).map(|i| ParamId(i as u32))
    }

    /// Every `(id, name, tensor)`, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &str, &Tensor<T>)> {
        self.tensors.iter().zip(&self.names).enumerate().map(|(i, (t, n))| (ParamId(i as u32), n.as_str(), t))
    }

    /// Every tensor, mutably, with its id (for optimizers).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ParamId, &mut Tensor<T>)> {
        self.tensors.iter_mut().enumerate().map(|(i, t)| (ParamId(i as u32), t))
    }

    /// A zeroed gradient buffer with one slot per parameter, of the same shapes.
    pub fn zeros_like(&self) -> GradBuffer<T> {
        GradBuffer {
            slots: self.tensors.iter().map(|t| Tensor::from_parts(vec![T::ZERO; t.numel()], t.shape())).collect(),
        }
    }
}

/// Gradients of a store's parameters, allocated once and reused every step.
#[derive(Debug, Clone)]
pub struct GradBuffer<T: Float = f32> {
    slots: Vec<Tensor<T>>,
}

impl<T: Float> GradBuffer<T> {
    /// Sets every gradient to zero (PyTorch's `optimizer.zero_grad()`).
    pub fn zero(&mut self) {
        for s in &mut self.slots {
            s.data_mut().fill(T::ZERO);
        }
    }

    /// The gradient of parameter `id`.
    pub fn get(&self, id: ParamId) -> Option<&Tensor<T>> {
        self.slots.get(id.index())
    }

    /// The gradient of parameter `id`, mutably (for clipping or scaling).
    pub fn get_mut(&mut self, id: ParamId) -> Option<&mut Tensor<T>> {
        self.slots.get_mut(id.index())
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every gradient, in parameter order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &Tensor<T>)> {
        self.slots.iter().enumerate().map(|(i, t)| (ParamId(i as u32), t))
    }

    pub(crate) fn shape(&self, index: usize) -> Option<Shape> {
        self.slots.get(index).map(Tensor::shape)
    }

    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut [T] {
        self.slots[index].data_mut()
    }
}
