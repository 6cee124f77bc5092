//! Parameters: owned tensors that live outside the arena, across iterations, in a
//! [`ParamStore`] with stable [`ParamId`]s; and [`GradBuffer`], the caller-owned,
//! allocate-once buffer that [`Scope::backward_into`](crate::Scope::backward_into) fills.

use std::panic::Location;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::dtype::Float;
use crate::error::{Error, Loc, Result};
use crate::shape::Shape;
use crate::tensor::Tensor;

/// A stable handle to a parameter of one [`ParamStore`]: the store's identity and the
/// parameter's position in it (16 bytes, `Copy`). Using it with another store is an
/// [`Error::WrongStore`], never a silent read of that store's parameter at the same position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ParamId {
    store: u64,
    index: u32,
}

impl ParamId {
    /// This id's position in a container of `len` entries belonging to store `store`, or
    /// the typed error of `op`: [`Error::WrongStore`] for an id of another store,
    /// [`Error::UnknownParam`] for a position past the end. Shared by the store and the
    /// gradient buffer.
    fn resolve(
        self,
        op: &'static str,
        store: u64,
        len: usize,
        holder: &str,
        unit: &str,
        location: Loc,
    ) -> Result<usize> {
        if self.store != store {
            return Err(Error::WrongStore {
                op,
                what: format!("parameter #{}", self.index),
                expected: self.store,
                found: store,
                location,
            });
        }
        if self.index() >= len {
            return Err(Error::UnknownParam {
                op,
                detail: format!("parameter #{} is not in {holder} {len} {unit}", self.index),
                location,
            });
        }
        Ok(self.index())
    }

    /// Position in the store.
    pub fn index(self) -> usize {
        self.index as usize
    }

    /// The identity of the store it belongs to (see [`ParamStore::id`]).
    pub fn store(self) -> u64 {
        self.store
    }
}

/// The source of store identities: process-unique, never reused (a `u64` counter does not
/// wrap in any realistic run: 2⁶⁴ stores at one per nanosecond take 584 years).
static NEXT_STORE: AtomicU64 = AtomicU64::new(1);

fn next_store_id() -> u64 {
    NEXT_STORE.fetch_add(1, Ordering::Relaxed)
}

/// Named parameters, in insertion order, with a process-unique identity.
///
/// Every [`ParamId`] and [`GradBuffer`] made from a store carries its identity, and every
/// use checks it: an id or a buffer of another store is an [`Error::WrongStore`]. A clone
/// keeps the identity (it is the same parameter set, so the original's ids and buffers
/// work with it, as for a saved "best model" copy); [`ParamStore::new`] and `default`
/// make a fresh one.
#[derive(Debug, Clone)]
pub struct ParamStore<T: Float = f32> {
    id: u64,
    tensors: Vec<Tensor<T>>,
    names: Vec<String>,
}

impl<T: Float> Default for ParamStore<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T: Float> ParamStore<T> {
    /// An empty store with a fresh identity.
    pub fn new() -> ParamStore<T> {
        ParamStore { id: next_store_id(), tensors: Vec::new(), names: Vec::new() }
    }

