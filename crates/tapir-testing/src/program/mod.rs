//! Random programs: a few leaves, a sequence of ops from the whole op set with arguments
//! that are sometimes invalid, then backward. The cargo-fuzz target `tape_program`, the
//! corpus replay test and the property tests all go through [`run_program`], so a crash
//! the fuzzer finds on nightly is guarded on stable by its checked-in input.
//!
//! [`Program::from_bytes`] decodes any byte string into a program. It tracks every
//! value's shape while it generates, so most arguments are valid (and the programs get
//! deep), while about one step in sixteen gets an argument drawn without regard to the
//! shapes: a bad axis, a wrong element count, an index past the end, an empty list.
//!
//! [`run_program`] then checks, for every program:
//!
//! - nothing panics (the fuzzer reports a panic as a crash);
//! - after each step, the scope holds exactly the error the reference model in
//!   `model.rs` predicts: same variant, same op name, located in `interpret.rs` (the caller),
//!   or no error and a value of the predicted shape; the arena limit (the program's, or
//!   [`SAFETY_LIMIT`]) may cut in earlier with an [`tapir::Error::ArenaLimit`] it explains;
//!   once the scope holds an error it keeps that error;
//! - backward returns the scope's error, [`tapir::Error::NotScalar`] for a loss of another size,
//!   and [`tapir::Error::BackwardTwice`] for a second consuming pass; `backward_retain` leaves
//!   the tape usable and gives the same gradients as the pass after it;
//! - gradients have their leaves' sizes, and inputs get none;
//! - a second run of the same program, with the same thread count, is bitwise identical;
//! - for programs in `f64` made only of smooth ops on finite inputs, the gradients match
//!   central finite differences ([`tapir::testing::gradcheck`]), and for small ones whose
//!   values are moderate the recorded second derivatives too;
//! - a custom op whose backward misbehaves ([`Misbehave`], format-1 code `0x65`) makes
//!   backward return [`tapir::Error::CustomOp`] naming it in phase `backward`, or `Ok` with
//!   the well-behaved op's values and gradients bit for bit, and `backward_into` leaves the
//!   caller's buffer unchanged on any error.
//!
//! The module holds its ideas one to a file: the step data model (`step.rs`), the
//! checker (`check.rs`), the interpreter that records steps (`interpret.rs`), the custom
//! op (`custom.rs`) and the `backward_into` check (`buffer.rs`).

mod buffer;
mod check;
mod custom;
mod interpret;
mod step;

pub use check::{run_program, Finding, Report, Trace};
pub use custom::{Misbehave, MAX_INPUTS as MAX_CUSTOM_INPUTS, NAME as CUSTOM_NAME};
pub use step::{BinOp, CmpOp, Dtype, Ending, Leaf, Program, ReduceOp, ScalarOp, Step, UnaryOp, WindowOp};

/// Most steps a program may have, so that one fuzz input stays fast.
pub const MAX_STEPS: usize = 24;

/// The arena limit of programs that set none: valid arguments can ask for huge tensors
/// (an `im2col` with a padding of 2^31), which must end in [`tapir::Error::ArenaLimit`]
/// rather than in the fuzzer's out-of-memory abort.
pub const SAFETY_LIMIT: usize = 64 << 20;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_short_input_runs_clean() {
        for len in 0..4 {
            for seed in 0..=255u8 {
                let bytes: Vec<u8> =
                    (0..len * 16).map(|i| seed.wrapping_mul(31).wrapping_add((i as u8).wrapping_mul(7))).collect();
                if let Err(f) = run_program(&bytes) {
                    panic!("{f}");
                }
            }
        }
    }

    #[test]
    fn smooth_programs_are_gradchecked() {
        // Header 0: f64, smooth ops only, one thread, no limit.
        let bytes: Vec<u8> = std::iter::once(0).chain((1..200u8).map(|i| i.wrapping_mul(37))).collect();
        let report = run_program(&bytes).unwrap_or_else(|f| panic!("{f}"));
        assert!(report.steps > 3, "{report:?}");
    }
}
