//! The import graph's checks: layers, circles (Tarjan's strongly connected components,
//! each shown with one shortest loop), line counts, and the workspace's file list.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::io;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::parse::Crate;
use super::report::{Finding, Import, Layers, MAX_LINES};
use super::resolve::Target;

/// Every import of `krate` from one file to another, sorted and deduplicated.
pub(crate) fn imports(krate: &Crate) -> Vec<Import> {
    let mut out = BTreeSet::new();
    let item = |module: usize, line: usize, segments: &[String]| {
        let Some(Target::Item { file, via_root }) = krate.resolve(module, segments) else { return None };
        let from = krate.modules[module].file;
        // `$crate` paths serve other crates, through public paths only.
        let via_root = via_root && segments.first().is_some_and(|s| s != "$crate");
        // An import of the file itself is none, unless it came in through the root.
        (file != from || via_root).then(|| Import {
            from: krate.files[from].clone(),
            line,
            path: segments.join("::"),
            to: krate.files[file].clone(),
            via_root,
        })
    };
    for (id, module) in krate.modules.iter().enumerate() {
        for u in &module.uses {
            if krate.reexports_own_child(id, u) {
                continue;
            }
            if u.glob {
                // A glob imports the module file it names.
                if let Some(Target::Module(source)) = krate.resolve(id, &u.path) {
                    let (from, to) = (module.file, krate.modules[source].file);
                    if from != to {
                        let mut path = u.path.join("::");
                        path.push_str("::*");
                        let (from, to) = (krate.files[from].clone(), krate.files[to].clone());
                        out.insert(Import { from, line: u.line, path, to, via_root: false });
                    }
                }
            } else {
                out.extend(item(id, u.line, &u.path));
            }
        }
    }
    for p in &krate.paths {
        out.extend(item(p.module, p.line, &p.segments));
    }
    out.into_iter().collect()
}

/// The layer of `file` (relative to `src`): its longest matching entry's.
pub(crate) fn layer_of(layers: Layers<'_>, file: &str) -> Option<u8> {
    layers
        .iter()
        .filter(|(key, _)| file == *key || file.strip_prefix(key).is_some_and(|rest| rest.starts_with('/')))
        .max_by_key(|(key, _)| key.len())
        .map(|&(_, layer)| layer)
}

/// The findings of [`check_sources`](super::check_sources).
pub(crate) fn check(krate: &Crate, layers: Option<Layers<'_>>) -> Vec<Finding> {
    let mut findings = vec![];
    for &(file, line) in &krate.path_attributes {
        findings.push(Finding::PathAttribute(krate.files[file].clone(), line));
    }
    let imports = imports(krate);
    let root_files: BTreeSet<usize> = krate.modules.iter().filter(|m| m.parent.is_none()).map(|m| m.file).collect();
    for import in imports.iter().filter(|i| i.via_root) {
        if !root_files.iter().any(|&f| krate.files[f] == import.from) {
            findings.push(Finding::ThroughRoot(import.clone()));
        }
    }
    let layer = |file: &str| layers.and_then(|l| layer_of(l, file));
    if let Some(table) = layers {
        for file in krate.files.iter().filter(|f| layer_of(table, f).is_none()) {
            findings.push(Finding::NoLayer(file.clone()));
        }
        for import in &imports {
            if let (Some(from_layer), Some(to_layer)) = (layer(&import.from), layer(&import.to)) {
                if to_layer > from_layer {
                    findings.push(Finding::Upward { import: import.clone(), from_layer, to_layer });
                }
            }
        }
    }
    // Circles: with layers, among the edges within one layer (a circle across layers has
    // an upward edge, reported above); without, among all edges.
    let edges: Vec<&Import> = imports.iter().filter(|i| layers.is_none() || layer(&i.from) == layer(&i.to)).collect();
    for files in circles(&edges) {
        let cycle = shortest_cycle(&files, &edges);
        findings.push(Finding::Circle { files, cycle });
    }
    findings
}

