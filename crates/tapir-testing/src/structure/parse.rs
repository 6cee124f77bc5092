//! The module tree of one crate, read from its files' tokens: which module each file and
//! inline `mod x { .. }` is, the items each module defines, its `use` declarations, and
//! every path written in code that may name something of the crate.

use std::collections::{BTreeMap, VecDeque};

use super::lex::{lex, Tok, Token};

/// Keywords that define a named item in a module's body.
const ITEM_KEYWORDS: [&str; 8] = ["fn", "struct", "enum", "trait", "type", "const", "static", "union"];

/// A module: a file, or an inline `mod x { .. }` inside one.
#[derive(Debug)]
pub(crate) struct Module {
    /// Index of its file in [`Crate::files`].
    pub(crate) file: usize,
    pub(crate) parent: Option<usize>,
    /// The crate root module this module belongs to.
    pub(crate) root: usize,
    /// Where its `mod x;` children live, relative to `src`, without a trailing `/`.
    dir: String,
    pub(crate) children: BTreeMap<String, usize>,
    /// Items defined here, each with the file that defines it (an exported macro's file).
    pub(crate) items: BTreeMap<String, usize>,
    pub(crate) uses: Vec<Use>,
    /// Declared under `#[cfg(test)]` (or inside such a module): outside the import graph.
    test: bool,
}

/// One leaf of a `use` tree.
#[derive(Clone, Debug)]
pub(crate) struct Use {
    pub(crate) line: usize,
    /// The full path, from the tree's root to the leaf (`self` leaves dropped).
    pub(crate) path: Vec<String>,
    /// The name it binds; `None` for a glob or `as _`.
    pub(crate) alias: Option<String>,
    pub(crate) glob: bool,
    /// `pub`, `pub(crate)`, `pub(super)` or `pub(in ..)`: a re-export.
    pub(crate) public: bool,
}

/// A path written in code (not in a `use`), such as `crate::ops::matmul::relinear`.
#[derive(Clone, Debug)]
pub(crate) struct CodePath {
    pub(crate) module: usize,
    pub(crate) line: usize,
    pub(crate) segments: Vec<String>,
}

/// A crate's module tree.
#[derive(Debug, Default)]
pub(crate) struct Crate {
    /// Paths relative to `src`, `/`-separated; only files reached by `mod` declarations.
    pub(crate) files: Vec<String>,
    pub(crate) modules: Vec<Module>,
    /// The module of each file (its outermost one).
    pub(crate) file_module: Vec<usize>,
    pub(crate) paths: Vec<CodePath>,
    /// `#[path]` attributes: file index and line.
    pub(crate) path_attributes: Vec<(usize, usize)>,
}

impl Crate {
    /// Reads the module trees of `sources` (path relative to `src` → text). The roots are
    /// `lib.rs` and `main.rs`; a folder with neither (a `benches/` target folder) makes
    /// every top-level file that no other file declares a root.
    pub(crate) fn parse(sources: &BTreeMap<String, String>) -> Crate {
        let mut krate = Crate::default();
        let mut roots: Vec<&str> = ["lib.rs", "main.rs"].into_iter().filter(|r| sources.contains_key(*r)).collect();
        if roots.is_empty() {
            roots = sources.keys().map(String::as_str).filter(|p| !p.contains('/')).collect();
        }
        let mut queue = VecDeque::new();
        for root in roots {
            if krate.files.iter().any(|f| f == root) {
                continue;
            }
            let module = krate.new_file_module(root, None);
            queue.push_back(module);
            while let Some(module) = queue.pop_front() {
                let file = krate.modules[module].file;
                let tokens = lex(&sources[&krate.files[file]]);
                for child in krate.read_file(module, &tokens, sources) {
                    queue.push_back(child);
                }
            }
        }
        krate
    }

    fn new_file_module(&mut self, path: &str, parent: Option<(usize, &str)>) -> usize {
        let file = self.files.len();
        self.files.push(path.to_string());
        let stem = path.strip_suffix(".rs").unwrap_or(path);
        let name = stem.rsplit('/').next().unwrap_or(stem);
        let dir = if matches!(name, "lib" | "main" | "mod") || parent.is_none() {
            stem.rsplit_once('/').map_or(String::new(), |(dir, _)| dir.to_string())
        } else {
            stem.to_string()
        };
        let module = self.new_module(file, parent, dir);
        self.file_module.push(module);
        module
    }

