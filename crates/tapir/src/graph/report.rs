//! What a scope holds, for people: [`Scope::memory_report`] (where its memory went, by op
//! kind), [`Scope::dump`] (the tape as SSA text) and [`Scope::to_dot`] (Graphviz).
//!
//! Every node's value is counted under its op's name (`matmul`, `relu`, ...), and so is
//! its gradient once a backward pass has made one. Some values share memory with an
//! owner rather than occupying their own: parameters and gradient-requesting leaves borrow
//! their tensors, and `reshape` (also `squeeze`, `unsqueeze`) aliases its input. Those are
//! listed with `shared = true` and left out of [`MemoryReport::owned_bytes`]. The `leaf`
//! kind mixes constants the scope made (in the arena) with inputs it borrows and detached
//! views, so it counts as owned; the arena's own figures in [`MemoryReport::arena`] are
//! exact.

use std::fmt;

use crate::dtype::Float;
use crate::record::handles::Scope;
use crate::storage::ArenaStats;
use crate::tape::op::Op;

/// One op kind's share of a scope's memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpMemory {
    /// The op's name, as in [`Scope::dump`].
    pub op: &'static str,
    /// Nodes of this kind on the tape.
    pub nodes: usize,
    /// Bytes of their values.
    pub value_bytes: usize,
    /// Bytes of their gradients (0 before a backward pass).
    pub grad_bytes: usize,
    /// Whether the values borrow or alias memory owned elsewhere (parameters, inputs,
    /// reshapes), rather than being allocated by the op.
    pub shared: bool,
}

/// Per-op memory of a scope, with the tape's own size and the arena's high-water mark.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemoryReport {
    /// One entry per op kind present, largest `value_bytes + grad_bytes` first.
    pub ops: Vec<OpMemory>,
    /// Bytes of tape (nodes and index payloads) on the heap, beyond the arena.
    pub tape_bytes: usize,
    /// Bytes of parameter gradients that [`Scope::backward_into`] computed straight into
    /// the caller's [`GradBuffer`](crate::GradBuffer): not the scope's memory, so not in
    /// any entry's `grad_bytes`.
    pub lent_bytes: usize,
    /// Bytes of arena gradient buffers that [`Scope::backward_into`] released (the
    /// gradients of intermediate nodes, once consumed) and no later node reused: still the
    /// scope's until it ends, so counted in [`owned_bytes`](MemoryReport::owned_bytes).
    pub released_bytes: usize,
    /// The arena now: bytes in use, high-water mark, capacity.
    pub arena: ArenaStats,
}

impl MemoryReport {
    /// Bytes of values and gradients the scope allocated itself (entries not `shared`,
    /// and every gradient).
    pub fn owned_bytes(&self) -> usize {
        let ops: usize =
            self.ops.iter().map(|o| if o.shared { o.grad_bytes } else { o.value_bytes + o.grad_bytes }).sum();
        ops + self.released_bytes
    }

    /// The most bytes the arena has held at once.
    pub fn high_water(&self) -> usize {
        self.arena.high_water
    }
}

impl fmt::Display for MemoryReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<16} {:>7} {:>13} {:>13}", "op", "nodes", "value bytes", "grad bytes")?;
        for o in &self.ops {
            let note = if o.shared { "  (shared)" } else { "" };
            writeln!(f, "{:<16} {:>7} {:>13} {:>13}{note}", o.op, o.nodes, o.value_bytes, o.grad_bytes)?;
        }
        writeln!(f, "owned by the scope: {} bytes; tape: {} bytes", self.owned_bytes(), self.tape_bytes)?;
        if self.released_bytes > 0 {
            writeln!(f, "released gradient buffers not reused: {} bytes", self.released_bytes)?;
        }
        if self.lent_bytes > 0 {
            writeln!(f, "parameter gradients written into the caller's GradBuffer: {} bytes", self.lent_bytes)?;
        }
        write!(
            f,
            "arena: {} bytes in use, high-water mark {} bytes, capacity {} bytes",
            self.arena.bytes_in_use, self.arena.high_water, self.arena.capacity
        )
    }
}

