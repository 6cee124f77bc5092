//! In-place recomputation of a checkpointed block: which of its `linear` outputs the next
//! elementwise op may overwrite (see [`InPlace`](crate::tape::in_place::InPlace)).

use crate::dtype::Float;
use crate::record::handles::State;
use crate::tape::id::NodeId;
use crate::tape::op::Op;

/// In place: the positions of the block's nodes (on its nested tape) whose value the
/// recomputation lets the next node overwrite. A `linear` output qualifies if the next
/// node is an elementwise op whose backward reads only its output (`relu`, `tanh`, ...;
/// [`UnaryFn::reads_only_output`](crate::UnaryFn)), no other node reads it, and it is not
/// the block's output. The block's forward must also have read no values (the caller
/// checks), since a value the block reads could be one of them. Its backward never reads
/// a `linear` output, so the recomputed block keeps one buffer where it had two.
/// Whether a forward with speculative in-place ops computed what it would have without
/// them: no value it overwrote is the block's output or was read by a later node (a
/// caller's reads recompute the value; see `Var::settle`). A block that failed after
/// overwriting a value runs again too, since the failure may come from a value read
/// wrongly.
pub(super) fn speculated_safely<T: Float>(tape: &State<'_, T>, out: NodeId<'_>) -> bool {
    let taken = tape.in_place.taken();
    taken.is_empty() || (tape.error.is_none() && taken.iter().all(|&k| k != out.raw() && sole_reader(tape, k)))
}

/// Whether no node after `k + 1` reads node `k`.
fn sole_reader<T: Float>(tape: &State<'_, T>, k: u32) -> bool {
    (k + 2..tape.nodes.len() as u32).all(|j| {
        let mut reads = false;
        tape.for_each_input(&tape.nodes[j as usize].op, |i| reads |= i.raw() == k);
        !reads
    })
}

pub(super) fn in_place_positions<'t, 'c, T: Float>(
    tape: &'t State<'c, T>,
    out: NodeId<'c>,
) -> impl Iterator<Item = u32> + use<'t, 'c, T> {
    let producer = move |k: u32| {
        let next = tape.nodes.get(k as usize + 1)?;
        let reader = matches!(next.op, Op::Unary { f, x, .. } if x.raw() == k && f.reads_only_output());
        (reader && k != out.raw() && matches!(tape.nodes[k as usize].op, Op::Linear { .. })).then_some(k)
    };
    (0..tape.nodes.len() as u32).filter_map(producer).filter(move |&k| sole_reader(tape, k))
}
