//! The structure checker: one-way layering, no import circles, and files of at most
//! [`MAX_LINES`] lines (issue #34; the rules are in `design/layering.md`).
//!
//! [`check_crate`] reads a crate's `src/` folder, follows its `mod` declarations from
//! `lib.rs` (or `main.rs`, or, in a folder with neither, every top-level file), and builds
//! the file-level import graph: an edge for every `use` and every path written in code
//! (`crate::ops::matmul::relinear(..)`, `super::super::x`, `$crate::y` in a macro, a child
//! module's `step::run`, a name a `use` bound) that names an item of another file. Items
//! are traced to the file that *defines* them, through `pub use` chains and globs, so a
//! folder's re-exporting `mod.rs` is a signpost, not a stop; a glob (`use super::*`)
//! imports the module file it names; a `#[cfg(test)]` module (inline or a file) is outside
//! the graph, since a unit test may drive its rule through the public API (its lines still
//! count for [`check_sizes`]). A `pub use` of the module's own children is an alias, not an edge.
//! It reports, as [`Finding`]s:
//!
//! - with a layer table, every import of a higher layer and every circle among the files
//!   of one layer; without one, every circle at all;
//! - every import of an item through a re-export in the crate root (`crate::Error` for an
//!   `Error` defined in `error.rs`): import it from its module instead (`$crate` paths in
//!   exported macros are exempt, since they must name public paths);
//! - every `#[path]` attribute, which the resolver does not follow;
//! - with a layer table, every file it does not cover.
//!
//! [`check_sizes`] reports files over [`MAX_LINES`] lines (every line counts, test blocks
//! included), and [`workspace_rs_files`] lists the files it should look at.
//!
//! Comments and literals are stripped by a hand-written lexer (`lex.rs`) rather than `syn`,
//! which would add a proc-macro-sized dependency to every cold build of the workspace for
//! one test.

mod graph;
mod lex;
mod parse;
mod report;
mod resolve;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use graph::{check_sizes, workspace_rs_files};
pub use report::{Finding, Import, Layers, MAX_LINES};

/// Reads every `.rs` file under `src` (path relative to `src` → text).
pub fn read_sources(src: &Path) -> io::Result<BTreeMap<String, String>> {
    let mut sources = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                let rel = path.strip_prefix(src).expect("read_dir yields paths under src");
                let rel = rel.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("/");
                sources.insert(rel, std::fs::read_to_string(&path)?);
            }
        }
    }
    Ok(sources)
}

/// The file-level imports of a crate's sources, sorted, one per path written that names
/// an item of another file.
pub fn imports(sources: &BTreeMap<String, String>) -> Vec<Import> {
    graph::imports(&parse::Crate::parse(sources))
}

/// Checks the crate whose sources are in `src` (see the module doc).
pub fn check_crate(src: &Path, layers: Option<Layers<'_>>) -> io::Result<Vec<Finding>> {
    Ok(check_sources(&read_sources(src)?, layers))
}

/// [`check_crate`] on sources already read (path relative to `src` → text).
pub fn check_sources(sources: &BTreeMap<String, String>, layers: Option<Layers<'_>>) -> Vec<Finding> {
    graph::check(&parse::Crate::parse(sources), layers)
}

/// Prints `findings` under `title` and returns how many there were.
pub fn print_findings(title: &str, findings: &[Finding]) -> usize {
    for finding in findings {
        println!("{title}: {finding}");
    }
    findings.len()
}

/// The workspace root: two folders above this crate's manifest.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).ancestors().nth(2).expect("the crate lives at crates/NAME").to_path_buf()
}

#[cfg(test)]
mod tests;
