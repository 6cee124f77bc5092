//! Gradient checkpointing: [`Checkpoint`], recorded with [`Scope::checkpoint`].
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

use std::any::Any;
use std::panic::Location;

use faer::Par;

use crate::error::{Error, Loc, Result};
use crate::graph::backward::{self, Seed};
use crate::graph::core::Core;
use crate::graph::{nested, NodeId, Scope, Scratch, Var};
use crate::kernels;
use crate::ops::{Op, OpKind};
use crate::record::{BackwardCtx, GradCtx};
use crate::Float;

/// A block of ops to checkpoint: its intermediate values are not kept for backward but
/// recomputed from its inputs, trading compute for memory (PyTorch's
/// `torch.utils.checkpoint`, JAX's `jax.checkpoint`).
///
/// `forward` records the block on the scope it is given, from `inputs`, and returns its
/// one output. It runs once in the forward pass and once more during backward, so it
/// must be deterministic: the same ops on the same shapes, reading the same parameters in
/// the same order (random draws keyed by something other than a generator it advances;
/// see `tapir_nn::Dropout`). The scope is nested: its handles (`'c`) cannot leave it, and
/// what it borrows must live for `'e`, the block's own borrow, so a block that reads
/// parameters holds a reference to their store.
///
/// A plain function `fn(&Scope, &[Var]) -> Var` is a block (the `part` is ignored):
///
/// ```
/// use tapir::{Graph, Scope, Tensor, Var};
/// # fn main() -> Result<(), tapir::Error> {
/// fn block<'c>(s: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
///     (x[0] * x[0]).exp() + s.scalar(1.0) // y = exp(x²) + 1
/// }
/// let x = Tensor::from_vec(vec![0.5, -1.0], &[2])?;
/// let mut g = Graph::<f64>::new();
/// let dx = g.scope(|s| {
///     let x = s.leaf(&x);
///     let y = s.checkpoint(&block, &[x]);
///     s.backward(y.sum())?; // dL/dx = 2x·exp(x²)
///     Ok::<_, tapir::Error>(x.grad().unwrap().to_vec())
/// })?;
/// assert!((dx[0] - 1.0 * 0.25f64.exp()).abs() < 1e-12);
/// assert!((dx[1] + 2.0 * 1.0f64.exp()).abs() < 1e-12);
/// # Ok(()) }
/// ```
pub trait Checkpoint<T: Float> {
    /// Records the block on `s` from `inputs`. `part` is the number given to
    /// [`Scope::checkpoint_part`] (0 for [`Scope::checkpoint`]), so that one object can
    /// stand for several blocks (the chunks of a layer stack, say).
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, T>, inputs: &[Var<'c, T>], part: u32) -> Var<'c, T>;
}

impl<T: Float, F> Checkpoint<T> for F
where
    F: for<'c, 'e> Fn(&'c Scope<'c, 'e, T>, &[Var<'c, T>]) -> Var<'c, T>,
{
    fn forward<'c, 'e>(&'e self, s: &'c Scope<'c, 'e, T>, inputs: &[Var<'c, T>], _part: u32) -> Var<'c, T> {
        self(s, inputs)
    }
}

/// What a scope needs to record a checkpointed block: the graph's scratch arena and the
/// scope's settings.
///
/// The scratch is held as `dyn Any` (a [`Scratch<T>`](crate::graph::Scratch)) because
/// the tape's type has no `T: 'static` bound to name it with; every use downcasts it back
/// (see [`Nest::scratch`]), which cannot fail, since only `Graph<T>::scope` makes one.
#[derive(Clone, Copy)]
pub(crate) struct Nest<'s> {
    pub(crate) scratch: &'s dyn Any,
    pub(crate) par: Par,
    pub(crate) anomaly: bool,
}

impl<'s> Nest<'s> {
    pub(crate) fn scratch<T: Float>(self) -> &'s Scratch<T> {
        self.scratch.downcast_ref().expect("a scope's scratch arena has the scope's element type")
    }
}

impl std::fmt::Debug for Nest<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nest").field("anomaly", &self.anomaly).finish_non_exhaustive()
    }
}

/// One row of a scope's checkpoint side table: `Copy`, so the table clears in O(1).
#[derive(Clone, Copy)]
pub(crate) struct CheckpointEntry<'s, T> {
    block: &'s (dyn Checkpoint<T> + 's),
    part: u32,
    /// How many of the node's stored inputs are the block's own; the rest are parameters.
    inputs: u32,
    /// The scope's draw count when the block began (see [`Scope::next_draw`]), replayed by
    /// the recomputation.
    draws: u64,
    /// Where the tape's payload list holds the positions of the block's nodes that the
    /// recomputation overwrites in place, and how many (see [`in_place`]).
    in_place: (u32, u32),
    location: Loc,
}

