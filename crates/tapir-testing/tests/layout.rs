//! Every integration-test file of the workspace's crates is built and run. The crates set
//! `autotests = false` and gather most test files as modules of one binary (see
//! crates/tapir/Cargo.toml), so a new `tests/*.rs` file that nobody declares would be
//! silently skipped: each must be a `mod` of its crate's suite or a `[[test]]` target.
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The crates whose integration tests are gathered, each with its suite's root file.
const CRATES: [(&str, &str); 3] = [("tapir", "engine"), ("tapir-nn", "layers"), ("tapir-testing", "suite")];

/// The `name = "..."` values of a manifest's `[[test]]` tables.
fn test_targets(manifest: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let mut in_test = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_test = line == "[[test]]";
        } else if let (true, Some(rest)) = (in_test, line.strip_prefix("name = \"")) {
            names.insert(rest.trim_end_matches('"').to_string());
        }
    }
    names
}

/// The `mod NAME;` lines of a suite's root file.
fn modules(root: &str) -> BTreeSet<String> {
    root.lines().filter_map(|line| line.trim().strip_prefix("mod ")?.strip_suffix(';').map(str::to_string)).collect()
}

#[test]
fn every_test_file_is_a_module_of_the_suite_or_a_target_of_its_own() {
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    for (krate, suite) in CRATES {
        let dir = crates.join(krate);
        let manifest = fs::read_to_string(dir.join("Cargo.toml")).unwrap();
        assert!(manifest.contains("autotests = false"), "{krate}: the suite layout expects autotests = false");
        let targets = test_targets(&manifest);
        assert!(targets.contains(suite), "{krate}: no [[test]] named {suite} in {targets:?}");
        let mods = modules(&fs::read_to_string(dir.join("tests").join(format!("{suite}.rs"))).unwrap());
        let files: BTreeSet<String> = fs::read_dir(dir.join("tests"))
            .unwrap()
            .map(|entry| entry.unwrap().path())
            .filter(|path| path.extension().is_some_and(|ext| ext == "rs"))
            .map(|path| path.file_stem().unwrap().to_string_lossy().into_owned())
            .collect();
        for file in &files {
            let as_module = mods.contains(file);
            let as_target = targets.contains(file);
            assert!(
                as_module != as_target,
                "{krate}/tests/{file}.rs must be either `mod {file};` in tests/{suite}.rs or a [[test]] \
                 target in Cargo.toml, not {}",
                if as_module { "both" } else { "neither" }
            );
        }
        for name in mods.iter().chain(&targets) {
            assert!(files.contains(name), "{krate}: {name} is declared but tests/{name}.rs does not exist");
        }
    }
}
