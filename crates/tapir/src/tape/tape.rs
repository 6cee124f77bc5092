//! The tape: nodes appended in creation order, so it is already topologically sorted.
//!
//! A node is `Copy` (op tag, input ids, an index into the tape's shape table, a slice of
//! its value in the arena), so clearing the tape runs no destructor and costs O(1). Shapes
//! are interned: most ops keep an input's shape, so a node reuses that entry, and a node
//! stays at 40 bytes for `f32` instead of carrying 28 bytes of dimensions. The vectors
//! themselves are kept by the [`Graph`](crate::Graph) between scopes and relabelled to each
//! new scope's lifetime without reallocating (see [`recycle`]).
//!
//! The tape knows `Op` and nothing that runs it: the rest of a scope's state (side tables,
//! the error, the buffers of a backward pass) is `record::state::State`, which holds a `Tape`.

use crate::error::{Error, Loc, Result};
use crate::shape::Shape;
use crate::tape::id::NodeId;
use crate::tape::op::{Inputs, Op};

/// One recorded node. 40 bytes for `f32`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<'s, T> {
    /// The value, in the arena (or borrowed from a parameter or input tensor).
    pub value: &'s [T],
    pub op: Op<'s, T>,
    /// Index into [`Tape::shapes`].
    shape: u32,
    /// Whether some gradient-requesting leaf reaches this node.
    pub requires_grad: bool,
}

/// A node with its shape looked up: what recording and backward read.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NodeView<'s, T> {
    pub value: &'s [T],
    pub op: Op<'s, T>,
    pub shape: Shape,
    pub requires_grad: bool,
}

/// The record of one scope: its nodes, their shapes, their payloads and locations.
#[derive(Debug, Default)]
pub(crate) struct Tape<'s, T> {
    pub nodes: Vec<Node<'s, T>>,
    /// The distinct shapes of the nodes, in order of first use.
    pub shapes: Vec<Shape>,
    /// Variable-length payloads: concat inputs, indices, labels.
    pub extra: Vec<u32>,
    /// Where each node was recorded; filled only while anomaly detection is on.
    pub locs: Vec<Loc>,
}

/// Empties `v` and gives it back with another element type of the same layout (here: the
/// same type under another lifetime). The standard library collects a `vec::IntoIter`
/// mapped to a same-layout type in place, so the buffer and its capacity are kept and
/// nothing is allocated; the zero-allocation test checks this.
pub(crate) fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!("a cleared vector yields no element")).collect()
}

