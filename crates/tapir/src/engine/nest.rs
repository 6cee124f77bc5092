//! Nested scopes, on which checkpointed blocks record ([`nested`]), and short lists kept on
//! the stack ([`with_slice`], [`Small`]), so that a checkpoint's few inputs and parameters
//! allocate nothing.

use std::cell::RefCell;
use std::marker::PhantomData;

use crate::dtype::Float;
use crate::record::handles::{Core, Nest, Scope, State, Var};
use crate::shape::Shape;
use crate::tape::op::Op;

/// Runs `f` on a fresh scope nested in a scope `'s`: its own tape, on the scratch arena
/// of `nest`, with `inputs` entering as leaves that borrow their values (a gradient-
/// requesting leaf where `inputs` says so). When `f` returns, the nested tape goes back
/// to the scratch buffers and the scratch arena is reset, so nothing the block made
/// survives: `f`'s result cannot mention `'c`.
///
/// The nested scope's environment lifetime is `'s`: what it borrows must outlive the
/// outer scope, not only the nested one.
pub(crate) fn nested<'s, T: Float, R>(
    nest: Nest<'s>,
    inputs: impl Iterator<Item = (bool, Shape, &'s [T])>,
    f: impl for<'c> FnOnce(&'c Scope<'c, 's, T>, &[Var<'c, T>]) -> R,
) -> R {
    let scratch = nest.scratch::<T>();
    let arena = scratch.arena.borrow();
    let tape = State::from_spare(&mut scratch.spare.borrow_mut());
    let out = {
        // A nested scope has no `nest` of its own: a checkpoint inside it runs inline.
        let scope = Scope {
            core: Core::new(&arena, tape, nest.par, nest.anomaly, nest.profile),
            blocks: RefCell::default(),
            _env: PhantomData,
        };
        let leaves = inputs.map(|(grad, shape, value)| {
            let kind = if grad { Op::Variable } else { Op::Leaf };
            scope.core.leaf(kind, shape, value)
        });
        let out = with_slice(scope.core.poison(), leaves, |vars| f(&scope, vars));
        scope.core.tape.borrow_mut().drain_into(&mut scratch.spare.borrow_mut());
        out
    };
    drop(arena);
    scratch.arena.borrow_mut().reset();
    out
}

/// Calls `f` with `items` as a slice: on the stack for up to 16 (a block's or a
/// checkpoint's few inputs), else in a `Vec`, so the common case allocates nothing.
/// `fill` pads the unused stack slots.
pub(crate) fn with_slice<V: Copy, R>(fill: V, items: impl Iterator<Item = V>, f: impl FnOnce(&[V]) -> R) -> R {
    const SMALL: usize = 16;
    let (mut small, mut spill, mut n) = ([fill; SMALL], Vec::new(), 0);
    for v in items {
        if n < SMALL {
            small[n] = v;
        } else {
            if spill.is_empty() {
                spill.extend_from_slice(&small);
            }
            spill.push(v);
        }
        n += 1;
    }
    f(if n <= SMALL { &small[..n] } else { &spill })
}

/// A short list on the stack: the ids and leaves of a checkpoint are few, and collecting
/// them into a `Vec` would allocate on every step.
pub(crate) trait CollectSmall: Iterator + Sized {
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

pub(crate) struct Small<V> {
    items: [Option<V>; SMALL],
    pub(crate) len: usize,
    rest: Vec<V>,
}

impl<V: Copy> Small<V> {
    pub(crate) fn push(&mut self, v: V) {
        if self.len < SMALL {
            self.items[self.len] = Some(v);
        } else {
            self.rest.push(v);
        }
        self.len += 1;
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &V> + '_ {
        let head = self.len.min(SMALL);
        self.items[..head].iter().map(|v| v.as_ref().expect("the first `len` items are set")).chain(&self.rest)
    }
}
