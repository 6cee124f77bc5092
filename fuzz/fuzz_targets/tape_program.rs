//! Random programs from raw bytes: never a panic, always the documented error, and
//! gradients that match finite differences. The body is `tapir::testing::program`, which
//! the stable replay test (`crates/tapir/tests/fuzz_replay.rs`) runs on the corpus too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = tapir::testing::program::run_program(data) {
        panic!("{finding}");
    }
});