    /// The store's identity: unique in the process, shared only with its clones.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Adds a parameter.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `name` is already taken;
    /// [`Error::TensorOutOfMemory`] if the store's lists cannot grow.
    #[track_caller]
    pub fn add(&mut self, name: impl Into<String>, value: Tensor<T>) -> Result<ParamId> {
        let name = name.into();
        let location = Location::caller();
        if self.names.contains(&name) {
            return Err(Error::InvalidArgument {
                op: "ParamStore::add",
                detail: format!("a parameter named {name:?} already exists"),
                location,
            });
        }
        let index = u32::try_from(self.tensors.len()).map_err(|_| Error::InvalidArgument {
            op: "ParamStore::add",
            detail: "more than u32::MAX parameters".into(),
            location,
        })?;
        let oom = |_| Error::TensorOutOfMemory {
            op: "ParamStore::add",
            shape: value.shape(),
            requested: std::mem::size_of::<Tensor<T>>() + std::mem::size_of::<String>(),
            location,
        };
        self.tensors.try_reserve(1).map_err(oom)?;
        self.names.try_reserve(1).map_err(oom)?;
        self.tensors.push(value);
        self.names.push(name);
        Ok(ParamId { store: self.id, index })
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

    /// Checks that `id` belongs to this store and is in range, and returns its position.
    ///
    /// # Errors
    /// [`Error::WrongStore`] for an id of another store; [`Error::UnknownParam`] for an id
    /// past the end (a store cannot shrink, so only a clone's later additions can do that).
    #[track_caller]
    pub fn check(&self, op: &'static str, id: ParamId) -> Result<usize> {
        id.resolve(op, self.id, self.tensors.len(), "this store of", "parameters", Location::caller())
    }

    /// The parameter `id`.
    ///
    /// # Errors
    /// As [`ParamStore::check`].
    #[track_caller]
    pub fn get(&self, id: ParamId) -> Result<&Tensor<T>> {
        let i = self.check("ParamStore::get", id)?;
        Ok(&self.tensors[i])
    }

    /// The parameter `id`, mutably (only between scopes: a scope borrows the store).
    ///
    /// # Errors
    /// As [`ParamStore::check`].
    #[track_caller]
    pub fn get_mut(&mut self, id: ParamId) -> Result<&mut Tensor<T>> {
        let i = self.check("ParamStore::get_mut", id)?;
        Ok(&mut self.tensors[i])
    }

    /// The name of parameter `id`, if it belongs to this store.
    pub fn name(&self, id: ParamId) -> Option<&str> {
        if id.store != self.id {
            return None;
        }
        self.names.get(id.index()).map(String::as_str)
    }

    /// The id of the parameter called `name`.
    pub fn find(&self, name: &str) -> Option<ParamId> {
        self.names.iter().position(|n| n == name).map(|i| self.id_at(i))
    }

    /// The tensor at position `i`, which [`ParamStore::check`] has validated.
    pub(crate) fn at(&self, i: usize) -> &Tensor<T> {
        &self.tensors[i]
    }

    fn id_at(&self, i: usize) -> ParamId {
        // `add` refuses a position that does not fit in a u32.
        ParamId { store: self.id, index: i as u32 }
    }

    /// Every `(id, name, tensor)`, in insertion order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, &str, &Tensor<T>)> {
        let store = self.id;
        self.tensors
            .iter()
            .zip(&self.names)
            .enumerate()
            .map(move |(i, (t, n))| (ParamId { store, index: i as u32 }, n.as_str(), t))
    }

    /// Every tensor, mutably, with its id (for optimizers).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ParamId, &mut Tensor<T>)> {
        let store = self.id;
        self.tensors.iter_mut().enumerate().map(move |(i, t)| (ParamId { store, index: i as u32 }, t))
    }

    /// A zeroed gradient buffer with one slot per parameter, of the same shapes, tied to
    /// this store: one contiguous allocation, a view per parameter.
    ///
    /// # Errors
    /// [`Error::TensorOutOfMemory`] if the buffer could not be allocated.
    #[track_caller]
    pub fn zeros_like(&self) -> Result<GradBuffer<T>> {
        let location = Location::caller();
        let oom = |requested| Error::TensorOutOfMemory {
            op: "ParamStore::zeros_like",
            shape: Shape::scalar(),
            requested,
            location,
        };
        let mut slots = Vec::new();
        slots.try_reserve_exact(self.tensors.len()).map_err(|_| oom(self.tensors.len().saturating_mul(16)))?;
        let mut lent_to = Vec::new();
        lent_to.try_reserve_exact(self.tensors.len()).map_err(|_| oom(self.tensors.len().saturating_mul(4)))?;
        lent_to.resize(self.tensors.len(), FREE);
        let mut numel = 0usize;
        for t in &self.tensors {
            slots.push((numel, t.shape()));
            numel += t.numel();
        }
        let mut data = Vec::new();
        data.try_reserve_exact(numel).map_err(|_| oom(numel.saturating_mul(std::mem::size_of::<T>())))?;
        data.resize(numel, T::ZERO);
        Ok(GradBuffer { store: self.id, data, slots, lent_to, zeroed: true })
    }
}

