//! Arbitrary bytes through every loader of external data: `Tensor::from_vec` and
//! `from_slice` with arbitrary dimensions and lengths, and `tapir_nn::io::read_checkpoint`
//! in `f32` and `f64`. A correct tensor or the documented error, nothing else. The
//! bodies are `tapir::testing::tensor_io` and `tapir_nn::testing`, which the stable
//! replay tests run on the corpus too.
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    if let Err(finding) = tapir::testing::tensor_io::run_tensor_io(data) {
        panic!("{finding}");
    }
    if let Err(finding) = tapir_nn::testing::run_checkpoint_io(data) {
        panic!("{finding}");
    }
});
