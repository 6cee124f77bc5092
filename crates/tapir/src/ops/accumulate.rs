//! How recorded derivatives accumulate: [`GradCtx`]'s `add`, `add_broadcast` and
//! `add_reduced`, and [`sum_to`]. They record ops (`+`, broadcasts, sums), so they belong
//! with the rules, which call them; the walk itself is `engine/grad.rs`.

use crate::dtype::Float;
use crate::kernels::binary_fn::BinaryFn;
use crate::record::ctx::GradCtx;
use crate::record::handles::Var;
use crate::shape::{Shape, MAX_RANK};
use crate::tape::id::NodeId;
use crate::tape::op::Op;

impl<'s, T: Float> GradCtx<'_, 's, T> {
    /// Adds `g` (of `id`'s shape) to `id`'s gradient.
    #[track_caller]
    pub fn add(&mut self, id: NodeId<'s>, g: Var<'s, T>) {
        let slot = &mut self.slots[id];
        // A pending broadcast (`add_broadcast`) is added by broadcasting: `prev + g` has
        // `g`'s shape, and the broadcast is never materialised.
        slot.grad = Some(match slot.grad {
            None => g.id,
            Some(prev) => (Var { core: self.core, id: prev } + g).id,
        });
        slot.bcast = false;
    }

    /// Adds `g` broadcast to `id`'s shape (NumPy rules) to `id`'s gradient, without
    /// materialising the broadcast: the derivative of a sum. The slot keeps `g` small
    /// until a full-size contribution is added to it (one broadcasting `+`), the walk
    /// reaches `id` (`expand`), or the walk hands it out as an input's gradient.
    #[track_caller]
    pub fn add_broadcast(&mut self, id: NodeId<'s>, g: Var<'s, T>) {
        if g.shape() == self.shape(id) {
            return self.add(id, g);
        }
        let slot = &mut self.slots[id];
        match slot.grad {
            None => (slot.grad, slot.bcast) = (Some(g.id), true),
            // Two pending broadcasts give one of their broadcast shape, which still
            // broadcasts to `id`'s; a pending one and a full one give a full one.
            Some(prev) => slot.grad = Some((Var { core: self.core, id: prev } + g).id),
        }
    }

    /// The gradient `g` of node `id`, pending a broadcast to `id`'s shape, as its
    /// derivative `op.grad` needs it: still small where the derivative broadcasts it
    /// anyway (`a ⊙ b` with `a`, `b` and the output of one shape: `g ⊙ b` has that shape),
    /// else materialised.
    #[track_caller]
    pub(crate) fn expand(&self, op: Op<'s, T>, id: NodeId<'s>, g: Var<'s, T>) -> Var<'s, T> {
        let so = self.shape(id);
        if let Op::Binary { f: BinaryFn::Mul, a, b } = op {
            if self.shape(a) == so && self.shape(b) == so {
                return g;
            }
        }
        g.broadcast_to(&so.to_array()[..so.rank()])
    }

    /// Adds `g`, summed over the dimensions along which `id` was broadcast, to `id`'s gradient.
    #[track_caller]
    pub fn add_reduced(&mut self, id: NodeId<'s>, g: Var<'s, T>) {
        let g = sum_to(g, self.shape(id));
        self.add(id, g);
    }
}

/// `v` summed over the dimensions along which `target` was broadcast to `v`'s shape (NumPy
/// rules: missing leading dimensions and dimensions of size 1), as recorded ops.
#[track_caller]
pub(crate) fn sum_to<'s, T: Float>(v: Var<'s, T>, target: Shape) -> Var<'s, T> {
    let sv = v.shape();
    if sv == target {
        return v;
    }
    let lead = sv.rank().saturating_sub(target.rank());
    let mut axes = [0isize; MAX_RANK];
    let mut n = 0;
    for ax in 0..sv.rank() {
        if ax < lead || (target.dim(ax - lead) == 1 && sv.dim(ax) != 1) {
            axes[n] = ax as isize;
            n += 1;
        }
    }
    let summed = if n == 0 { v } else { v.sum_axes(&axes[..n], true) };
    summed.reshape(&target.to_array()[..target.rank()])
}