/// Gradients of a store's parameters, allocated once and reused every step: one
/// contiguous buffer (see [`as_slice`](GradBuffer::as_slice), which a data-parallel
/// all-reduce sends in one call) with a view per parameter, in the store's order. It
/// carries its store's identity: [`Scope::backward_into`](crate::Scope::backward_into)
/// and the optimizers refuse a buffer of another store with [`Error::WrongStore`].
#[derive(Debug, Clone)]
pub struct GradBuffer<T: Float = f32> {
    store: u64,
    data: Vec<T>,
    /// Each parameter's offset in `data` and shape.
    slots: Vec<(usize, Shape)>,
    /// Per slot, during [`Scope::backward_into`](crate::Scope::backward_into): the one tape
    /// node its elements are lent to as that node's gradient, or [`FREE`] / [`SHARED`].
    lent_to: Vec<u32>,
    /// Whether every element is known to be zero: set by [`zero`](GradBuffer::zero) and
    /// on creation, cleared by every writable access. Only a zeroed buffer is lent to a
    /// backward pass (an error during the pass can then put back exactly what it held).
    zeroed: bool,
}

/// [`GradBuffer::lent_to`]: no node on the tape reads the parameter.
pub(crate) const FREE: u32 = u32::MAX;
/// [`GradBuffer::lent_to`]: several nodes read the parameter; its slot is not lent, and
/// their gradients are added to it after the pass.
pub(crate) const SHARED: u32 = u32::MAX - 1;

/// One parameter's gradient in a [`GradBuffer`]: its elements and shape.
#[derive(Debug, Clone, Copy)]
pub struct Grad<'a, T> {
    data: &'a [T],
    shape: Shape,
}

impl<'a, T> Grad<'a, T> {
    /// The elements, row-major.
    pub fn data(&self) -> &'a [T] {
        self.data
    }

    /// The parameter's shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

/// One parameter's gradient in a [`GradBuffer`], writable (for clipping or scaling).
#[derive(Debug)]
pub struct GradMut<'a, T> {
    data: &'a mut [T],
    shape: Shape,
}

impl<T> GradMut<'_, T> {
    /// The elements, row-major.
    pub fn data(&self) -> &[T] {
        self.data
    }

    /// The elements, writable.
    pub fn data_mut(&mut self) -> &mut [T] {
        self.data
    }

    /// The parameter's shape.
    pub fn shape(&self) -> Shape {
        self.shape
    }

    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.data.len()
    }
}

impl<T: Float> GradBuffer<T> {
    /// Sets every gradient to zero (PyTorch's `optimizer.zero_grad()`): one fill, split
    /// over [`pool_threads`](crate::pool_threads) threads when it is large.
    pub fn zero(&mut self) {
        let threads = crate::threads::pool_threads();
        let par = if threads > 1 { faer::Par::rayon(threads) } else { faer::Par::Seq };
        crate::kernels::par::fill(par, &mut self.data, T::ZERO);
        self.zeroed = true;
    }

    /// The identity of the store this buffer was made for (see [`ParamStore::id`]).
    pub fn store(&self) -> u64 {
        self.store
    }

    /// Checks that this buffer was made for `store`.
    ///
    /// # Errors
    /// [`Error::WrongStore`] otherwise.
    #[track_caller]
    pub fn check_store(&self, op: &'static str, store: u64) -> Result<()> {
        if self.store == store {
            Ok(())
        } else {
            Err(Error::WrongStore {
                op,
                what: "the gradient buffer".into(),
                expected: self.store,
                found: store,
                location: Location::caller(),
            })
        }
    }

    #[track_caller]
    fn slot_index(&self, op: &'static str, id: ParamId) -> Result<usize> {
        id.resolve(op, self.store, self.slots.len(), "this buffer of", "slots", Location::caller())
    }

    /// The elements of slot `i`.
    fn range(&self, i: usize) -> std::ops::Range<usize> {
        let (at, shape) = self.slots[i];
        at..at + shape.numel()
    }

