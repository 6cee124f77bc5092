//! The workspace's structure (issue #34, design/layering.md): imports in `crates/tapir`
//! point down its layers, no crate has an import circle, no `.rs` file is over 600 lines,
//! and the paths the docs name exist. The checker is `tapir_testing::structure`; the
//! fixture test proves it can fail.
use std::collections::BTreeMap;
use std::path::Path;

use tapir_testing::structure::{
    check_crate, check_sizes, print_findings, workspace_root, workspace_rs_files, Finding, Layers,
};

/// The layers of `crates/tapir/src` (docs/architecture.md, invariant 1): a file or folder
/// relative to `src` and its layer; a file takes its longest matching entry's layer and may
/// import only its own layer and those below. A file no entry covers is a finding, so a new
/// file or folder gets an entry here.
const CORE_LAYERS: Layers<'static> = &[
    // 0 vocabulary
    ("shape.rs", 0),
    ("dtype.rs", 0),
    ("error.rs", 0),
    ("threads.rs", 0),
    // 1 memory and math: slices in, slices out; no ids, no tape
    ("storage", 1),
    ("kernels", 1),
    ("tensor.rs", 1),
    ("params.rs", 1),
    // 2 the record; knows Op, not what runs it
    ("tape", 2),
    // 3 handles, the recorder, what rules see, the plug-in interfaces
    ("record", 3),
    // 4 rules only
    ("ops", 4),
    // 5 runs tapes: the backward walk, custom-op dispatch, checkpoint replay
    ("engine", 5),
    // 6 the public API
    ("graph", 6),
    ("func", 6),
    ("testing.rs", 6),
    ("mono.rs", 6),
    ("lib.rs", 6),
];

/// The crates (and crate-like folders) with no layer table: no import circle at all.
const UNLAYERED: [&str; 10] = [
    "crates/tapir-derive/src",
    "crates/tapir-nn/src",
    "crates/tapir-py/src",
    "crates/tapir-dist/src",
    "crates/tapir-testing/src",
    "benches/src",
    "benches/benches",
    "benches/examples",
    "benches/compare/src",
    "fuzz/fuzz_targets",
];

fn fail_on(title: &str, findings: &[Finding]) {
    let n = print_findings(title, findings);
    assert_eq!(n, 0, "{title}: {n} findings, printed above");
}

#[test]
fn core_layers_point_down() {
    let findings = check_crate(&workspace_root().join("crates/tapir/src"), Some(CORE_LAYERS)).unwrap();
    fail_on("crates/tapir", &findings);
}

#[test]
fn no_import_circle_in_any_crate() {
    let root = workspace_root();
    let mut all = vec![];
    for dir in UNLAYERED.iter().filter(|d| root.join(d).is_dir()) {
        for finding in check_crate(&root.join(dir), None).unwrap() {
            println!("{dir}: {finding}");
            all.push(finding);
        }
    }
    assert!(all.is_empty(), "{} findings, printed above", all.len());
}

#[test]
fn files_are_at_most_600_lines() {
    let root = workspace_root();
    let files = workspace_rs_files(&root).unwrap();
    for krate in ["crates/tapir/src/lib.rs", "crates/tapir-py/src/lib.rs"] {
        assert!(files.iter().any(|f| f.ends_with(krate)), "the file list misses {krate}");
    }
    fail_on("size", &check_sizes(&root, &files).unwrap());
}

