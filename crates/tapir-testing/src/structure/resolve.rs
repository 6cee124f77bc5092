//! Resolves the paths of a [`Crate`] to files: the file-level import graph.
//!
//! A path's first segment decides where it starts: `crate` and `$crate` at the crate root,
//! `super` (repeated) at the parent, `self` here, a child module's name at that child, a
//! name bound by a `use` (a glob's included) at that use's path. Then module segments are
//! walked while they name child modules; the first that does not is the item, and the
//! item is looked up where it is *defined*: a `pub use` (or any `use`) that binds it is
//! followed, and so are globs. An item that cannot be found (one a macro generates) is
//! taken to be defined in the module's own file. Paths that start anywhere else (`std`,
//! other crates, local names) are not imports of this crate.

use super::parse::{Crate, Use};

/// How many `use` aliases one resolution may follow (a guard against alias loops).
const MAX_HOPS: usize = 16;

/// What a path names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A module itself (`use crate::kernels;`): no file is imported until an item is named.
    Module(usize),
    /// An item, with the file that defines it and whether a `use` in a crate root's own
    /// file was followed to find it (a root re-export).
    Item { file: usize, via_root: bool },
}

/// What a name in a module stands for.
enum Found {
    Target(Target),
    /// Bound by a `use` of something outside the crate.
    Outside,
    /// Neither defined, nor declared, nor imported.
    Missing,
}

impl Crate {
    /// What `segments`, written in module `module`, names; `None` outside this crate.
    pub(crate) fn resolve(&self, module: usize, segments: &[String]) -> Option<Target> {
        self.resolve_hops(module, segments, 0)
    }

    fn resolve_hops(&self, module: usize, segments: &[String], hops: usize) -> Option<Target> {
        let (first, rest) = segments.split_first()?;
        if hops > MAX_HOPS {
            return None;
        }
        let m = &self.modules[module];
        match first.as_str() {
            "crate" | "$crate" => self.walk(m.root, rest, hops),
            "self" => self.walk(module, rest, hops),
            "super" => {
                let mut at = m.parent?;
                let mut rest = rest;
                while rest.first().is_some_and(|s| s == "super") {
                    at = self.modules[at].parent?;
                    rest = &rest[1..];
                }
                self.walk(at, rest, hops)
            }
            name => match self.find(module, name, hops) {
                Found::Target(Target::Module(inner)) => self.walk(inner, rest, hops),
                // The `use` that bound the name answers for a root re-export, not each use.
                Found::Target(Target::Item { file, .. }) => Some(Target::Item { file, via_root: false }),
                Found::Outside | Found::Missing => None,
            },
        }
    }

    /// Walks `rest` down from module `at`: module segments, then at most one item.
    fn walk(&self, mut at: usize, rest: &[String], hops: usize) -> Option<Target> {
        for segment in rest {
            match self.find(at, segment, hops) {
                Found::Target(Target::Module(inner)) => at = inner,
                Found::Target(item) => return Some(item),
                Found::Outside => return None,
                // An item a macro makes (or a typo the compiler reports): this module's file.
                Found::Missing => return Some(Target::Item { file: self.modules[at].file, via_root: false }),
            }
        }
        Some(Target::Module(at))
    }

    /// What `name` stands for in module `at`: a definition, a child, a `use`, a glob.
    fn find(&self, at: usize, name: &str, hops: usize) -> Found {
        self.find_in(at, name, hops, &mut vec![])
    }

    /// [`Self::find`], skipping the modules in `seen` (globs may import each other).
    fn find_in(&self, at: usize, name: &str, hops: usize, seen: &mut Vec<usize>) -> Found {
        let m = &self.modules[at];
        seen.push(at);
        if hops > MAX_HOPS {
            return Found::Missing;
        }
        if let Some(&child) = m.children.get(name) {
            return Found::Target(Target::Module(child));
        }
        if let Some(&file) = m.items.get(name) {
            return Found::Target(Target::Item { file, via_root: false });
        }
        let at_root = m.parent.is_none();
        let mark = |target: Target| match target {
            Target::Item { file, via_root } => Target::Item { file, via_root: via_root || at_root },
            module => module,
        };
        if let Some(u) = m.uses.iter().find(|u| u.alias.as_deref() == Some(name)) {
            return match self.resolve_hops(at, &u.path, hops + 1) {
                Some(target) => Found::Target(mark(target)),
                None => Found::Outside,
            };
        }
        for u in m.uses.iter().filter(|u| u.glob) {
            if let Some(Target::Module(source)) = self.resolve_hops(at, &u.path, hops + 1) {
                if !seen.contains(&source) {
                    match self.find_in(source, name, hops + 1, seen) {
                        Found::Target(target) => return Found::Target(mark(target)),
                        Found::Outside => return Found::Outside,
                        Found::Missing => {}
                    }
                }
            }
        }
        Found::Missing
    }

    /// Whether a `use` is a re-export of the declaring module's own descendants (`pub use
    /// child::X` in a folder's `mod.rs`, or in `lib.rs`): an alias, not an import.
    pub(crate) fn reexports_own_child(&self, module: usize, u: &Use) -> bool {
        u.public
            && match u.path.first().map(String::as_str) {
                Some("self") => true,
                Some(first) => self.modules[module].children.contains_key(first),
                None => false,
            }
    }
}
