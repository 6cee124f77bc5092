//! Arbitrary bytes through every loader of external data: `Tensor::from_vec` and
//! `from_slice` with arbitrary dimensions and lengths, and `tapir_nn::io::read_checkpoint`
//! in `f32` and `f64`. A correct tensor or the documented error, nothing else. The
//! bodies are `tapir_testing::tensor_io` and `tapir_testing::checkpoint_io`, which the
//! stable replay test runs on the corpus too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = tapir_testing::tensor_io::run_tensor_io(data) {
        panic!("{finding}");
    }
    if let Err(finding) = tapir_testing::checkpoint_io::run_checkpoint_io(data) {
        panic!("{finding}");
    }
});
