//! The tape: nodes appended in creation order, so it is already topologically sorted.
//!
//! A node is `Copy` (op tag, input ids, an index into the tape's shape table, a slice of
//! its value in the arena), so clearing the tape runs no destructor and costs O(1). Shapes
//! are interned: most ops keep an input's shape, so a node reuses that entry, and a node
//! stays at 40 bytes for `f32` instead of carrying 28 bytes of dimensions. The vectors themselves are kept
//! by the [`Graph`](crate::Graph) between scopes and relabelled to each new scope's
//! lifetime without reallocating (see [`recycle`]).

use crate::error::{Error, Loc, Result};
use crate::graph::backward::Lent;
use crate::graph::id::NodeMap;
use crate::graph::NodeId;
use crate::ops::checkpoint::{CheckpointEntry, Nest};
use crate::ops::custom::{CustomEntry, CustomScratch};
use crate::ops::{Inputs, Op};
use crate::shape::Shape;

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

/// The mutable state of one scope.
#[derive(Debug)]
pub(crate) struct Tape<'s, T> {
    pub nodes: Vec<Node<'s, T>>,
    /// The distinct shapes of the nodes, in order of first use.
    pub shapes: Vec<Shape>,
    /// Variable-length payloads: concat inputs, indices, labels.
    pub extra: Vec<u32>,
    /// The custom-op side table: `Op::Custom { table, .. }` is row `table`.
    pub custom: Vec<CustomEntry<'s, T>>,
    /// The lists custom ops' callbacks read and write, reused from op to op.
    pub custom_scratch: CustomScratch<'s, T>,
    /// The checkpoint side table: `Op::Checkpoint { table, .. }` is row `table`.
    pub checkpoints: Vec<CheckpointEntry<'s, T>>,
    /// Where checkpointed blocks record (the graph's scratch arena); `None` on a scope
    /// nested in a checkpoint, where a checkpoint runs inline.
    pub nest: Option<Nest<'s>>,
    /// Where each node was recorded; filled only while anomaly detection is on.
    pub locs: Vec<Loc>,
    /// Gradients after a backward pass (`None`: none reached the node).
    pub grads: NodeMap<'s, Option<&'s [T]>>,
    /// The side table of [`Scope::grad`](crate::Scope::grad): per node, whether the walk
    /// differentiates through it and its gradient handle so far. Kept between calls and
    /// scopes, so that a warmed-up call allocates nothing.
    pub slots: NodeMap<'s, Slot<'s>>,
    /// The first error of the scope; every later op returns a poisoned handle.
    pub error: Option<Error>,
    /// Set by a backward pass that did not retain the tape.
    pub consumed: bool,
    /// Depth of nested `no_grad` regions.
    pub no_grad: u32,
    /// The graph's scope count when this scope began, and the next draw index within it
    /// (see `Scope::next_draw`).
    pub step: u64,
    pub draws: u64,
    /// While a checkpointed block is recomputed on this tape for its recorded derivative,
    /// the stored-id range `(next, end)` of the checkpoint node's parameter inputs: the
    /// block's parameter reads take these nodes in order instead of recording new ones
    /// (see `ops/checkpoint.rs`).
    pub replay: Option<(u32, u32)>,
    /// The addresses of the caller's gradient buffer while `backward_into` writes
    /// parameters' gradients straight into it (empty otherwise): a gradient in this range
    /// is not the arena's (see `Scope::memory_report`).
    pub lent: std::ops::Range<usize>,
    /// `backward_into`'s list of the buffer's slots that several nodes read, by slot
    /// index, kept for its capacity.
    pub shared_grads: Vec<(usize, &'s mut [T])>,
    /// A releasing pass's gradient buffers of nodes whose backward has run, kept for its
    /// capacity between passes (see `backward::run_with`).
    pub spare_grads: Vec<&'s mut [T]>,
    /// During `backward_into`'s pass: the buffer's slots lent to single parameter nodes,
    /// sorted by node (see `backward::run_with`). Empty otherwise, kept for its capacity.
    pub lent_grads: Vec<Lent<'s, T>>,
    /// Bytes of gradient buffers that the last releasing pass gave up and nothing reused.
    pub released_bytes: usize,
    /// Set when the caller reads or aliases a value (`Var::value`, `detach`, ...): a
    /// checkpointed block that does so is recomputed without in-place ops.
    pub values_read: std::cell::Cell<bool>,
    /// In-place ops of a checkpointed block (see [`InPlace`]).
    pub in_place: InPlace<'s, T>,
    /// Set while the scope has an error or `in_place` holds a buffer back: recording
    /// tests this one flag and takes its slow path (`Core::record_reading`).
    pub slow: bool,
}

