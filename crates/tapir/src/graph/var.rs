//! [`Var`]'s accessors: what a handle can tell about its node (shape, value, gradient).

use std::panic::Location;

use crate::dtype::Float;
use crate::error::{Error, Result};
use crate::ops::matmul::relinear;
use crate::record::core::take_held;
use crate::record::ctx::Rec;
use crate::record::handles::Var;
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::Op;
use crate::tape::tape::NodeView;
use crate::tensor::Tensor;

impl<T: Float> std::fmt::Debug for Var<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?}: {}", self.id, self.shape())
    }
}

impl<'s, T: Float> Var<'s, T> {
    /// The node's id on the tape (`%poison` after a failed op).
    pub fn id(self) -> NodeId<'s> {
        self.id
    }

    /// The node's position on the tape, for a binding that holds nodes between calls
    /// (see [`Session`](crate::Session)); [`Scope::var_at`](crate::Scope::var_at) turns it
    /// back into a handle. A poisoned handle's is `u32::MAX`.
    pub fn index(self) -> usize {
        self.id.index()
    }

    /// Reads this handle's node for the caller, who may keep its value (see `settle`).
    #[track_caller]
    fn with_node<R>(self, f: impl FnOnce(&NodeView<'s, T>) -> R) -> Result<R> {
        let unsettled = {
            let tape = self.core.tape.borrow();
            if let Some(e) = &tape.error {
                return Err(e.clone());
            }
            tape.values_read.set(true);
            tape.in_place.holds(self.id.raw()) || tape.in_place.overwritten(self.id.raw())
        };
        if unsettled {
            let location = Location::caller();
            let mut tape = self.core.tape.borrow_mut();
            let mut r = Rec { tape: &mut tape, arena: self.core.arena, op: "value", location };
            settle(&mut r, self.id, self.core.par)?;
        }
        Ok(f(&self.core.tape.borrow().node(self.id)))
    }

    /// This handle's node, whether or not the scope has failed since (`None` for a
    /// poisoned handle).
    fn node(self) -> Option<NodeView<'s, T>> {
        self.core.tape.borrow().get(self.id)
    }

    /// The shape (`[]` for a poisoned handle). A handle recorded before the scope's first
    /// error keeps its true shape.
    pub fn shape(self) -> Shape {
        self.node().map_or(Shape::scalar(), |n| n.shape)
    }

    /// Whether backward will compute a gradient for this node (`false` for a poisoned
    /// handle; true to the node for one recorded before the scope's first error).
    pub fn requires_grad(self) -> bool {
        self.node().is_some_and(|n| n.requires_grad)
    }

    /// The value, borrowed from the arena for the rest of the scope.
    ///
    /// # Errors
    /// The scope's first error, if any op failed.
    #[track_caller]
    pub fn value(self) -> Result<&'s [T]> {
        self.with_node(|n| n.value)
    }

    /// The single element of a one-element value.
    ///
    /// # Errors
    /// The scope's first error; [`Error::NotScalar`] if the value has another size.
    #[track_caller]
    pub fn item(self) -> Result<T> {
        let location = Location::caller();
        let (shape, value) = self.with_node(|n| (n.shape, n.value))?;
        match value {
            [v] => Ok(*v),
            _ => Err(Error::NotScalar { op: "item", shape, location }),
        }
    }

    /// An owned copy of the value.
    ///
    /// # Errors
    /// The scope's first error, if any op failed.
    #[track_caller]
    pub fn to_tensor(self) -> Result<Tensor<T>> {
        let (shape, value) = self.with_node(|n| (n.shape, n.value))?;
        Ok(Tensor::from_parts(value.to_vec(), shape))
    }

    /// The gradient from the last backward pass, or `None` if there was none, the node
    /// requires no gradient, or no path from the loss reached it. A gradient that a
    /// backward pass computed stays readable after a later op fails. After
    /// [`Scope::backward_into`](crate::Scope::backward_into) into a zeroed buffer, a
    /// parameter's gradient is its slot in the buffer: zeros, not `None`, if the loss does
    /// not reach it; and an intermediate node (not a leaf or parameter) keeps no gradient
    /// after `backward_into`, which reuses its buffer.
    pub fn grad(self) -> Option<&'s [T]> {
        self.core.tape.borrow().grads.get(self.id).copied().flatten()
    }

    /// The gradient as an owned tensor of this node's shape (see [`grad`](Var::grad)).
    pub fn grad_tensor(self) -> Option<Tensor<T>> {
        let g = self.grad()?;
        Some(Tensor::from_parts(g.to_vec(), self.shape()))
    }

    /// A leaf that shares this value (no copy) and requires no gradient.
    #[track_caller]
    pub fn detach(self) -> Var<'s, T> {
        self.core.record_as("detach", |r| {
            settle(r, self.id, self.core.par)?;
            let n = r.node(self.id);
            Ok((Op::Leaf, n.shape, n.value))
        })
    }

    /// A new leaf that shares this value (no copy) and requests a gradient, like
    /// PyTorch's `x.detach().requires_grad_()`.
    #[track_caller]
    pub fn with_grad(self) -> Var<'s, T> {
        self.core.record_as("with_grad", |r| {
            settle(r, self.id, self.core.par)?;
            let n = r.node(self.id);
            Ok((Op::Variable, n.shape, n.value))
        })
    }
}

/// Before the caller reads or shares node `id`'s value: marks the tape's values as read
/// (a checkpointed block that reads values is recomputed without in-place ops), gives a
/// buffer held back for an in-place op to its producer `id`, and restores `id`'s value if
/// an in-place op overwrote it: in a checkpointed block's forward by computing it again,
/// in its recomputation as an error (the block read a value it did not read in its forward).
fn settle<'s, T: Float>(r: &mut Rec<'_, 's, T>, id: NodeId<'s>, par: faer::Par) -> Result<()> {
    r.tape.values_read.set(true);
    if r.tape.in_place.holds(id.raw()) {
        take_held(r.tape, None);
    }
    if !r.tape.in_place.overwritten(id.raw()) {
        return Ok(());
    }
    if r.tape.in_place.speculate {
        return relinear(r, id, par);
    }
    let shape = r.shape(id);
    Err(Error::InvalidArgument {
        op: "value",
        detail: format!(
            "this value ({shape}) was overwritten in place while its checkpointed block was recomputed, \
             because the block's forward read no values; a checkpointed block must read the same values \
             when recomputed"
        ),
        location: r.location,
    })
}
