//! Runtime dispatch to the widest vector instructions the CPU has.
//!
//! The default build targets baseline x86-64 (SSE2). [`run`] hands a loop to
//! [`pulp::Arch::dispatch`], which calls it inside a function compiled for AVX2+FMA or
//! AVX-512 when the CPU has them, so the loop's body (inlined there) is vectorised for
//! that width. All of it is safe code: pulp checks the features once and keeps the
//! `unsafe` call to the `#[target_feature]` function inside the crate.
//!
//! The kernels never use fused multiply-add (see [`super::vmath`]), so every path gives
//! the same bits; dispatch changes only the speed.

use std::sync::OnceLock;

/// Slices shorter than this skip dispatch: the feature check and the call cost more than
/// the vector loop saves, and the results are the same bits either way.
pub(crate) const MIN_LEN: usize = 16;

/// The instruction set found at first use.
#[inline]
fn arch() -> pulp::Arch {
    static ARCH: OnceLock<pulp::Arch> = OnceLock::new();
    *ARCH.get_or_init(pulp::Arch::new)
}

/// Runs `f` compiled for the best instruction set on this CPU when `len >= MIN_LEN`,
/// else as it is.
#[inline(always)]
pub(crate) fn run<R>(len: usize, f: impl FnOnce() -> R) -> R {
    if len < MIN_LEN {
        f()
    } else {
        dispatch(f)
    }
}

/// The dispatching call, out of line: the callers of [`run`] are recording and backward
/// functions that short tensors (shape `[1]`) go through too, and inlining every
/// instruction set's copy of the loop into them would slow those down.
#[inline(never)]
fn dispatch<R>(f: impl FnOnce() -> R) -> R {
    // The wrapper carries `inline(always)`, so that `f`'s body lands in pulp's
    // `#[target_feature]` function and is compiled for its instruction set.
    #[allow(clippy::redundant_closure)]
    arch().dispatch(
        #[inline(always)]
        || f(),
    )
}
