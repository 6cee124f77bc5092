//! The tape: nodes appended in creation order, so it is already topologically sorted.
//!
//! A node is `Copy` (op tag, input ids, shape, a slice of its value in the arena), so
//! clearing the tape runs no destructor and costs O(1). The vectors themselves are kept
//! by the [`Graph`](crate::Graph) between scopes and relabelled to each new scope's
//! lifetime without reallocating (see [`recycle`]).

use crate::error::{Error, Loc, Result};
use crate::graph::NodeId;
use crate::ops::Op;
use crate::shape::Shape;

/// One recorded node. 64 bytes for `f32`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Node<'s, T> {
    /// The value, in the arena (or borrowed from a parameter or input tensor).
    pub value: &'s [T],
    pub op: Op<'s, T>,
    pub shape: Shape,
    /// Whether some gradient-requesting leaf reaches this node.
    pub requires_grad: bool,
}

/// The mutable state of one scope.
#[derive(Debug)]
pub(crate) struct Tape<'s, T> {
    pub nodes: Vec<Node<'s, T>>,
    /// Variable-length payloads: concat inputs, indices, labels.
    pub extra: Vec<u32>,
    /// Where each node was recorded; filled only while anomaly detection is on.
    pub locs: Vec<Loc>,
    /// Gradients after a backward pass, by node index (`None`: none reached the node).
    pub grads: Vec<Option<&'s [T]>>,
    /// The first error of the scope; every later op returns a poisoned handle.
    pub error: Option<Error>,
    /// Set by a backward pass that did not retain the tape.
    pub consumed: bool,
    /// Depth of nested `no_grad` regions.
    pub no_grad: u32,
}

/// The tape's vectors between scopes, with their capacity.
#[derive(Debug, Default)]
pub(crate) struct Spare<T: 'static> {
    nodes: Vec<Node<'static, T>>,
    extra: Vec<u32>,
    locs: Vec<Loc>,
    grads: Vec<Option<&'static [T]>>,
}

/// Empties `v` and gives it back with another element type of the same layout (here: the
/// same type under another lifetime). The standard library collects a `vec::IntoIter`
/// mapped to a same-layout type in place, so the buffer and its capacity are kept and
/// nothing is allocated; the zero-allocation test checks this.
pub(crate) fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!("a cleared vector yields no element")).collect()
}

impl<'s, T: 'static> Tape<'s, T> {
    pub(crate) fn from_spare(spare: &mut Spare<T>) -> Tape<'s, T> {
        Tape {
            nodes: recycle(std::mem::take(&mut spare.nodes)),
            extra: std::mem::take(&mut spare.extra),
            locs: std::mem::take(&mut spare.locs),
            grads: recycle(std::mem::take(&mut spare.grads)),
            error: None,
            consumed: false,
            no_grad: 0,
        }
    }

    /// Moves the vectors (emptied, with their capacity) back to `spare`.
    pub(crate) fn drain_into(&mut self, spare: &mut Spare<T>) {
        spare.nodes = recycle(std::mem::take(&mut self.nodes));
        spare.grads = recycle(std::mem::take(&mut self.grads));
        spare.extra = std::mem::take(&mut self.extra);
        spare.extra.clear();
        spare.locs = std::mem::take(&mut self.locs);
        spare.locs.clear();
    }

    /// Appends a node and mints its id.
    pub(crate) fn push(&mut self, node: Node<'s, T>, op: &'static str, location: Loc) -> Result<NodeId<'s>> {
        let len = self.nodes.len();
        // u32::MAX itself is reserved for the poisoned handle.
        let raw = u32::try_from(len).ok().filter(|&r| r < u32::MAX).ok_or(Error::TapeFull { op, len, location })?;
        self.nodes.push(node);
        Ok(NodeId::new(raw))
    }

    pub(crate) fn node(&self, id: NodeId<'s>) -> &Node<'s, T> {
        &self.nodes[id.index()]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nodes_stay_small() {
        // Value slice (16) + op (16 for f32: tag, an id, two scalars) + shape (28) + flag.
        assert_eq!(std::mem::size_of::<Node<'static, f32>>(), 64);
        assert_eq!(std::mem::size_of::<Op<'static, f32>>(), 16);
        assert!(std::mem::size_of::<Node<'static, f64>>() <= 72);
    }
}
