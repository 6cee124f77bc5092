//! Gradient checkpointing: [`Checkpoint`], recorded with [`Scope::checkpoint`]. This file
//! records a block; `replay.rs` recomputes it for backward and for the recorded
//! derivative; `in_place.rs` decides which of its buffers a recomputation may overwrite.
//!
//! Forward: the block runs on a scope nested in the caller's, which records on the
//! graph's *scratch arena*. Its output is copied into the main arena, the node
//! `Op::Checkpoint { table, first, count }` is recorded, and the scratch arena is reset:
//! of the block, only its inputs (already on the tape) and its output stay.
//!
//! Backward, with `dout = ∂L/∂out`: the block runs again on a fresh nested scope from the
//! same inputs, a backward pass over that nested tape is seeded with `dout` (a
//! vector-Jacobian product, as [`Scope::backward_with`]), the nested leaves' gradients are
//! added into the inputs' gradients on the outer tape, and the scratch arena is reset
//! again. So the scratch arena holds one block at a time, and the main arena never holds
//! a block's intermediates.
//!
//! Parameters: a block reads parameters through the nested scope (`s.param(store, id)`).
//! After the block's forward, every parameter node of the nested tape is copied to the
//! outer tape as a parameter node of its own (same store identity and index, same shape,
//! an empty value: nothing reads it) and becomes an extra input of the checkpoint node,
//! so that backward routes the parameters' gradients to them and
//! [`Scope::backward_into`] finds them like any other parameter. The recomputation must
//! read the same parameters in the same order; it is checked.
//!
//! Storage: `table` indexes the tape's side table of [`CheckpointEntry`]s, each a
//! borrowed `&'s dyn Checkpoint<T>` (the caller lends it for `'g`), the caller's `part`
//! number, the count of explicit inputs and the caller's location. As for custom ops,
//! nothing is boxed and the table is recycled between scopes.
//!
//! Nesting: a checkpoint recorded inside a checkpointed block runs inline (its block is
//! simply part of the outer block, recomputed with it), since the scratch arena holds the
//! outer block meanwhile. Only the outermost level saves memory.
//!
//! Recorded derivative ([`Scope::grad`]): see [`grad`]; the block is replayed on the
//! caller's scope, reading the checkpoint's own parameter nodes ([`replayed_param`]).

mod in_place;
pub(crate) mod replay;

use std::panic::Location;

use crate::dtype::Float;
use crate::engine::nest::{nested, CollectSmall};
use crate::error::{Error, Loc};
use crate::record::core::take_held;
use crate::record::handles::{Checkpoint, CheckpointEntry, Scope, Var};
use crate::tape::op::{Op, OpKind};
use in_place::{in_place_positions, speculated_safely};
use replay::{replay, replayed_param, run_block};

