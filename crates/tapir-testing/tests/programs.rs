//! Property tests over random programs: the fuzz target's generator and checks
//! (`tapir_testing::program`), driven by proptest with few enough cases for 2 cores.

use proptest::prelude::*;
use rand::{RngExt, SeedableRng};
use tapir_testing::codes::FORMAT1_MAGIC;
use tapir_testing::program::{run_program, Program};

/// `len` bytes from a seeded generator: a program is a function of its seed.
fn bytes_of(seed: u64, len: usize) -> Vec<u8> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..len).map(|_| rng.random()).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// No panic, the documented error for every invalid step, and gradients that match
    /// finite differences for smooth programs in `f64`.
    #[test]
    fn random_programs_keep_every_promise(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        if let Err(finding) = run_program(&bytes) {
            prop_assert!(false, "{}", finding);
        }
    }

    /// The same in format 1 (`TPv1` then the program), where each code byte names one op
    /// of the extensible table, unassigned codes included.
    #[test]
    fn format1_programs_keep_every_promise(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let bytes: Vec<u8> = FORMAT1_MAGIC.iter().copied().chain(bytes).collect();
        if let Err(finding) = run_program(&bytes) {
            prop_assert!(false, "{}", finding);
        }
    }

    /// Smooth programs in format 1 are gradient-checked too.
    #[test]
    fn format1_smooth_programs_match_finite_differences(seed: u64, len in 40usize..200) {
        let mut bytes = bytes_of(seed, len);
        bytes[0] &= 0b0000_1110;
        let bytes: Vec<u8> = FORMAT1_MAGIC.iter().copied().chain(bytes).collect();
        if let Err(finding) = run_program(&bytes) {
            prop_assert!(false, "{}", finding);
        }
    }

    /// Header byte 0 selects smooth `f64` programs, which are all gradient-checked
    /// unless too large or non-finite.
    #[test]
    fn smooth_programs_match_finite_differences(seed: u64, len in 40usize..200) {
        let mut bytes = bytes_of(seed, len);
        bytes[0] &= 0b0000_1110;
        if let Err(finding) = run_program(&bytes) {
            prop_assert!(false, "{}", finding);
        }
    }
}

/// Format-1 programs in which every fifth byte is the custom op's code (`0x65`), so that
/// most of them record it, with its backward misbehaving as the generator chose
/// (`tapir_testing::program::Misbehave`: an error, a panic, a slot handed back shorter,
/// dropped, swapped, moved or split). `run_program` then checks that backward returns
/// `Ok` with the well-behaved op's gradients bit for bit, or `Error::CustomOp` naming the
/// op in phase `backward`; that nothing panics; and that `backward_into` leaves the
/// caller's buffer unchanged on error.
fn with_custom_ops(bytes: Vec<u8>) -> Vec<u8> {
    let body = bytes.into_iter().enumerate().map(|(i, b)| if i % 5 == 4 { 0x65 } else { b });
    FORMAT1_MAGIC.iter().copied().chain(body).collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// Issue 31, class 1: custom ops whose backward misbehaves fail with a typed error.
    #[test]
    fn misbehaving_custom_ops_fail_cleanly(bytes in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Err(finding) = run_program(&with_custom_ops(bytes)) {
            prop_assert!(false, "{}", finding);
        }
    }
}

