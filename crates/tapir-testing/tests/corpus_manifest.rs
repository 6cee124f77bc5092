//! Every checked-in `tape_program` corpus file must keep decoding to the program it
//! decoded to when it was checked in. `fuzz/corpus-manifest/tape_program/MANIFEST` holds,
//! per file, a digest of the decoded program's `Debug` text; `regression-*.txt` holds the
//! full text of the `regression-*` seeds. `UPDATE_CORPUS_MANIFEST=1` rewrites them: do it
//! for new corpus files only (`git diff` must show added lines and nothing else), since a
//! changed line means the decoder broke its promise (see `tapir_testing::codes`). The one
//! expected change: a format-1 file whose program shows `Nop { code: c }` changes when
//! code `c` is assigned to an op.

use std::fmt::Write as _;
use std::path::PathBuf;

use tapir_testing::program::Program;

/// FNV-1a, 64 bits: a stable digest with no dependency.
fn fnv1a(text: &str) -> u64 {
    text.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fuzz")
}

#[test]
fn corpus_decodes_as_recorded() {
    let corpus = root().join("corpus/tape_program");
    let out = root().join("corpus-manifest/tape_program");
    let mut names: Vec<String> = std::fs::read_dir(&corpus)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| !n.starts_with('.'))
        .collect();
    names.sort();
    let mut manifest = String::new();
    let mut texts = vec![];
    for name in &names {
        let bytes = std::fs::read(corpus.join(name)).unwrap();
        let program = Program::from_bytes(&bytes);
        let text = format!("{program:?}");
        writeln!(manifest, "{:016x} {:>5} {name}", fnv1a(&text), bytes.len()).unwrap();
        if name.starts_with("regression-") {
            texts.push((format!("{name}.txt"), format!("{program:#?}\n")));
        }
    }
    if std::env::var_os("UPDATE_CORPUS_MANIFEST").is_some() {
        std::fs::write(out.join("MANIFEST"), &manifest).unwrap();
        for (file, text) in &texts {
            std::fs::write(out.join(file), text).unwrap();
        }
        return;
    }
    let recorded = std::fs::read_to_string(out.join("MANIFEST")).unwrap();
    let name_of = |line: &str| line.rsplit(' ').next().unwrap_or_default().to_string();
    let want: std::collections::BTreeMap<String, &str> = recorded.lines().map(|l| (name_of(l), l)).collect();
    for got in manifest.lines() {
        let name = name_of(got);
        match want.get(&name) {
            Some(&line) => assert_eq!(line, got, "{name} decodes to another program than when it was recorded"),
            None => panic!("{name} is not in the manifest: run with UPDATE_CORPUS_MANIFEST=1 and commit it"),
        }
    }
    assert_eq!(want.len(), manifest.lines().count(), "a corpus file in the manifest was removed");
    for (file, text) in &texts {
        let want = std::fs::read_to_string(out.join(file)).unwrap();
        assert_eq!(&want, text, "{file}: the seed decodes to another program");
    }
}