impl<'s, 'g: 's, T: Float> Scope<'s, 'g, T> {
    /// Records `block` on `inputs` as one checkpointed node: the block's intermediate
    /// values are freed as soon as its forward returns and recomputed during backward (see
    /// [`Checkpoint`]). The gradients are those of the block recorded directly.
    ///
    /// `block` is borrowed for `'g`: it must outlive the scope, because backward calls it
    /// again. A block made inside the scope cannot be recorded:
    ///
    /// ```compile_fail
    /// # use tapir::{Checkpoint, Graph, Scope, Tensor, Var};
    /// struct Scale(f32);
    /// impl Checkpoint<f32> for Scale {
    ///     fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], _: u32) -> Var<'c, f32> {
    ///         x[0].mul_scalar(self.0)
    ///     }
    /// }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let block = Scale(2.0); // made in the scope: does not live for 'g
    ///     let _ = s.checkpoint(&block, &[s.leaf(&x)]);
    /// });
    /// ```
    ///
    /// and its twin, with the block made before the scope, compiles:
    ///
    /// ```
    /// # use tapir::{Checkpoint, Graph, Scope, Tensor, Var};
    /// # struct Scale(f32);
    /// # impl Checkpoint<f32> for Scale {
    /// #     fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], _: u32) -> Var<'c, f32> {
    /// #         x[0].mul_scalar(self.0)
    /// #     }
    /// # }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let block = Scale(2.0);
    /// let mut g = Graph::<f32>::new();
    /// let y = g.scope(|s| s.checkpoint(&block, &[s.leaf(&x)]).to_tensor()).unwrap();
    /// assert_eq!(y.data(), [2.0, 2.0]);
    /// ```
    ///
    /// Nor can a block that holds the scope, even in leaked memory, which lives as long as
    /// the scope's brand `'s` but not `'g` (the scope is invariant in `'g`); such a block
    /// could record on the scope while backward walks its tape:
    ///
    /// ```compile_fail
    /// # use tapir::{Checkpoint, Graph, Scope, Tensor, Var};
    /// struct Holds<'s, 'g>(Option<&'s Scope<'s, 'g, f32>>);
    /// impl Checkpoint<f32> for Holds<'_, '_> {
    ///     fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], _: u32) -> Var<'c, f32> {
    ///         x[0]
    ///     }
    /// }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let block: &Holds = Box::leak(Box::new(Holds(Some(s))));
    ///     let _ = s.checkpoint(block, &[s.leaf(&x)]);
    /// });
    /// ```
    ///
    /// while the same leaked block holding no scope compiles:
    ///
    /// ```
    /// # use tapir::{Checkpoint, Graph, Scope, Tensor, Var};
    /// # struct Holds<'s, 'g>(Option<&'s Scope<'s, 'g, f32>>);
    /// # impl Checkpoint<f32> for Holds<'_, '_> {
    /// #     fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f32>, x: &[Var<'c, f32>], _: u32) -> Var<'c, f32> {
    /// #         x[0]
    /// #     }
    /// # }
    /// let x = Tensor::<f32>::ones(&[2]).unwrap();
    /// let mut g = Graph::<f32>::new();
    /// g.scope(|s| {
    ///     let block: &Holds = Box::leak(Box::new(Holds(None)));
    ///     let _ = s.checkpoint(block, &[s.leaf(&x)]);
    /// });
    /// ```
    ///
    /// Inside a checkpointed block, a checkpoint runs inline (its ops become part of the
    /// enclosing block). [`Scope::grad`] differentiates through a checkpoint to any order:
    /// its recorded derivative runs the block once more on this scope (see
    /// `docs/design.md`, "Second order"), so a second derivative keeps the block's graph
    /// in the main arena until the scope ends.
    ///
    /// # Errors
    /// Recorded as the scope's error: any error the block records (as it names it); the
    /// arena's errors. In backward, the same, and [`Error::InvalidArgument`] naming
    /// `checkpoint` if the recomputation records a different output shape or different
    /// parameters than the forward did.
    #[track_caller]
    pub fn checkpoint(&'s self, block: &'g dyn Checkpoint<T>, inputs: &[Var<'s, T>]) -> Var<'s, T> {
        self.checkpoint_at(block, 0, inputs, Location::caller())
    }

    /// As [`checkpoint`](Scope::checkpoint), passing `part` to [`Checkpoint::forward`].
    #[track_caller]
    pub fn checkpoint_part(&'s self, block: &'g dyn Checkpoint<T>, part: u32, inputs: &[Var<'s, T>]) -> Var<'s, T> {
        self.checkpoint_at(block, part, inputs, Location::caller())
    }

    fn checkpoint_at(
        &'s self,
        block: &'g dyn Checkpoint<T>,
        part: u32,
        inputs: &[Var<'s, T>],
        location: Loc,
    ) -> Var<'s, T> {
        let nest = {
            let tape = self.core.tape.borrow();
            if tape.error.is_some() {
                return self.core.poison();
            }
            tape.nest
        };
        let Some(nest) = nest else {
            // Nested in a checkpointed block: the scratch arena is busy with that block,
            // which this one simply becomes part of.
            return run_block(block, self, inputs, part, location).unwrap_or_else(|e| self.core.fail(e));
        };
        let count = match u32::try_from(inputs.len()) {
            Ok(n) => n,
            Err(_) => {
                return self.core.fail(Error::InvalidArgument {
                    op: "checkpoint",
                    detail: format!("takes at most {} inputs, got {}", u32::MAX, inputs.len()),
                    location,
                })
            }
        };
        let leaves = {
            let tape = self.core.tape.borrow();
            inputs.iter().map(|x| tape.node(x.id)).map(|n| (n.requires_grad, n.shape, n.value)).collect_small()
        };
        let block_g = block;
        let block: &'s dyn Checkpoint<T> = block;
        let (step, draws) = {
            let tape = self.core.tape.borrow();
            (tape.step, tape.draws)
        };
        // The forward runs with speculative in-place ops (see [`in_place_positions`]), and
        // again without them if an overwritten value turns out to have had another reader.
        let attempt = |speculate: bool| {
            nested(nest, leaves.iter().copied(), |inner, vars| {
                replay(inner, step, draws);
                inner.core.tape.borrow_mut().in_place.speculate = speculate;
                let y = match run_block(block, inner, vars, part, location) {
                    Ok(y) => y,
                    Err(e) => return Some(Err(e)),
                };
                take_held(&mut inner.core.tape.borrow_mut(), None);
                let tape = inner.core.tape.borrow();
                if !speculated_safely(&tape, y.id) {
                    return None;
                }
                self.core.tape.borrow_mut().draws = tape.draws;
                if let Some(e) = &tape.error {
                    return Some(Err(e.clone()));
                }
                let node = tape.node(y.id);
                // The block's parameters become parameter nodes of the outer tape, in order.
                let mut params = Vec::new().into_iter().collect_small();
                for n in tape.nodes.iter().map(|n| tape.view(n)) {
                    if let Op::Param(at) = n.op {
                        let payload =
                            [tape.extra[at as usize], tape.extra[at as usize + 1], tape.extra[at as usize + 2]];
                        let p = replayed_param(&self.core, payload, None, location).unwrap_or_else(|| {
                            self.core.record_at(OpKind::Param.name(), location, |r| {
                                Ok((Op::Param(r.extra(payload)?), n.shape, &[]))
                            })
                        });
                        params.push(p.id);
                    }
                }
                let out = self.core.record_at(OpKind::Checkpoint.name(), location, |r| {
                    let value = r.alloc_iter(node.value.iter().copied())?;
                    // Each call appends right after the previous one, so the list stays contiguous.
                    let mut in_place = (r.tape.extra.len() as u32, 0);
                    if !nest.anomaly && !tape.values_read.get() {
                        for pos in in_place_positions(&tape, y.id) {
                            r.extra([pos])?;
                            in_place.1 += 1;
                        }
                    }
                    let first = r.store_ids(inputs.iter().map(|x| x.id))?;
                    // Each call appends right after the previous one, so the list stays contiguous.
                    for &p in params.iter() {
                        r.store_ids([p])?;
                    }
                    let table = u32::try_from(r.tape.checkpoints.len()).map_err(|_| Error::TapeFull {
                        op: r.op,
                        len: r.tape.checkpoints.len(),
                        location,
                    })?;
                    r.tape.checkpoints.push(CheckpointEntry { block, part, inputs: count, draws, in_place, location });
                    // Same index: the recorded derivative finds the block for `'g` there.
                    self.blocks.borrow_mut().push(block_g);
                    let n = u32::try_from(params.len).expect("fewer parameter nodes than tape nodes");
                    Ok((Op::Checkpoint { table, first, count: count + n }, node.shape, value))
                });
                Some(Ok(out))
            })
        };
        let recorded = attempt(!nest.anomaly).or_else(|| attempt(false));
        match recorded {
            Some(Ok(out)) => out,
            Some(Err(e)) => self.core.fail(e),
            None => unreachable!("a forward without in-place ops is never run again"),
        }
    }
}