/// In-place ops of a checkpointed block: a producer (a `linear`) keeps its output buffer
/// back as `pending` and records an empty value; the elementwise op that reads it next
/// (one whose backward reads only its output) takes the buffer, computes in place and
/// makes it both nodes' value. Anything else recorded first gives the buffer back to its
/// producer (see `Core::record_at`). So a block holds one buffer where it had two.
///
/// Two modes (see `ops/checkpoint.rs`, "In place"):
/// - *speculative*, in the block's forward: every `linear` is held back. Whether the
///   overwritten value had another reader shows only after the block: then the forward
///   runs again without in-place ops. A caller's read of an overwritten value computes it
///   again (`ops::matmul::relinear`).
/// - *listed*, in the recomputation for backward: only the nodes that the forward showed
///   safe (`at`). A buffer given back ends in-place work for the block, and a caller's
///   read of an overwritten value is an error: the block did not record as it did.
#[derive(Debug, Default)]
pub(crate) struct InPlace<'s, T> {
    /// Listed: the node positions to overwrite, ascending. Speculative: the positions
    /// overwritten so far.
    pub at: Vec<u32>,
    /// How many entries of `at` were overwritten: always the first ones.
    taken: usize,
    /// Speculative mode.
    pub speculate: bool,
    /// Set once a listed buffer went back to its producer.
    stopped: bool,
    /// A producer's output held back for its reader: the producer's position and buffer.
    pub pending: Option<(u32, &'s mut [T])>,
}

impl<'s, T> InPlace<'s, T> {
    /// Whether the output of the node at `pos`, the next one recorded, is held back.
    #[inline]
    pub(crate) fn listed(&self, pos: u32) -> bool {
        self.pending.is_none() && (self.speculate || (!self.stopped && self.at.get(self.taken) == Some(&pos)))
    }

    /// Takes the held-back buffer if it is the output of node `pos`.
    pub(crate) fn take(&mut self, pos: u32) -> Option<&'s mut [T]> {
        match self.pending.take() {
            Some((p, buf)) if p == pos => {
                if self.speculate {
                    self.at.push(pos);
                }
                self.taken += 1;
                Some(buf)
            }
            other => {
                self.pending = other;
                None
            }
        }
    }

    /// Gives a held-back buffer back: its producer's position and the buffer. In listed
    /// mode, in-place work ends for the block.
    pub(crate) fn give_back(&mut self) -> Option<(u32, &'s mut [T])> {
        let pending = self.pending.take();
        self.stopped |= pending.is_some() && !self.speculate;
        pending
    }

    /// Whether node `pos`'s output is held back for an in-place reader.
    pub(crate) fn holds(&self, pos: u32) -> bool {
        matches!(self.pending, Some((p, _)) if p == pos)
    }

    /// Whether node `pos`'s value was overwritten in place by its reader.
    pub(crate) fn overwritten(&self, pos: u32) -> bool {
        self.at[..self.taken].binary_search(&pos).is_ok()
    }

    /// The positions overwritten so far.
    pub(crate) fn taken(&self) -> &[u32] {
        &self.at[..self.taken]
    }

    /// Node `pos`'s value, overwritten in speculative mode, was computed again.
    pub(crate) fn restored(&mut self, pos: u32) {
        if let Ok(i) = self.at[..self.taken].binary_search(&pos) {
            self.at.remove(i);
            self.taken -= 1;
        }
    }
}

/// The tape's vectors between scopes, with their capacity.
#[derive(Debug, Default)]
pub(crate) struct Spare<T: 'static> {
    nodes: Vec<Node<'static, T>>,
    shapes: Vec<Shape>,
    extra: Vec<u32>,
    custom: Vec<CustomEntry<'static, T>>,
    custom_scratch: CustomScratch<'static, T>,
    checkpoints: Vec<CheckpointEntry<'static, T>>,
    locs: Vec<Loc>,
    grads: Vec<Option<&'static [T]>>,
    slots: Vec<Slot<'static>>,
    shared_grads: Vec<(usize, &'static mut [T])>,
    spare_grads: Vec<&'static mut [T]>,
    lent_grads: Vec<Lent<'static, T>>,
    in_place: Vec<u32>,
}

/// One node's entry in the side table of a recorded gradient (see `graph/grad.rs`).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Slot<'s> {
    /// Whether the node requires a gradient and depends on one of the inputs asked for.
    pub needed: bool,
    /// The gradient handle accumulated so far (`None`: no contribution yet).
    pub grad: Option<NodeId<'s>>,
    /// Whether `grad` is still to be broadcast to the node's shape: the derivative of a
    /// sum, kept small until something needs it at full size (see `GradCtx::add_broadcast`).
    pub bcast: bool,
}

