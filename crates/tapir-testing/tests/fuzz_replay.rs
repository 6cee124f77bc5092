//! Replays every checked-in fuzz input through the fuzz targets' own bodies, on the
//! stable toolchain, so that CI guards against regressions without nightly or
//! cargo-fuzz. A crash the fuzzer found lands as a file in `fuzz/corpus/<target>/` with
//! its fix, and this test keeps it fixed.

use std::path::PathBuf;

use tapir_testing::checkpoint_io::run_checkpoint_io;
use tapir_testing::optimizer_io::{run_optimizer_io, seeds};
use tapir_testing::program::run_program;
use tapir_testing::tensor_io::run_tensor_io;

/// Every file of `fuzz/corpus/<target>`, sorted, with its name.
fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/corpus").join(target);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.expect("a readable corpus directory").path())
        .filter(|p| p.is_file() && !p.file_name().is_some_and(|n| n.to_string_lossy().starts_with('.')))
        .collect();
    files.sort();
    let read = |p: PathBuf| (p.display().to_string(), std::fs::read(&p).expect("a readable corpus file"));
    files.into_iter().map(read).collect()
}

#[test]
fn tape_program_corpus_replays_clean() {
    let files = corpus("tape_program");
    assert!(files.len() >= 10, "the seed corpus is missing: {} files", files.len());
    let (mut gradchecked, mut second, mut tangents) = (0, 0, 0);
    for (name, bytes) in &files {
        match run_program(bytes) {
            Ok(report) => {
                gradchecked += usize::from(report.gradchecked);
                tangents += usize::from(report.tangentchecked);
                second += usize::from(report.gradgradchecked);
            }
            Err(finding) => panic!("{name}: {finding}"),
        }
    }
    eprintln!(
        "replayed {} programs, {gradchecked} gradient-checked, {second} to second order, {tangents} in forward mode",
        files.len()
    );
    assert!(tangents > 0, "no corpus program reached the forward-mode check");
    assert!(gradchecked > 0, "no corpus program reached the finite-difference check");
    assert!(second > 0, "no corpus program reached the second-order check");
}

#[test]
fn tensor_io_corpus_replays_clean() {
    let files = corpus("tensor_io");
    assert!(files.len() >= 5, "the seed corpus is missing: {} files", files.len());
    for (name, bytes) in &files {
        if let Err(finding) = run_tensor_io(bytes) {
            panic!("{name}: {finding}");
        }
    }
}

/// The checkpoint half of the `tensor_io` target: `tapir_nn::io::read_checkpoint`.
#[test]
fn tensor_io_corpus_loads_checkpoints_or_fails_cleanly() {
    let files = corpus("tensor_io");
    let mut loaded = 0;
    for (name, bytes) in &files {
        if let Err(finding) = run_checkpoint_io(bytes) {
            panic!("{name}: {finding}");
        }
        loaded += usize::from(tapir_nn::io::read_checkpoint::<f32>(bytes).is_ok());
    }
    assert!(loaded > 0, "no corpus file is a valid checkpoint");
}

/// The `optimizer_io` target's body on hostile-but-parseable state (a NaN, negative or
/// huge learning rate, a step counter at `u64::MAX`, a wrong kind), on the other targets'
/// checkpoint corpus, and on a few raw byte strings.
#[test]
fn optimizer_io_replays_clean() {
    let mut inputs: Vec<(String, Vec<u8>)> =
        seeds().into_iter().enumerate().map(|(i, b)| (format!("seed {i}"), b)).collect();
    inputs.extend(corpus("tensor_io"));
    for raw in [&b""[..], b"\x08\0\0\0\0\0\0\0{}      ", b"\xff\xff\xff\xff\xff\xff\xff\xff"] {
        inputs.push((format!("{raw:?}"), raw.to_vec()));
    }
    for (name, bytes) in &inputs {
        if let Err(finding) = run_optimizer_io(bytes) {
            panic!("{name}: {finding}");
        }
    }
    assert!(inputs.len() >= 70, "{} inputs", inputs.len());
}