/// The strongly connected components of more than one file (Tarjan's algorithm).
fn circles(edges: &[&Import]) -> Vec<Vec<String>> {
    let mut next: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for e in edges {
        next.entry(&e.from).or_default().insert(&e.to);
        next.entry(&e.to).or_default();
    }
    struct Tarjan<'a> {
        next: &'a BTreeMap<&'a str, BTreeSet<&'a str>>,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        out: Vec<Vec<String>>,
    }
    impl<'a> Tarjan<'a> {
        fn visit(&mut self, v: &'a str) {
            let n = self.index.len();
            self.index.insert(v, n);
            self.low.insert(v, n);
            self.stack.push(v);
            for &w in &self.next[v] {
                if !self.index.contains_key(w) {
                    self.visit(w);
                    let low = self.low[v].min(self.low[w]);
                    self.low.insert(v, low);
                } else if self.stack.contains(&w) {
                    let low = self.low[v].min(self.index[w]);
                    self.low.insert(v, low);
                }
            }
            if self.low[v] == self.index[v] {
                let at = self.stack.iter().rposition(|&x| x == v).expect("v is on the stack");
                let mut scc: Vec<String> = self.stack.drain(at..).map(str::to_string).collect();
                if scc.len() > 1 {
                    scc.sort();
                    self.out.push(scc);
                }
            }
        }
    }
    let mut t = Tarjan { next: &next, index: BTreeMap::new(), low: BTreeMap::new(), stack: vec![], out: vec![] };
    for &v in next.keys() {
        if !t.index.contains_key(v) {
            t.visit(v);
        }
    }
    t.out.sort();
    t.out
}

/// A shortest loop from the first of `files` back to it, inside `files` (breadth-first).
fn shortest_cycle(files: &[String], edges: &[&Import]) -> Vec<Import> {
    let inside = |f: &str| files.iter().any(|x| x == f);
    let start = files[0].as_str();
    let mut came: BTreeMap<&str, &Import> = BTreeMap::new();
    let mut queue = VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for e in edges.iter().filter(|e| e.from == v && inside(&e.to)) {
            if e.to == start {
                let mut cycle = vec![(*e).clone()];
                let mut at = v;
                while at != start {
                    let step = came[at];
                    cycle.push(step.clone());
                    at = &step.from;
                }
                cycle.reverse();
                return cycle;
            }
            if !came.contains_key(e.to.as_str()) {
                came.insert(&e.to, e);
                queue.push_back(&e.to);
            }
        }
    }
    vec![]
}

/// Every file of `files` (relative to `root`) with more than [`MAX_LINES`] lines.
pub fn check_sizes(root: &Path, files: &[PathBuf]) -> io::Result<Vec<Finding>> {
    let mut findings = vec![];
    for file in files {
        let lines = std::fs::read_to_string(root.join(file))?.lines().count();
        if lines > MAX_LINES {
            let file = file.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("/");
            findings.push(Finding::TooLong { file, lines });
        }
    }
    Ok(findings)
}

/// The workspace's `.rs` files that [`check_sizes`] covers, relative to `root`: those in
/// `crates/*/{src,tests,examples}`, `benches/` and `fuzz/`, but not in a `fixtures`
/// folder. Git's list (tracked files, and untracked ones it does not ignore) when `git`
/// runs, else a walk that skips `target` folders.
pub fn workspace_rs_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    let covered = |path: &str| {
        let parts: Vec<&str> = path.split('/').collect();
        path.ends_with(".rs")
            && !parts.contains(&"fixtures")
            && !parts.contains(&"target")
            && (matches!(parts[0], "benches" | "fuzz")
                || (parts[0] == "crates" && parts.len() > 3 && matches!(parts[2], "src" | "tests" | "examples")))
    };
    let git = Command::new("git")
        .args(["ls-files", "--cached", "--others", "--exclude-standard", "-z"])
        .current_dir(root)
        .output();
    let mut files: Vec<String> = match git {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .split('\0')
            .filter(|p| root.join(p).is_file())
            .map(str::to_string)
            .collect(),
        _ => {
            let mut found = vec![];
            let mut dirs = vec![root.to_path_buf()];
            while let Some(dir) = dirs.pop() {
                for entry in std::fs::read_dir(&dir)? {
                    let path = entry?.path();
                    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
                    if path.is_dir() && name != "target" && !name.starts_with('.') {
                        dirs.push(path);
                    } else if path.is_file() {
                        let rel = path.strip_prefix(root).expect("walked from root");
                        found.push(rel.iter().map(|c| c.to_string_lossy()).collect::<Vec<_>>().join("/"));
                    }
                }
            }
            found
        }
    };
    files.retain(|p| covered(p));
    files.sort();
    Ok(files.into_iter().map(PathBuf::from).collect())
}