impl<T> std::fmt::Debug for CheckpointEntry<'_, T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "checkpoint part {} ({} inputs, recorded at {})", self.part, self.inputs, self.location)
    }
}

fn nondeterministic(detail: String, location: Loc) -> Error {
    Error::InvalidArgument {
        op: "checkpoint",
        detail: format!("{detail}; a checkpointed block must record the same ops when recomputed"),
        location,
    }
}

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
            return block.forward(self, inputs, part);
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
                let y = block.forward(inner, vars, part);
                crate::graph::core::take_held(&mut inner.core.tape.borrow_mut(), None);
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

/// A short list on the stack: the ids and leaves of a checkpoint are few, and collecting
/// them into a `Vec` would allocate on every step.
trait CollectSmall: Iterator + Sized {
    fn collect_small(self) -> Small<Self::Item>
    where
        Self::Item: Copy,
    {
        let mut out = Small { items: [None; SMALL], len: 0, rest: Vec::new() };
        for v in self {
            out.push(v);
        }
        out
    }
}

impl<I: Iterator> CollectSmall for I {}

const SMALL: usize = 16;

struct Small<V> {
    items: [Option<V>; SMALL],
    len: usize,
    rest: Vec<V>,
}

impl<V: Copy> Small<V> {
    fn push(&mut self, v: V) {
        if self.len < SMALL {
            self.items[self.len] = Some(v);
        } else {
            self.rest.push(v);
        }
        self.len += 1;
    }

    fn iter(&self) -> impl Iterator<Item = &V> + '_ {
        let head = self.len.min(SMALL);
        self.items[..head].iter().map(|v| v.as_ref().expect("the first `len` items are set")).chain(&self.rest)
    }
}

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
fn speculated_safely<T: Float>(tape: &crate::graph::tape::Tape<'_, T>, out: NodeId<'_>) -> bool {
    let taken = tape.in_place.taken();
    taken.is_empty() || (tape.error.is_none() && taken.iter().all(|&k| k != out.raw() && sole_reader(tape, k)))
}

/// Whether no node after `k + 1` reads node `k`.
fn sole_reader<T: Float>(tape: &crate::graph::tape::Tape<'_, T>, k: u32) -> bool {
    (k + 2..tape.nodes.len() as u32).all(|j| {
        let mut reads = false;
        tape.for_each_input(&tape.nodes[j as usize].op, |i| reads |= i.raw() == k);
        !reads
    })
}

fn in_place_positions<'t, 'c, T: Float>(
    tape: &'t crate::graph::tape::Tape<'c, T>,
    out: NodeId<'c>,
) -> impl Iterator<Item = u32> + use<'t, 'c, T> {
    let producer = move |k: u32| {
        let next = tape.nodes.get(k as usize + 1)?;
        let reader = matches!(next.op, Op::Unary { f, x, .. } if x.raw() == k && f.reads_only_output());
        (reader && k != out.raw() && matches!(tape.nodes[k as usize].op, Op::Linear { .. })).then_some(k)
    };
    (0..tape.nodes.len() as u32).filter_map(producer).filter(move |&k| sole_reader(tape, k))
}