    fn new_module(&mut self, file: usize, parent: Option<(usize, &str)>, dir: String) -> usize {
        let id = self.modules.len();
        let root = parent.map_or(id, |(p, _)| self.modules[p].root);
        let test = parent.is_some_and(|(p, _)| self.modules[p].test);
        self.modules.push(Module {
            file,
            parent: parent.map(|(p, _)| p),
            root,
            dir,
            children: BTreeMap::new(),
            items: BTreeMap::new(),
            uses: vec![],
            test,
        });
        if let Some((p, name)) = parent {
            self.modules[p].children.insert(name.to_string(), id);
        }
        id
    }

    /// Reads one file's tokens into `module` and the inline modules inside it; returns
    /// the modules of the files it declares with `mod x;`, still to be read.
    fn read_file(&mut self, module: usize, t: &[Token], sources: &BTreeMap<String, String>) -> Vec<usize> {
        let file = self.modules[module].file;
        let ident = |i: usize| t.get(i).and_then(Token::ident);
        let is = |i: usize, c: char| t.get(i).is_some_and(|tok| tok.is(c));
        let sep = |i: usize| t.get(i).is_some_and(|tok| tok.tok == Tok::PathSep);
        let mut declared = vec![];
        // (module, brace depth of its body)
        let mut frames = vec![(module, 0usize)];
        let mut depth = 0;
        let mut public_at = usize::MAX;
        let mut exported = false;
        // A `#[cfg(test)]` seen since the last item: the next `mod` is a test module.
        let mut cfg_test = false;
        let mut i = 0;
        while i < t.len() {
            let (current, body) = *frames.last().expect("the file's own frame is never popped");
            if is(i, '#') && (is(i + 1, '[') || (is(i + 1, '!') && is(i + 2, '['))) {
                let open = if is(i + 1, '[') { i + 1 } else { i + 2 };
                match ident(open + 1) {
                    Some("path") => self.path_attributes.push((file, t[i].line)),
                    Some("macro_export") => exported = true,
                    Some("cfg") if is(open + 2, '(') && ident(open + 3) == Some("test") && is(open + 4, ')') => {
                        cfg_test = true;
                    }
                    _ => {}
                }
                i = skip_group(t, open);
                continue;
            }
            // Carried past `pub` to the item it qualifies.
            let test_attr = std::mem::take(&mut cfg_test);
            cfg_test = test_attr && ident(i) == Some("pub");
            match ident(i) {
                Some("pub") => {
                    i = if is(i + 1, '(') { skip_group(t, i + 1) } else { i + 1 };
                    public_at = i;
                    continue;
                }
                Some("use") if !is(i + 1, '<') => {
                    let mut leaves = vec![];
                    let end = use_tree(t, i + 1, vec![], &mut leaves);
                    let test = self.modules[current].test;
                    for (path, alias, glob) in leaves.into_iter().filter(|_| !test) {
                        let public = public_at == i;
                        self.modules[current].uses.push(Use { line: t[i].line, path, alias, glob, public });
                    }
                    i = end;
                    continue;
                }
                Some("mod") if depth == body => {
                    if let Some(name) = ident(i + 1) {
                        if is(i + 2, ';') {
                            let dir = &self.modules[current].dir;
                            let prefix = if dir.is_empty() { String::new() } else { format!("{dir}/") };
                            let candidates = [format!("{prefix}{name}.rs"), format!("{prefix}{name}/mod.rs")];
                            if let Some(path) = candidates.iter().find(|p| sources.contains_key(*p)) {
                                if !self.files.contains(path) {
                                    let child = self.new_file_module(path, Some((current, name)));
                                    self.modules[child].test |= test_attr;
                                    declared.push(child);
                                }
                            }
                            i += 3;
                            continue;
                        }
                        if is(i + 2, '{') {
                            let dir =
                                format!("{}/{name}", self.modules[current].dir).trim_start_matches('/').to_string();
                            let inner = self.new_module(file, Some((current, name)), dir);
                            self.modules[inner].test |= test_attr;
                            depth += 1;
                            frames.push((inner, depth));
                            i += 3;
                            continue;
                        }
                    }
                }
                Some("macro_rules") if is(i + 1, '!') => {
                    if let Some(name) = ident(i + 2) {
                        self.modules[current].items.insert(name.to_string(), file);
                        if exported {
                            let root = self.modules[current].root;
                            self.modules[root].items.insert(name.to_string(), file);
                        }
                    }
                    exported = false;
                }
                Some(kw) if depth == body && ITEM_KEYWORDS.contains(&kw) => {
                    if let Some(name) = ident(i + 1).filter(|n| !ITEM_KEYWORDS.contains(n)) {
                        self.modules[current].items.insert(name.to_string(), file);
                    }
                }
                _ => {}
            }
            let dollar_crate = is(i, '$') && ident(i + 1) == Some("crate");
            let start = i + usize::from(dollar_crate);
            let after_path = i > 0 && (sep(i - 1) || is(i - 1, '.'));
            if ident(start).is_some() && sep(start + 1) && !after_path {
                let mut segments = vec![];
                let mut j = start;
                while let Some(name) = ident(j) {
                    segments.push(if dollar_crate && j == start { "$crate".to_string() } else { name.to_string() });
                    if !sep(j + 1) {
                        break;
                    }
                    j += 2;
                }
                if !self.modules[current].test {
                    self.paths.push(CodePath { module: current, line: t[i].line, segments });
                }
                i = j + 1;
                continue;
            }
            if is(i, '{') {
                depth += 1;
            } else if is(i, '}') {
                depth = depth.saturating_sub(1);
                while frames.len() > 1 && frames.last().is_some_and(|&(_, b)| b > depth) {
                    frames.pop();
                }
            }
            i += 1;
        }
        declared
    }
}

