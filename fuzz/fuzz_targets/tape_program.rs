//! Random programs from raw bytes: never a panic, always the documented error, and
//! gradients (and, for small smooth programs, recorded second derivatives) that match
//! finite differences. The body is `tapir_testing::program`, which
//! the stable replay test (`crates/tapir-testing/tests/fuzz_replay.rs`) runs on the corpus
//! too. Inputs starting with `TPv1` use the extensible op codes (`tapir_testing::codes`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = tapir_testing::program::run_program(data) {
        panic!("{finding}");
    }
});