impl<'s, T: Copy> Tape<'s, T> {
    /// The ids of every node, in tape order. With [`push`](Tape::push) and
    /// [`stored_ids`](Tape::stored_ids) and [`id_at`](Tape::id_at), the only places that
    /// mint ids.
    pub(crate) fn ids(&self) -> impl DoubleEndedIterator<Item = NodeId<'s>> {
        // `push` keeps the length below u32::MAX.
        (0..self.nodes.len() as u32).map(NodeId::new)
    }

    /// The id of the node at position `raw`, if there is one.
    pub(crate) fn id_at(&self, raw: u32) -> Option<NodeId<'s>> {
        ((raw as usize) < self.nodes.len()).then(|| NodeId::new(raw))
    }

    /// The ids from the first node through `last`, in tape order.
    pub(crate) fn ids_through(&self, last: NodeId<'s>) -> impl DoubleEndedIterator<Item = NodeId<'s>> {
        (0..=last.raw()).map(NodeId::new)
    }

    /// The ids after `first` through `last`, in tape order.
    pub(crate) fn ids_after(&self, first: NodeId<'s>, last: NodeId<'s>) -> impl DoubleEndedIterator<Item = NodeId<'s>> {
        (first.raw() + 1..=last.raw()).map(NodeId::new)
    }

    /// Stores `ids` in the payload list and returns their offset (see
    /// [`stored_ids`](Tape::stored_ids)).
    pub(crate) fn store_ids(&mut self, ids: impl IntoIterator<Item = NodeId<'s>>) -> Result<u32, usize> {
        let at = self.extra.len();
        let at = u32::try_from(at).map_err(|_| at)?;
        self.extra.extend(ids.into_iter().map(NodeId::raw));
        Ok(at)
    }

    /// The `count` ids stored by [`store_ids`](Tape::store_ids) at `at`.
    pub(crate) fn stored_ids(&self, at: u32, count: u32) -> impl Iterator<Item = NodeId<'s>> + '_ {
        self.extra[at as usize..at as usize + count as usize].iter().map(|&raw| NodeId::new(raw))
    }

    /// Calls `f` on every input of `op`, in order (an input used twice is visited twice).
    #[inline(always)]
    pub(crate) fn for_each_input(&self, op: &Op<'s, T>, mut f: impl FnMut(NodeId<'s>)) {
        match op.inputs() {
            Inputs::Fixed(ids, n) => ids[..n].iter().for_each(|&x| f(x)),
            Inputs::Stored { at, count } => self.stored_ids(at, count).for_each(f),
        }
    }

    /// Appends a node and mints its id.
    #[inline]
    pub(crate) fn push(&mut self, view: NodeView<'s, T>, op: &'static str, location: Loc) -> Result<NodeId<'s>> {
        let len = self.nodes.len();
        // u32::MAX itself is reserved for the poisoned handle.
        let raw = u32::try_from(len).ok().filter(|&r| r < u32::MAX).ok_or(Error::TapeFull { op, len, location })?;
        let shape = self.intern(view.shape, &view.op);
        self.nodes.push(Node { value: view.value, op: view.op, shape, requires_grad: view.requires_grad });
        Ok(NodeId::new(raw))
    }

    /// The index of `shape` in the table: the last entry's or an input's if equal, else a
    /// new entry. (There are fewer entries than nodes, so the index fits in a `u32`.)
    #[inline]
    fn intern(&mut self, shape: Shape, op: &Op<'s, T>) -> u32 {
        match self.shapes.last() {
            Some(last) if *last == shape => (self.shapes.len() - 1) as u32,
            _ => self.intern_slow(shape, op),
        }
    }

    /// [`intern`](Tape::intern) when the shape differs from the last one.
    #[inline(never)]
    fn intern_slow(&mut self, shape: Shape, op: &Op<'s, T>) -> u32 {
        let mut found = None;
        self.for_each_input(op, |x| {
            let at = self.nodes[x.index()].shape;
            if found.is_none() && self.shapes[at as usize] == shape {
                found = Some(at);
            }
        });
        found.unwrap_or_else(|| {
            self.shapes.push(shape);
            (self.shapes.len() - 1) as u32
        })
    }

    /// Node `id` with its shape, or `None` for an id this tape never minted (the poisoned
    /// handle's).
    pub(crate) fn get(&self, id: NodeId<'s>) -> Option<NodeView<'s, T>> {
        self.nodes.get(id.index()).map(|n| self.view(n))
    }

    /// Node `id` with its shape.
    #[inline]
    pub(crate) fn node(&self, id: NodeId<'s>) -> NodeView<'s, T> {
        self.view(&self.nodes[id.index()])
    }

    /// `node` (one of this tape's) with its shape.
    #[inline]
    pub(crate) fn view(&self, node: &Node<'s, T>) -> NodeView<'s, T> {
        NodeView {
            value: node.value,
            op: node.op,
            shape: self.shapes[node.shape as usize],
            requires_grad: node.requires_grad,
        }
    }

    /// The value of node `id`.
    #[inline]
    pub(crate) fn value(&self, id: NodeId<'s>) -> &'s [T] {
        self.nodes[id.index()].value
    }

    /// The shape of node `id`.
    #[inline]
    pub(crate) fn shape(&self, id: NodeId<'s>) -> Shape {
        self.shapes[self.nodes[id.index()].shape as usize]
    }

    /// Bytes of tape beyond the values: nodes, the shape table and index payloads.
    pub(crate) fn bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node<'_, T>>()
            + self.shapes.len() * std::mem::size_of::<Shape>()
            + self.extra.len() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_stay_small() {
        // Value slice (16) + op (16 for f32: tag, an id, two scalars) + shape index (4) + flag.
        assert_eq!(std::mem::size_of::<Node<'static, f32>>(), 40);
        assert_eq!(std::mem::size_of::<Op<'static, f32>>(), 16);
        assert!(std::mem::size_of::<Node<'static, f64>>() <= 48);
    }
}