/// Recomputes the block from its inputs on a nested scope, runs backward over it seeded
/// with `∂L/∂out`, and adds the nested leaves' and parameters' gradients into those of
/// the checkpoint's inputs.
#[inline(never)]
pub(crate) fn backward<'s, T: Float>(
    ctx: &mut BackwardCtx<'_, 's, T>,
    out: NodeId<'s>,
    table: u32,
    first: u32,
    count: u32,
) -> Result<()> {
    let entry = ctx.tape.checkpoints[table as usize];
    let nest = ctx.tape.nest.expect("checkpoint nodes are recorded only on scopes that have a scratch arena");
    let dout = ctx.grads[out].take().expect("backward visits only nodes whose gradient exists");
    let tape = ctx.tape;
    let leaves = tape.stored_ids(first, entry.inputs).map(|id| {
        let n = tape.node(id);
        (n.requires_grad, n.shape, n.value)
    });
    let result = nested(nest, leaves, |inner, vars| {
        replay(inner, tape.step, entry.draws);
        let (at, n) = entry.in_place;
        inner.core.tape.borrow_mut().in_place.at.extend_from_slice(&tape.extra[at as usize..(at + n) as usize]);
        let y = entry.block.forward(inner, vars, entry.part);
        crate::graph::core::take_held(&mut inner.core.tape.borrow_mut(), None);
        let mut itape = inner.core.tape.borrow_mut();
        if let Some(e) = &itape.error {
            return Err(e.clone());
        }
        let (shape, expected) = (itape.shape(y.id), tape.shape(out));
        if shape != expected {
            return Err(nondeterministic(
                format!("the block's output has shape {shape} on recomputation but {expected} when recorded"),
                entry.location,
            ));
        }
        let params = || tape.stored_ids(first + entry.inputs, count - entry.inputs);
        let mut inner_params = itape.nodes.iter().filter_map(|n| match n.op {
            Op::Param(at) => Some(at),
            _ => None,
        });
        for outer in params() {
            let same = match (inner_params.next(), tape.node(outer).op) {
                (Some(a), Op::Param(b)) => {
                    itape.extra[a as usize..a as usize + 3] == tape.extra[b as usize..b as usize + 3]
                }
                _ => false,
            };
            if !same {
                return Err(nondeterministic(
                    "the block read other parameters on recomputation".into(),
                    entry.location,
                ));
            }
        }
        if inner_params.next().is_some() {
            return Err(nondeterministic("the block read more parameters on recomputation".into(), entry.location));
        }
        if !itape.node(y.id).requires_grad {
            return Ok(());
        }
        // Releasing, as `backward_into`: of the block's gradients only its leaves' (the
        // inputs and parameters, read below) are needed, so each other buffer is reused.
        let (arena, seed, flags) = (inner.core.arena, (y.id, Seed::Given(dout)), (nest.anomaly, true));
        backward::run_with(&mut itape, arena, nest.par, seed, entry.location, flags, |_, _| {}, |_, _| {})?;
        let param_ids = itape.ids().filter(|&id| matches!(itape.node(id).op, Op::Param(_)));
        let pairs = vars.iter().map(|v| v.id).zip(tape.stored_ids(first, entry.inputs)).chain(param_ids.zip(params()));
        for (inner_id, outer_id) in pairs {
            if let (Some(Some(g)), true) = (itape.grads.get(inner_id), tape.node(outer_id).requires_grad) {
                add_grad(ctx, outer_id, g)?;
            }
        }
        Ok(())
    });
    ctx.grads[out] = Some(dout);
    result
}

/// Recorded derivative ([`Scope::grad`]), with `g = ∂y/∂out` a handle: the block runs
/// again, this time on the scope itself, from the checkpoint's own input nodes, so its ops
/// are recorded on this tape (in the main arena) like any others; then the walk goes on
/// through them, seeded with `g` at the recomputed output, and their derivatives reach
/// the checkpoint's inputs. Everything recorded is differentiable again, to any order.
///
/// During the recomputation the block's random draws replay from where its forward began
/// them, gradient recording is on even under `no_grad` (the walk needs the block's
/// graph; `no_grad` still applies to the derivative ops recorded afterwards), and the
/// block's parameter reads return the checkpoint's own parameter nodes in order instead
/// of new ones (see [`replayed_param`]), so that a later `grad` or `backward_into` with
/// respect to those parameters sees every path through them.
///
/// The recomputed values stay in the main arena until the scope ends: a second
/// derivative keeps the block's graph, as PyTorch's `create_graph=True` does.
#[track_caller]
pub(crate) fn grad<'s, T: Float>(
    ctx: &mut GradCtx<'_, 's, T>,
    out: NodeId<'s>,
    g: Var<'s, T>,
    table: u32,
    first: u32,
    count: u32,
) -> Result<()> {
    let (scope, core) = (ctx.scope, ctx.core);
    let (entry, before) = {
        let tape = core.tape.borrow();
        (tape.checkpoints[table as usize], tape.ids().next_back().expect("the checkpoint node is on the tape"))
    };
    let ids: Small<NodeId<'s>> = core.tape.borrow().stored_ids(first, entry.inputs).collect_small();
    let saved = {
        let mut tape = core.tape.borrow_mut();
        let saved = (tape.draws, tape.no_grad);
        tape.draws = entry.draws;
        tape.no_grad = 0;
        tape.replay = Some((first + entry.inputs, first + count));
        saved
    };
    let y = crate::graph::with_slice(core.poison(), ids.iter().map(|&id| Var { core, id }), |inputs| {
        scope.replay(table, inputs, entry.part)
    });
    let replay = {
        let mut tape = core.tape.borrow_mut();
        (tape.draws, tape.no_grad) = saved;
        tape.replay.take()
    };
    if core.tape.borrow().error.is_some() {
        return Ok(());
    }
    if let Some((next, end)) = replay.filter(|(next, end)| next != end) {
        let read = next - (first + entry.inputs);
        return Err(nondeterministic(
            format!("the block read {read} of its {} parameters on recomputation", end - (first + entry.inputs)),
            entry.location,
        ));
    }
    let (shape, expected) = (y.shape(), core.tape.borrow().shape(out));
    if shape != expected {
        return Err(nondeterministic(
            format!("the block's output has shape {shape} on recomputation but {expected} when recorded"),
            entry.location,
        ));
    }
    // The walk goes on over the recomputed nodes: they come after everything the main
    // walk visits, and read the checkpoint's inputs, which it visits later.
    let last = y.id;
    ctx.slots.resize_with(last.index() + 1, Default::default);
    ctx.mark(core.tape.borrow().ids_after(before, last));
    if !ctx.slots[last].needed {
        return Ok(());
    }
    ctx.slots[last].grad = Some(g.id);
    let ids = core.tape.borrow().ids_after(before, last);
    ctx.walk_back(ids)
}

