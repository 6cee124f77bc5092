//! [`NodeId`]: a typed, branded index into one scope's tape.

use std::fmt;
use std::marker::PhantomData;

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

    /// Mints the id of the node at `index`; the tape checks `index < u32::MAX` first.
    pub(crate) fn new(raw: u32) -> NodeId<'s> {
        NodeId { raw, _brand: PhantomData }
    }

    /// Position on the tape.
    pub fn index(self) -> usize {
        self.raw as usize
    }

    pub(crate) fn raw(self) -> u32 {
        self.raw
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