/// The index after the group that opens at `open` (`(`, `[` or `{`), nesting counted.
fn skip_group(t: &[Token], open: usize) -> usize {
    let mut depth = 0usize;
    let mut i = open;
    while i < t.len() {
        match t[i].tok {
            Tok::Punct('(' | '[' | '{') => depth += 1,
            Tok::Punct(')' | ']' | '}') => {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
            _ => {}
        }
        i += 1;
    }
    i
}

/// Reads one use tree starting at `i` under `prefix` into `out` as (path, alias, glob);
/// returns the index after it (after the `;` at the top level).
fn use_tree(
    t: &[Token],
    mut i: usize,
    mut path: Vec<String>,
    out: &mut Vec<(Vec<String>, Option<String>, bool)>,
) -> usize {
    let top = path.is_empty();
    let finish = |i: usize| if top && t.get(i).is_some_and(|tok| tok.is(';')) { i + 1 } else { i };
    if t.get(i).is_some_and(|tok| tok.tok == Tok::PathSep) {
        // `use ::name`: an external crate, never this one.
        path.push("::".to_string());
        i += 1;
    }
    loop {
        match t.get(i).map(|tok| &tok.tok) {
            Some(Tok::Punct('{')) => {
                i += 1;
                while let Some(tok) = t.get(i) {
                    if tok.is('}') {
                        i += 1;
                        break;
                    }
                    i = use_tree(t, i, path.clone(), out);
                    if t.get(i).is_some_and(|tok| tok.is(',')) {
                        i += 1;
                    } else if !t.get(i).is_some_and(|tok| tok.is('}')) {
                        // Not a use tree after all; give up on the rest of the group.
                        i += 1;
                    }
                }
                return finish(i);
            }
            Some(Tok::Punct('*')) => {
                out.push((path, None, true));
                return finish(i + 1);
            }
            Some(Tok::Punct('$')) if t.get(i + 1).and_then(Token::ident) == Some("crate") => {
                path.push("$crate".to_string());
                i += 2;
            }
            Some(Tok::Ident(name)) => {
                path.push(name.clone());
                i += 1;
            }
            _ => return finish(i),
        }
        if t.get(i).is_some_and(|tok| tok.tok == Tok::PathSep) {
            i += 1;
            continue;
        }
        if path.last().is_some_and(|s| s == "self") {
            path.pop();
        }
        let mut alias = path.last().cloned();
        if t.get(i).and_then(Token::ident) == Some("as") {
            alias = t.get(i + 1).and_then(Token::ident).filter(|a| *a != "_").map(str::to_string);
            i += 2;
        }
        out.push((path, alias, false));
        return finish(i);
    }
}