/// Empties `v` and gives it back with another element type of the same layout (here: the
/// same type under another lifetime). The standard library collects a `vec::IntoIter`
/// mapped to a same-layout type in place, so the buffer and its capacity are kept and
/// nothing is allocated; the zero-allocation test checks this.
pub(crate) fn recycle<A, B>(mut v: Vec<A>) -> Vec<B> {
    v.clear();
    v.into_iter().map(|_| unreachable!("a cleared vector yields no element")).collect()
}

impl<'s, T: Copy + 'static> Tape<'s, T> {
    pub(crate) fn from_spare(spare: &mut Spare<T>) -> Tape<'s, T> {
        Tape {
            nodes: recycle(std::mem::take(&mut spare.nodes)),
            shapes: std::mem::take(&mut spare.shapes),
            extra: std::mem::take(&mut spare.extra),
            custom: recycle(std::mem::take(&mut spare.custom)),
            custom_scratch: std::mem::take(&mut spare.custom_scratch).recycle(),
            checkpoints: recycle(std::mem::take(&mut spare.checkpoints)),
            nest: None,
            locs: std::mem::take(&mut spare.locs),
            grads: NodeMap::from_vec(recycle(std::mem::take(&mut spare.grads))),
            slots: NodeMap::from_vec(recycle(std::mem::take(&mut spare.slots))),
            error: None,
            consumed: false,
            no_grad: 0,
            step: 0,
            draws: 0,
            replay: None,
            lent: 0..0,
            shared_grads: recycle(std::mem::take(&mut spare.shared_grads)),
            spare_grads: recycle(std::mem::take(&mut spare.spare_grads)),
            lent_grads: recycle(std::mem::take(&mut spare.lent_grads)),
            released_bytes: 0,
            values_read: std::cell::Cell::new(false),
            in_place: InPlace {
                at: std::mem::take(&mut spare.in_place),
                taken: 0,
                speculate: false,
                stopped: false,
                pending: None,
            },
            slow: false,
        }
    }

    /// Gives the retained vectors' memory back (after a release of the arena, or on
    /// request): they are empty between scopes.
    pub(crate) fn shrink(spare: &mut Spare<T>) {
        spare.nodes = Vec::new();
        spare.shapes = Vec::new();
        spare.extra = Vec::new();
        spare.locs = Vec::new();
        spare.grads = Vec::new();
        spare.checkpoints = Vec::new();
        spare.slots = Vec::new();
        spare.shared_grads = Vec::new();
        spare.spare_grads = Vec::new();
        spare.lent_grads = Vec::new();
        spare.in_place = Vec::new();
    }

    /// Moves the vectors (emptied, with their capacity) back to `spare`.
    pub(crate) fn drain_into(&mut self, spare: &mut Spare<T>) {
        spare.nodes = recycle(std::mem::take(&mut self.nodes));
        spare.grads = recycle(std::mem::take(&mut self.grads).into_vec());
        spare.slots = recycle(std::mem::take(&mut self.slots).into_vec());
        spare.shared_grads = recycle(std::mem::take(&mut self.shared_grads));
        spare.spare_grads = recycle(std::mem::take(&mut self.spare_grads));
        spare.lent_grads = recycle(std::mem::take(&mut self.lent_grads));
        spare.shapes = std::mem::take(&mut self.shapes);
        spare.shapes.clear();
        spare.extra = std::mem::take(&mut self.extra);
        spare.extra.clear();
        spare.custom = recycle(std::mem::take(&mut self.custom));
        spare.custom_scratch = std::mem::take(&mut self.custom_scratch).recycle();
        spare.checkpoints = recycle(std::mem::take(&mut self.checkpoints));
        spare.locs = std::mem::take(&mut self.locs);
        spare.locs.clear();
        spare.in_place = std::mem::take(&mut self.in_place.at);
        spare.in_place.clear();
        self.in_place.pending = None;
    }

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
    #[inline]
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

    /// The name of `op` in errors and reports: a custom op's own, else its kind's.
    pub(crate) fn name_of(&self, op: &Op<'s, T>) -> &'static str {
        match *op {
            Op::Custom { table, .. } => self.custom[table as usize].name,
            _ => op.name(),
        }
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

    /// Bytes of tape beyond the values: nodes, the shape table, index payloads and the
    /// custom-op side table.
    pub(crate) fn bytes(&self) -> usize {
        self.nodes.len() * std::mem::size_of::<Node<'_, T>>()
            + self.shapes.len() * std::mem::size_of::<Shape>()
            + self.extra.len() * 4
            + self.custom.len() * std::mem::size_of::<CustomEntry<'_, T>>()
            + self.checkpoints.len() * std::mem::size_of::<CheckpointEntry<'_, T>>()
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
