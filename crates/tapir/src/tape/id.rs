//! [`NodeId`]: a typed, branded index into one scope's tape, and [`NodeMap`], a side table
//! keyed by it (in the manner of cranelift-entity's `SecondaryMap`, whose ids anyone can mint;
//! ours only the tape can).

use std::fmt;
use std::marker::PhantomData;
use std::ops::{Index, IndexMut};

/// A node on the tape of the scope branded `'s`.
///
/// Only the tape mints ids (there is no public constructor), and the brand is invariant,
/// so an id from one scope cannot be used in another.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodeId<'s> {
    raw: u32,
    // Invariant in 's: an id from one scope cannot be used in another.
    _brand: PhantomData<fn(&'s ()) -> &'s ()>,
}

impl<'s> NodeId<'s> {
    /// The id handed out after a failed op; never indexes the tape (the scope holds an
    /// error whenever one exists, and every op checks that first).
    pub(crate) const POISON: NodeId<'s> = NodeId { raw: u32::MAX, _brand: PhantomData };

    /// Mints the id of the node at `index`. Only the tape calls this (`tape/tape.rs`: when
    /// it appends a node, when it walks its nodes, when it decodes ids it stored itself), and
    /// it checks `index < u32::MAX` first.
    pub(super) fn new(raw: u32) -> NodeId<'s> {
        NodeId { raw, _brand: PhantomData }
    }

    /// Position on the tape.
    pub fn index(self) -> usize {
        self.raw as usize
    }

    /// The id as stored in the tape's payload list (see `Tape::stored_ids`).
    pub(crate) fn raw(self) -> u32 {
        self.raw
    }
}

/// Per-node data of the scope `'s`, indexed by [`NodeId`]. It deliberately does not deref to
/// a slice: a raw position cannot index it, only an id the tape minted.
#[derive(Debug)]
pub(crate) struct NodeMap<'s, V> {
    items: Vec<V>,
    _brand: PhantomData<fn(&'s ()) -> &'s ()>,
}

impl<'s, V> NodeMap<'s, V> {
    /// A map over `items`, an emptied vector whose capacity is reused (see `tape::recycle`).
    pub(crate) fn from_vec(items: Vec<V>) -> NodeMap<'s, V> {
        NodeMap { items, _brand: PhantomData }
    }

    /// The vector back, for reuse by the next scope.
    pub(crate) fn into_vec(self) -> Vec<V> {
        self.items
    }

    /// Grows or shrinks to `len` entries, new ones made by `fill`.
    pub(crate) fn resize_with(&mut self, len: usize, fill: impl FnMut() -> V) {
        self.items.resize_with(len, fill);
    }

    /// The entry of `id`, or `None` if the map does not reach it.
    pub(crate) fn get(&self, id: NodeId<'s>) -> Option<&V> {
        self.items.get(id.index())
    }

    /// Entries in id order.
    pub(crate) fn values(&self) -> impl Iterator<Item = &V> {
        self.items.iter()
    }

    /// Moves every entry through `f` into a map of another value type, keeping the buffer
    /// when the layouts agree. Inlined, so that a map between layout-equal types (the
    /// gradient table after a pass: `&mut [T]` to `&[T]`) compiles to nothing; called out
    /// of line, its loop cost shape-`[1]` backward 5 instructions per node (callgrind).
    #[inline(always)]
    pub(crate) fn map<W>(self, f: impl FnMut(V) -> W) -> NodeMap<'s, W> {
        NodeMap::from_vec(self.items.into_iter().map(f).collect())
    }

    /// The entry of `later` and a mutable borrow of the entry of `earlier`, which must come
    /// before it on the tape (an op's output always comes after its inputs).
    pub(crate) fn pair_mut(&mut self, later: NodeId<'s>, earlier: NodeId<'s>) -> (&V, &mut V) {
        let (lo, hi) = self.items.split_at_mut(later.index());
        (&hi[0], &mut lo[earlier.index()])
    }
}

impl<V> Default for NodeMap<'_, V> {
    fn default() -> Self {
        NodeMap::from_vec(Vec::new())
    }
}

impl<'s, V> Index<NodeId<'s>> for NodeMap<'s, V> {
    type Output = V;
    fn index(&self, id: NodeId<'s>) -> &V {
        &self.items[id.index()]
    }
}

impl<'s, V> IndexMut<NodeId<'s>> for NodeMap<'s, V> {
    fn index_mut(&mut self, id: NodeId<'s>) -> &mut V {
        &mut self.items[id.index()]
    }
}

impl fmt::Debug for NodeId<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if *self == NodeId::POISON {
            f.write_str("%poison")
        } else {
            write!(f, "%{}", self.raw)
        }
    }
}