    /// The gradient of parameter `id`.
    ///
    /// # Errors
    /// [`Error::WrongStore`] for an id of another store; [`Error::UnknownParam`] for an id
    /// past the end.
    #[track_caller]
    pub fn get(&self, id: ParamId) -> Result<Grad<'_, T>> {
        let i = self.slot_index("GradBuffer::get", id)?;
        Ok(Grad { data: &self.data[self.range(i)], shape: self.slots[i].1 })
    }

    /// The gradient of parameter `id`, writable (for clipping or scaling).
    ///
    /// # Errors
    /// As [`GradBuffer::get`].
    #[track_caller]
    pub fn get_mut(&mut self, id: ParamId) -> Result<GradMut<'_, T>> {
        let i = self.slot_index("GradBuffer::get_mut", id)?;
        self.zeroed = false;
        let range = self.range(i);
        Ok(GradMut { data: &mut self.data[range], shape: self.slots[i].1 })
    }

    /// Number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether there are no slots.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Every gradient, one after another in parameter order, as one slice.
    pub fn as_slice(&self) -> &[T] {
        &self.data
    }

    /// Every gradient as one writable slice (for a collective over the whole buffer).
    pub fn as_mut_slice(&mut self) -> &mut [T] {
        self.zeroed = false;
        &mut self.data
    }

    /// Every gradient, in parameter order.
    pub fn iter(&self) -> impl Iterator<Item = (ParamId, Grad<'_, T>)> {
        let store = self.store;
        self.slots.iter().enumerate().map(move |(i, &(at, shape))| {
            (ParamId { store, index: i as u32 }, Grad { data: &self.data[at..at + shape.numel()], shape })
        })
    }

    /// Every gradient, writable, in parameter order (for clipping or scaling).
    pub fn iter_mut(&mut self) -> impl Iterator<Item = (ParamId, GradMut<'_, T>)> {
        let store = self.store;
        self.zeroed = false;
        let mut rest: &mut [T] = &mut self.data;
        self.slots.iter().enumerate().map(move |(i, &(_, shape))| {
            // The slots tile the buffer in order, so each takes the front of what is left.
            let (data, tail) = std::mem::take(&mut rest).split_at_mut(shape.numel());
            rest = tail;
            (ParamId { store, index: i as u32 }, GradMut { data, shape })
        })
    }

    pub(crate) fn shape(&self, index: usize) -> Option<Shape> {
        self.slots.get(index).map(|&(_, shape)| shape)
    }

    pub(crate) fn slot_mut(&mut self, index: usize) -> &mut [T] {
        self.zeroed = false;
        let range = self.range(index);
        &mut self.data[range]
    }

    /// Plans a backward pass's direct writes: `params` lists the tape's gradient-requesting
    /// parameter nodes as `(slot, node)`. A slot that exactly one node reads is lent to that
    /// node; one that several read is [`SHARED`]. Returns `false`, planning nothing, unless
    /// the buffer is zeroed.
    pub(crate) fn plan(&mut self, params: impl Iterator<Item = (usize, u32)>) -> bool {
        if !self.zeroed {
            return false;
        }
        self.lent_to.fill(FREE);
        for (slot, node) in params {
            let owner = &mut self.lent_to[slot];
            *owner = if *owner == FREE { node } else { SHARED };
        }
        true
    }

    /// After [`plan`](GradBuffer::plan): the zeroed flag (cleared; the caller sets it again
    /// if it zeroes every lent slot back) and `(slot, lent_to, elements)` for every slot
    /// read by some node, in slot order.
    pub(crate) fn lend(&mut self) -> (&mut bool, impl Iterator<Item = (usize, u32, &mut [T])>) {
        self.zeroed = false;
        let mut rest: &mut [T] = &mut self.data;
        let slots = self.slots.iter().zip(&self.lent_to).enumerate().filter_map(move |(i, (&(_, shape), &to))| {
            // The slots tile the buffer in order, so each takes the front of what is left.
            let (data, tail) = std::mem::take(&mut rest).split_at_mut(shape.numel());
            rest = tail;
            (to != FREE).then_some((i, to, data))
        });
        (&mut self.zeroed, slots)
    }

    /// The address range of the elements, to tell a lent slot from an arena buffer.
    pub(crate) fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.data.as_ptr() as usize;
        start..start + std::mem::size_of_val(self.data.as_slice())
    }
}
