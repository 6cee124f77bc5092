//! How a scope's [`State`] (declared with the handles) is made from and returned to the
//! graph's [`Spare`] vectors, and what it reports. The state is the [`Tape`] (nodes, shapes,
//! payloads) plus the side tables of custom ops and checkpoints, the scope's error and
//! flags, and the buffers of backward passes, all kept with their capacity between scopes
//! ([`Spare`]). Also the small types the engine's passes share with the recording layer:
//! [`Seed`], [`Lent`], [`Grads`] and the checkpoints' [`Scratch`].

use std::cell::{Cell, RefCell};

use faer::Par;

use crate::dtype::Float;
use crate::error::{Loc, Result};
use crate::record::custom_op::CustomScratch;
use crate::record::handles::{CheckpointEntry, CustomEntry, Lent, Nest, Slot, State, Tangents};
use crate::shape::Shape;
use crate::storage::Arena;
use crate::tape::id::{NodeId, NodeMap};
use crate::tape::in_place::InPlace;
use crate::tape::op::Op;
use crate::tape::tape::{recycle, Node, Tape};

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

impl<'s, T: Copy + 'static> State<'s, T> {
    pub(crate) fn from_spare(spare: &mut Spare<T>) -> State<'s, T> {
        State {
            tape: Tape {
                nodes: recycle(std::mem::take(&mut spare.nodes)),
                shapes: std::mem::take(&mut spare.shapes),
                extra: std::mem::take(&mut spare.extra),
                locs: std::mem::take(&mut spare.locs),
            },
            custom: recycle(std::mem::take(&mut spare.custom)),
            custom_scratch: std::mem::take(&mut spare.custom_scratch).recycle(),
            checkpoints: recycle(std::mem::take(&mut spare.checkpoints)),
            nest: None,
            profile: None,
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
            values_read: Cell::new(false),
            in_place: InPlace::with_capacity_of(std::mem::take(&mut spare.in_place)),
            tangents: Tangents::default(),
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

    /// The name of `op` in errors and reports: a custom op's own, else its kind's.
    pub(crate) fn name_of(&self, op: &Op<'s, T>) -> &'static str {
        match *op {
            Op::Custom { table, .. } => self.custom[table as usize].name,
            _ => op.name(),
        }
    }

    /// Bytes of tape beyond the values: nodes, the shape table, index payloads and the
    /// custom-op side table.
    pub(crate) fn bytes(&self) -> usize {
        self.tape.bytes()
            + self.custom.len() * std::mem::size_of::<CustomEntry<'_, T>>()
            + self.checkpoints.len() * std::mem::size_of::<CheckpointEntry<'_, T>>()
    }
}

/// What a backward pass starts from: `∂L/∂out` of the node it starts at.
#[derive(Clone, Copy)]
pub(crate) enum Seed<'a, T> {
    /// `1` for a one-element loss.
    One,
    /// The caller's gradient, of the output's shape.
    Given(&'a [T]),
}

/// A releasing backward pass seeded at `start`, with nothing lent: what a checkpoint's
/// recomputation runs over its nested tape. `engine::checkpoint::replay::backward` receives
/// it as an argument from the walk (`engine::backward`), so the recursion into a nested
/// pass imports neither walk.
pub(crate) type NestedPass<T> =
    for<'c, 'x> fn(&'x mut State<'c, T>, &'c Arena, Par, (NodeId<'c>, Seed<'x, T>), Loc, bool) -> Result<()>;

/// The gradient map of one pass, before it is handed back to the tape.
pub(crate) type Grads<'s, T> = NodeMap<'s, Option<&'s mut [T]>>;

/// The scratch arena and the tape buffers that checkpointed blocks record on, kept by the
/// graph between scopes like the main ones.
pub(crate) struct Scratch<T: 'static> {
    pub(crate) arena: RefCell<Arena>,
    pub(crate) spare: RefCell<Spare<T>>,
}

impl<T: Float> Default for Scratch<T> {
    fn default() -> Self {
        Scratch { arena: RefCell::new(Arena::new()), spare: RefCell::default() }
    }
}

impl<T> std::fmt::Debug for Scratch<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scratch").field("arena", &self.arena).finish_non_exhaustive()
    }
}

impl<'s> Nest<'s> {
    pub(crate) fn scratch<T: Float>(self) -> &'s Scratch<T> {
        self.scratch.downcast_ref().expect("a scope's scratch arena has the scope's element type")
    }
}