/// The custom-op programs above record the op, misbehaving in every way, and some
/// well-behaved ones are gradient-checked (the op's backward and its recorded derivative).
#[test]
fn custom_steps_are_drawn_in_every_mode() {
    use tapir_testing::program::Step;
    let (mut modes, mut checked, mut second, mut refused) = (std::collections::BTreeSet::new(), 0, 0, 0);
    for seed in 0..400u64 {
        let bytes = with_custom_ops(bytes_of(seed, 120));
        let program = Program::from_bytes(&bytes);
        for step in &program.steps {
            if let Step::Custom { mode, .. } = step {
                // The variant's name, without its indices.
                modes.insert(format!("{mode:?}").chars().take_while(|c| c.is_alphabetic()).collect::<String>());
            }
        }
        let report = run_program(&bytes).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
        let backward = program.execute().unwrap_or_else(|f| panic!("seed {seed}: {f}")).backward;
        refused += usize::from(matches!(backward, Err(tapir::Error::CustomOp { phase: "backward", .. })));
        if program.has_custom() {
            checked += usize::from(report.gradchecked);
            second += usize::from(report.gradgradchecked);
        }
    }
    eprintln!("modes {modes:?}; {refused} backward errors; with a custom step, {checked} gradchecked, {second} to second order");
    assert_eq!(modes.len(), 8, "{modes:?}");
    assert!(refused >= 50, "only {refused} of 400 programs had backward refuse a misbehaving op");
    assert!(checked >= 20 && second >= 10, "{checked} gradchecked, {second} to second order");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    /// The same seed and thread count give the same program and bitwise identical
    /// values, gradients and errors, on every rerun.
    #[test]
    fn reruns_are_bitwise_identical(seed: u64, threads in 1usize..=2) {
        let run = || {
            let mut program = Program::from_bytes(&bytes_of(seed, 300));
            program.threads = threads;
            program.execute().map_err(|f| f.to_string())
        };
        let first = run();
        prop_assert!(first.is_ok(), "{:?}", first);
        for _ in 0..2 {
            prop_assert_eq!(&run(), &first);
        }
    }
}

/// The attention codes (`0x62`, `0x63`) are drawn: some smooth format-1 programs that use
/// them are gradient-checked, and some to second order; invalid calls elsewhere keep the
/// promises (every program here passes `run_program`).
#[test]
fn attention_steps_are_drawn_and_gradient_checked() {
    use tapir_testing::program::Step;
    let (mut first, mut second, mut used) = (0, 0, 0);
    for seed in 0..3000u64 {
        let mut bytes = bytes_of(seed, 120);
        bytes[0] &= 0b0000_1110;
        // Bias the code bytes towards attention so that a few thousand programs suffice.
        for (i, b) in bytes.iter_mut().enumerate().skip(1) {
            if i % 7 == 0 {
                *b = 0x62 + (*b & 1);
            }
        }
        let bytes: Vec<u8> = FORMAT1_MAGIC.iter().copied().chain(bytes).collect();
        let program = Program::from_bytes(&bytes);
        let attention = program.steps.iter().any(|s| matches!(s, Step::AttentionWeights { .. } | Step::Attend { .. }));
        let report = run_program(&bytes).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
        if attention {
            used += 1;
            first += usize::from(report.gradchecked);
            second += usize::from(report.gradgradchecked);
        }
    }
    eprintln!("{used} programs with attention, {first} gradchecked, {second} to second order");
    assert!(
        used >= 2000 && first >= 1000 && second >= 500,
        "{used} programs with attention, {first} gradchecked, {second} to second order"
    );
}

/// Forward mode over random programs: every step kind that smooth `f64` programs draw is in
/// some program whose tangent (every leaf seeded) was checked against differences and
/// reverse mode; the counter prints how often each was.
#[test]
fn every_smooth_step_kind_is_checked_in_forward_mode() {
    use std::collections::BTreeMap;
    let (mut drawn, mut checked) = (BTreeMap::<String, usize>::new(), BTreeMap::<String, usize>::new());
    for seed in 0..1500u64 {
        let mut bytes = bytes_of(seed, 120);
        bytes[0] &= 0b0000_1110;
        let bytes: Vec<u8> = FORMAT1_MAGIC.iter().copied().chain(bytes).collect();
        let program = Program::from_bytes(&bytes);
        let report = run_program(&bytes).unwrap_or_else(|f| panic!("seed {seed}: {f}"));
        for step in &program.steps {
            // The variant's name, and the op's for elementwise steps: `Unary(Exp)`.
            let debug = format!("{step:?}");
            let kind: String = debug.split([' ', '{', ',']).next().unwrap_or_default().to_string();
            *drawn.entry(kind.clone()).or_default() += 1;
            if report.tangentchecked {
                *checked.entry(kind).or_default() += 1;
            }
        }
    }
    eprintln!("steps in forward-mode-checked programs: {checked:?}");
    // The generator's custom op included: it has a forward rule.
    let missing: Vec<_> = drawn.keys().filter(|k| !checked.contains_key(*k)).collect();
    assert!(missing.is_empty(), "drawn but never checked in forward mode: {missing:?}");
}