impl<T: Float> Scope<'_, '_, T> {
    /// Memory used so far by each op kind (values and gradients), the tape's size and the
    /// arena's high-water mark. Allocates the report; call it outside a hot loop.
    ///
    /// ```
    /// # fn main() -> Result<(), tapir::Error> {
    /// let x = tapir::Tensor::<f32>::ones(&[64, 64])?;
    /// let mut g = tapir::Graph::new();
    /// let report = g.scope(|s| {
    ///     let x = s.leaf(&x);
    ///     s.backward(x.matmul(x).relu().sum())?;
    ///     Ok::<_, tapir::Error>(s.memory_report())
    /// })?;
    /// let matmul = report.ops.iter().find(|o| o.op == "matmul").unwrap();
    /// assert_eq!((matmul.nodes, matmul.value_bytes, matmul.grad_bytes), (1, 64 * 64 * 4, 64 * 64 * 4));
    /// assert!(report.high_water() >= report.owned_bytes());
    /// println!("{report}");
    /// # Ok(()) }
    /// ```
    pub fn memory_report(&self) -> MemoryReport {
        let tape = self.core.tape.borrow();
        let tape_bytes = tape.bytes();
        let mut ops: Vec<OpMemory> = Vec::new();
        let mut lent_bytes = 0;
        for id in tape.ids() {
            let node = tape.node(id);
            let op = tape.name_of(&node.op);
            let mut grad = tape.grads.get(id).copied().flatten().map_or(0, std::mem::size_of_val);
            if tape.grads.get(id).copied().flatten().is_some_and(|g| tape.lent.contains(&(g.as_ptr() as usize))) {
                (lent_bytes, grad) = (lent_bytes + grad, 0);
            }
            let entry = match ops.iter().position(|o| o.op == op) {
                Some(k) => &mut ops[k],
                None => {
                    let shared = matches!(node.op, Op::Param(_) | Op::Variable | Op::Reshape { .. });
                    ops.push(OpMemory { op, nodes: 0, value_bytes: 0, grad_bytes: 0, shared });
                    ops.last_mut().expect("just pushed")
                }
            };
            entry.nodes += 1;
            entry.value_bytes += std::mem::size_of_val(node.value);
            entry.grad_bytes += grad;
        }
        ops.sort_by(|a, b| (b.value_bytes + b.grad_bytes).cmp(&(a.value_bytes + a.grad_bytes)).then(a.op.cmp(b.op)));
        let released_bytes = tape.released_bytes;
        MemoryReport { ops, tape_bytes, lent_bytes, released_bytes, arena: self.core.arena.stats() }
    }
}

impl<T: Float> Scope<'_, '_, T> {
    /// The tape as text, one node a line, like SSA: `%7 = mul %3 %5 : [2, 3]`.
    pub fn dump(&self) -> String {
        use std::fmt::Write;
        let tape = self.core.tape.borrow();
        let mut s = String::new();
        for (i, n) in tape.nodes.iter().map(|n| tape.view(n)).enumerate() {
            let _ = write!(s, "%{i} = {}", tape.name_of(&n.op));
            tape.for_each_input(&n.op, |x| {
                let _ = write!(s, " {x:?}");
            });
            let _ = writeln!(s, " : {}{}", n.shape, if n.requires_grad { " grad" } else { "" });
        }
        s
    }

    /// The tape in Graphviz DOT: one box per node with its op and shape; nodes that
    /// require a gradient are filled.
    pub fn to_dot(&self) -> String {
        use std::fmt::Write;
        let tape = self.core.tape.borrow();
        let mut s = String::from("digraph tape {\n  rankdir=LR;\n  node [shape=box, fontname=monospace];\n");
        for (i, n) in tape.nodes.iter().map(|n| tape.view(n)).enumerate() {
            let style = if n.requires_grad { ", style=filled, fillcolor=lightblue" } else { "" };
            let _ = writeln!(s, "  n{i} [label=\"%{i} {}\\n{}\"{style}];", tape.name_of(&n.op), n.shape);
            tape.for_each_input(&n.op, |x| {
                let _ = writeln!(s, "  n{} -> n{i};", x.index());
            });
        }
        s.push_str("}\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use crate::graph::graph::Graph;
    use crate::tensor::Tensor;

    #[test]
    fn counts_nodes_values_and_gradients_per_op() {
        let w = Tensor::<f64>::ones(&[3, 4]).unwrap();
        let x = Tensor::<f64>::ones(&[2, 3]).unwrap();
        let mut g = Graph::new();
        g.scope(|s| {
            let (w, x) = (s.leaf(&w), s.input(&x));
            let y = x.matmul(w).relu().relu().reshape(&[8]).sum();
            let before = s.memory_report();
            let relu = before.ops.iter().find(|o| o.op == "relu").unwrap();
            assert_eq!((relu.nodes, relu.value_bytes, relu.grad_bytes), (2, 2 * 8 * 8, 0));
            s.backward(y).unwrap();
            let after = s.memory_report();
            let relu = after.ops.iter().find(|o| o.op == "relu").unwrap();
            assert_eq!(relu.grad_bytes, 2 * 8 * 8);
            let var = after.ops.iter().find(|o| o.op == "variable").unwrap();
            assert!(var.shared && var.grad_bytes == 12 * 8);
            // The input leaf never needs a gradient.
            assert_eq!(after.ops.iter().find(|o| o.op == "leaf").unwrap().grad_bytes, 0);
            // Owned bytes count the borrowed input `x` (6 elements) under `leaf`.
            assert!(after.high_water() + 6 * 8 >= after.owned_bytes());
            let text = after.to_string();
            assert!(text.contains("matmul") && text.contains("high-water mark"), "{text}");
        });
    }
}
