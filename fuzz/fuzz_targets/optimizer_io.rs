//! Arbitrary bytes through the loaders of optimizer state: `tapir_nn::io::load_optimizer_bytes`
//! (Adam, AdamW, SGD with and without momentum) and `tapir_dist::checkpoint::from_bytes`.
//! Loading either fails and changes nothing, or yields state the constructors accept and
//! whose next step works. The body is `tapir_testing::optimizer_io`, which the stable
//! replay test runs too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = tapir_testing::optimizer_io::run_optimizer_io(data) {
        panic!("{finding}");
    }
});