/// A scope as the recorded derivative of a checkpoint sees it: something that runs the
/// block of checkpoint `table` on itself. Implemented by `Scope<'s, 'g, T>`, which holds
/// its blocks borrowed for `'g` ([`Checkpoint::forward`] needs the block borrowed for the
/// scope's `'g`); the derivative ops see a `&'s dyn Replay<'s, T>`, with no `'g` to name,
/// so the scope stays invariant in `'g`.
pub(crate) trait Replay<'s, T: Float> {
    /// Runs checkpoint `table`'s block on this scope from `inputs`.
    fn replay(&'s self, table: u32, inputs: &[Var<'s, T>], part: u32) -> Var<'s, T>;
}

impl<'s, 'g: 's, T: Float> Replay<'s, T> for Scope<'s, 'g, T> {
    fn replay(&'s self, table: u32, inputs: &[Var<'s, T>], part: u32) -> Var<'s, T> {
        // Copied out, so the list is not borrowed while the block runs (it may record a
        // checkpoint of its own, which pushes to it).
        let block = self.blocks.borrow()[table as usize];
        block.forward(self, inputs, part)
    }
}

/// While a checkpointed block is recomputed for its recorded derivative (the tape's
/// `replay` is set), a parameter read takes the checkpoint's next parameter node instead
/// of recording a new one: `Some` of that node if it is the parameter `payload` names,
/// `Some` of a poisoned handle (the scope's error) if it is not, `None` outside a
/// recomputation.
///
/// The checkpoint's parameter nodes were recorded with an empty value (nothing read them
/// until now); `value`, the parameter's data when the read comes from
/// [`Scope::param`], becomes the node's value, so the recomputed ops can read it. A read
/// by a checkpoint nested in the block passes `None`: that checkpoint only lists the node,
/// and its own recomputation reads the value through `Scope::param` in turn.
#[track_caller]
pub(crate) fn replayed_param<'s, T: Float>(
    core: &'s Core<'s, T>,
    payload: [u32; 3],
    value: Option<&'s [T]>,
    location: Loc,
) -> Option<Var<'s, T>> {
    let mut tape = core.tape.borrow_mut();
    let (next, end) = tape.replay?;
    let id = (next < end).then(|| tape.stored_ids(next, 1).next()).flatten();
    let same =
        id.map(|id| matches!(tape.node(id).op, Op::Param(at) if tape.extra[at as usize..at as usize + 3] == payload));
    match id {
        Some(id) if same == Some(true) => {
            tape.replay = Some((next + 1, end));
            if let Some(value) = value {
                tape.nodes[id.index()].value = value;
            }
            Some(Var { core, id })
        }
        _ => {
            drop(tape);
            Some(core.fail(nondeterministic("the block read other parameters on recomputation".into(), location)))
        }
    }
}

/// Starts the nested scope's random draws where the block's forward started them.
fn replay<T: Float>(inner: &Scope<'_, '_, T>, step: u64, draws: u64) {
    let mut tape = inner.core.tape.borrow_mut();
    tape.step = step;
    tape.draws = draws;
}

/// `grad[id] += g`, allocating the gradient (zeroed) on first use.
fn add_grad<'s, T: Float>(ctx: &mut BackwardCtx<'_, 's, T>, id: NodeId<'s>, g: &[T]) -> Result<()> {
    match &mut ctx.grads[id] {
        Some(slot) => kernels::add_assign(slot, g),
        None => {
            let fresh = ctx.first_grad(id)?;
            fresh.copy_from_slice(g);
            ctx.grads[id] = Some(fresh);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_are_plain_data() {
        assert!(!std::mem::needs_drop::<CheckpointEntry<'static, f32>>());
        assert_eq!(std::mem::size_of::<crate::ops::Op<'static, f32>>(), 16);
    }
}