#[test]
fn the_fixture_has_exactly_its_three_planted_faults() {
    let fixture = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/layering");
    let layers: Layers<'_> = &[("lib.rs", 2), ("low.rs", 0), ("long.rs", 0), ("high", 1)];
    let mut findings = check_crate(&fixture.join("tree"), Some(layers)).unwrap();
    let files: Vec<_> = ["lib.rs", "low.rs", "long.rs", "high/mod.rs", "high/a.rs", "high/b.rs"]
        .iter()
        .map(|f| Path::new("tree").join(f))
        .collect();
    findings.extend(check_sizes(&fixture, &files).unwrap());
    print_findings("fixture", &findings);
    assert_eq!(findings.len(), 3, "{findings:#?}");
    assert!(
        matches!(&findings[0], Finding::Upward { import, from_layer: 0, to_layer: 1 }
            if import.from == "low.rs" && import.line == 9 && import.path == "crate::high::a::A" && import.to == "high/a.rs"),
        "{:?}",
        findings[0]
    );
    assert!(
        matches!(&findings[1], Finding::Circle { files, cycle } if *files == ["high/a.rs", "high/b.rs"] && cycle.len() == 2),
        "{:?}",
        findings[1]
    );
    assert_eq!(findings[2], Finding::TooLong { file: "tree/long.rs".into(), lines: 601 });
}

/// The docs whose paths must exist.
const DOCS: [&str; 2] = ["docs/architecture.md", "docs/adding-an-op.md"];

/// Every path in backticks in [`DOCS`] exists. A backticked span outside fenced code
/// blocks is a path when it has no whitespace, is made of `A-Za-z0-9_.-/` (plus one
/// `{a,b}` group, expanded) and either contains a `/` after a component with a letter
/// (`ops/`, `crates/tapir`, not `1/n`) or ends in `.rs`, `.md` or `.toml`. It exists when
/// it names a file or folder relative to the repository root, to any crate folder
/// `crates/*/` (`tests/engine.rs`) or to any crate's `crates/*/src/` (docs name core files
/// as `ops/mul.rs`, tapir-testing's as `program/interpret.rs`); a bare file name
/// (`step.rs`) exists when a file of that name is anywhere under `crates/*/src/`.
#[test]
fn doc_paths_exist() {
    let root = workspace_root();
    let crates: Vec<_> = std::fs::read_dir(root.join("crates")).unwrap().map(|e| e.unwrap().path()).collect();
    let srcs: Vec<_> = crates.iter().map(|c| c.join("src")).filter(|p| p.is_dir()).chain(crates.clone()).collect();
    let names: Vec<String> = workspace_rs_files(&root)
        .unwrap()
        .iter()
        .filter(|f| f.starts_with("crates") && f.components().nth(2).is_some_and(|c| c.as_os_str() == "src"))
        .filter_map(|f| Some(f.file_name()?.to_string_lossy().into_owned()))
        .collect();
    let mut missing = BTreeMap::new();
    for doc in DOCS {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        let mut fenced = false;
        let prose: String = text
            .lines()
            .filter(|line| {
                fenced ^= line.trim_start().starts_with("```");
                !fenced && !line.trim_start().starts_with("```")
            })
            .collect::<Vec<_>>()
            .join("\n");
        for span in prose.split('`').skip(1).step_by(2) {
            for path in doc_path(span) {
                let found = root.join(&path).exists()
                    || srcs.iter().any(|src| src.join(&path).exists())
                    || (!path.contains('/') && names.contains(&path));
                if !found {
                    missing.entry(path).or_insert_with(Vec::new).push(doc);
                }
            }
        }
    }
    for (path, docs) in &missing {
        println!("docs: `{path}` in {docs:?} names no file");
    }
    assert!(missing.is_empty(), "{} doc paths name no file, printed above", missing.len());
}

/// The paths a backticked span names (see [`doc_paths_exist`]), or none.
fn doc_path(span: &str) -> Vec<String> {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_.-/".contains(c);
    let expanded: Vec<String> = match (span.find('{'), span.find('}')) {
        (Some(open), Some(close)) if open < close => span[open + 1..close]
            .split(',')
            .map(|alt| format!("{}{}{}", &span[..open], alt.trim(), &span[close + 1..]))
            .collect(),
        _ => vec![span.to_string()],
    };
    expanded
        .into_iter()
        .filter(|p| !p.is_empty() && p.chars().all(ok))
        .filter(|p| {
            let first = p.split('/').next().unwrap_or_default();
            let dir = p.contains('/') && first.chars().any(|c| c.is_ascii_alphabetic());
            dir || [".rs", ".md", ".toml"].iter().any(|ext| p.ends_with(ext))
        })
        .collect()
}
