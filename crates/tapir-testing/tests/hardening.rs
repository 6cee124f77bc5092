//! The programs that the adversarial step kinds of format 1 (zero-size with huge
//! dimensions, repeated axes) found failing on the engine (issue "Hardening"): each is the
//! smallest program of its class, run through the same checker as the fuzz target. They
//! panicked, hung, or succeeded where an error is due before the engine was fixed:
//!
//! ```text
//! cargo test -p tapir-testing --test suite hardening::
//! ```

use tapir_testing::program::{Dtype, Ending, Leaf, Program, ReduceOp, Step};

const H: usize = 1 << 31;

/// `full(dims, 0.5)` (value 1), then `steps` on it; the loss is the last value, summed.
fn after_full(dims: &[usize], steps: Vec<Step>) -> Program {
    let mut all = vec![Step::Full { dims: dims.to_vec(), v: 0.5 }];
    all.extend(steps);
    let loss = all.len();
    Program {
        dtype: Dtype::F64,
        leaves: vec![Leaf { dims: vec![2, 3], data: vec![0.5, -1.0, 2.0, 0.25, 1.5, -0.75], grad: true }],
        steps: all,
        loss,
        reduce_loss: true,
        ending: Ending::Once,
        arena_limit: None,
        threads: 1,
    }
}

fn check(p: &Program) {
    if let Err(f) = p.execute() {
        panic!("{f}");
    }
}

/// Today: panic "a smaller dimension cannot overflow". Expected: `InvalidShape` (the
/// output `[2^31, 2^31]` has 2^62 elements).
#[test]
fn reducing_a_zero_axis_next_to_huge_ones_is_an_error() {
    for (dims, zero) in [([0, H, H], 0), ([H, H, 0], 2), ([H, H, 0], -1)] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            for keepdim in [false, true] {
                check(&after_full(&dims, vec![Step::Reduce { op, x: 1, axes: Some(vec![zero]), keepdim }]));
            }
        }
        check(&after_full(&dims, vec![Step::Var { x: 1, axes: vec![zero], keepdim: false, correction: 1 }]));
        check(&after_full(&dims, vec![Step::LogSumExp { x: 1, axis: zero, keepdim: true }]));
        check(&after_full(&dims, vec![Step::LogSumExp { x: 1, axis: zero, keepdim: false }]));
    }
}

/// Today: panic "attempt to multiply with overflow" (`ops/reduce.rs:43`, debug builds).
/// Expected: `InvalidShape`.
#[test]
fn reducing_a_zero_axis_of_rank_4_is_an_error() {
    let u = u32::MAX as usize;
    check(&after_full(
        &[0, u, u, H],
        vec![Step::Reduce { op: ReduceOp::Sum, x: 1, axes: Some(vec![0]), keepdim: false }],
    ));
}

/// Today: `permute` reports `InvalidShape` ("overflow the element count") for
/// `[2^32-1, 0, 2^31, 2^32-1]` → `[2^32-1, 2^32-1, 2^31, 0]`: the element count is
/// multiplied from the left and overflows before it reaches the zero, so whether a
/// zero-size shape is valid depends on the order of its dimensions (`full` accepts the
/// first and rejects the second). Expected here: the permuted value. If the engine keeps
/// the order-dependent rule instead, `model::valid_dims` and this test change with it.
#[test]
fn permuting_a_zero_size_shape_keeps_it_valid() {
    let u = u32::MAX as usize;
    check(&after_full(&[u, 0, H, u], vec![Step::Permute { x: 1, axes: vec![3, 0, 2, 1] }]));
}

/// Today: hangs (a loop over the 2^62 rows of an empty axis). Expected: an empty result.
#[test]
fn softmax_over_a_zero_axis_returns_at_once() {
    for (dims, zero) in [([0, H, H], 0), ([1 << 20, 0, u32::MAX as usize], 1), ([H, H, 0], 2)] {
        for log in [false, true] {
            check(&after_full(&dims, vec![Step::Softmax { x: 1, axis: zero, log }]));
        }
    }
    // Over a non-empty axis of an empty tensor too.
    check(&after_full(&[H, 1 << 20, 0, 1 << 20], vec![Step::Softmax { x: 1, axis: 0, log: true }]));
}

/// Today: hangs. Expected: the empty `[2^31, 0]`.
#[test]
fn summing_an_axis_of_an_empty_tensor_returns_at_once() {
    for op in [ReduceOp::Sum, ReduceOp::Mean] {
        check(&after_full(&[H, H, 0], vec![Step::Reduce { op, x: 1, axes: Some(vec![0]), keepdim: false }]));
    }
}

/// Today: accepted as the axis once (and `mean_axes`/`var` divide by the wrong count).
/// Expected: a typed error (the model says `BadAxis`, as PyTorch's "dim appears multiple
/// times"; change `REPEATED_AXIS` in `model.rs` if the engine picks another variant).
#[test]
fn repeated_axes_are_an_error() {
    for axes in [vec![0, 0], vec![0, -2], vec![1, 0, 1]] {
        for op in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max, ReduceOp::Min] {
            let mut p = after_full(&[2, 3], vec![Step::Reduce { op, x: 0, axes: Some(axes.clone()), keepdim: false }]);
            p.steps.remove(0);
            p.loss = 1;
            check(&p);
        }
        let mut p = after_full(&[2, 3], vec![Step::Var { x: 0, axes, keepdim: true, correction: 1 }]);
        p.steps.remove(0);
        p.loss = 1;
        check(&p);
    }
}
