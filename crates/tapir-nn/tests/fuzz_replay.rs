//! Replays every checked-in input of the fuzz target `tensor_io` through its checkpoint
//! half ([`run_checkpoint_io`]) on the stable toolchain, so that CI guards the loader
//! without nightly. The core half is replayed by `crates/tapir/tests/fuzz_replay.rs`.

use std::path::PathBuf;

use tapir_nn::testing::run_checkpoint_io;

#[test]
fn tensor_io_corpus_loads_or_fails_cleanly() {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus/tensor_io");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable corpus directory").path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "the seed corpus is missing: {} files", files.len());
    let mut loaded = 0;
    for path in &files {
        let bytes = std::fs::read(path).expect("a readable corpus file");
        if let Err(finding) = run_checkpoint_io(&bytes) {
            panic!("{}: {finding}", path.display());
        }
        loaded += usize::from(tapir_nn::io::read_checkpoint::<f32>(&bytes).is_ok());
    }
    assert!(loaded > 0, "no corpus file is a valid checkpoint");
}
