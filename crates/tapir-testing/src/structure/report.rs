//! What the checker reports: [`Finding`]s and the [`Import`]s they name.

use std::fmt;

/// The most lines a `.rs` file may have.
pub const MAX_LINES: usize = 600;

/// A layer table: a file or folder path relative to `src` (`"shape.rs"`, `"kernels"`,
/// `"kernels/vmath.rs"`) and its layer; a file takes the layer of its longest matching
/// entry, and may import only its own layer and the layers below it.
pub type Layers<'a> = &'a [(&'a str, u8)];

/// A file-level import: `from` names `path` on `line`, which is defined in `to`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Import {
    /// The importing file, relative to `src`.
    pub from: String,
    /// The line of the `use` or of the path in code.
    pub line: usize,
    /// The path as written, `::`-joined (a `use` tree's leaf, from its root).
    pub path: String,
    /// The file that defines what the path names.
    pub to: String,
    /// Whether the path went through a re-export in the crate root.
    pub via_root: bool,
}

impl fmt::Display for Import {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{} `{}` -> {}", self.from, self.line, self.path, self.to)
    }
}

/// Something the checker objects to.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Finding {
    /// An import of a higher layer.
    Upward {
        /// The import.
        import: Import,
        /// The importing file's layer.
        from_layer: u8,
        /// The imported file's layer.
        to_layer: u8,
    },
    /// Files that import each other in a circle (within one layer, given a layer table).
    Circle {
        /// Every file of the circle (a strongly connected component), sorted.
        files: Vec<String>,
        /// One loop through them, an import per step.
        cycle: Vec<Import>,
    },
    /// An item imported through the crate root's re-export rather than from its module.
    ThroughRoot(Import),
    /// A file that no entry of the layer table covers.
    NoLayer(String),
    /// A `#[path]` attribute, at a file and line.
    PathAttribute(String, usize),
    /// A file over [`MAX_LINES`] lines.
    TooLong {
        /// The file, relative to the folder given to [`check_sizes`](super::check_sizes).
        file: String,
        /// Its line count.
        lines: usize,
    },
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Finding::Upward { import, from_layer, to_layer } => {
                write!(f, "upward import (layer {from_layer} imports layer {to_layer}): {import}")
            }
            Finding::Circle { files, cycle } => {
                write!(f, "import circle of {} files: {}", files.len(), files.join(", "))?;
                for import in cycle {
                    write!(f, "\n    {import}")?;
                }
                Ok(())
            }
            Finding::ThroughRoot(import) => {
                write!(f, "import through the crate root's re-export (import it from its module): {import}")
            }
            Finding::NoLayer(file) => write!(f, "no entry of the layer table covers {file}"),
            Finding::PathAttribute(file, line) => write!(f, "#[path] attribute at {file}:{line}"),
            Finding::TooLong { file, lines } => write!(f, "{file} has {lines} lines (at most {MAX_LINES})"),
        }
    }
}
