//! [`InPlace`]: a producer's output buffer held back for the in-place op that reads it
//! next, in a checkpointed block (see `engine/checkpoint/in_place.rs`).

/// In-place ops of a checkpointed block: a producer (a `linear`) keeps its output buffer
/// back as `pending` and records an empty value; the elementwise op that reads it next
/// (one whose backward reads only its output) takes the buffer, computes in place and
/// makes it both nodes' value. Anything else recorded first gives the buffer back to its
/// producer (see `Core::record_at`). So a block holds one buffer where it had two.
///
/// Two modes (see `engine/checkpoint/in_place.rs`):
/// - *speculative*, in the block's forward: every `linear` is held back. Whether the
///   overwritten value had another reader shows only after the block: then the forward
///   runs again without in-place ops. A caller's read of an overwritten value computes it
///   again (`ops::matmul::relinear`).
/// - *listed*, in the recomputation for backward: only the nodes that the forward showed
///   safe (`at`). A buffer given back ends in-place work for the block, and a caller's
///   read of an overwritten value is an error: the block did not record as it did.
#[derive(Debug, Default)]
pub(crate) struct InPlace<'s, T> {
    /// Listed: the node positions to overwrite, ascending. Speculative: the positions
    /// overwritten so far.
    pub at: Vec<u32>,
    /// How many entries of `at` were overwritten: always the first ones.
    taken: usize,
    /// Speculative mode.
    pub speculate: bool,
    /// Set once a listed buffer went back to its producer.
    stopped: bool,
    /// A producer's output held back for its reader: the producer's position and buffer.
    pub pending: Option<(u32, &'s mut [T])>,
}

impl<'s, T> InPlace<'s, T> {
    /// Whether the output of the node at `pos`, the next one recorded, is held back.
    #[inline]
    pub(crate) fn listed(&self, pos: u32) -> bool {
        self.pending.is_none() && (self.speculate || (!self.stopped && self.at.get(self.taken) == Some(&pos)))
    }

    /// Takes the held-back buffer if it is the output of node `pos`.
    pub(crate) fn take(&mut self, pos: u32) -> Option<&'s mut [T]> {
        match self.pending.take() {
            Some((p, buf)) if p == pos => {
                if self.speculate {
                    self.at.push(pos);
                }
                self.taken += 1;
                Some(buf)
            }
            other => {
                self.pending = other;
                None
            }
        }
    }

    /// Gives a held-back buffer back: its producer's position and the buffer. In listed
    /// mode, in-place work ends for the block.
    pub(crate) fn give_back(&mut self) -> Option<(u32, &'s mut [T])> {
        let pending = self.pending.take();
        self.stopped |= pending.is_some() && !self.speculate;
        pending
    }

    /// Whether node `pos`'s output is held back for an in-place reader.
    pub(crate) fn holds(&self, pos: u32) -> bool {
        matches!(self.pending, Some((p, _)) if p == pos)
    }

    /// Whether node `pos`'s value was overwritten in place by its reader.
    pub(crate) fn overwritten(&self, pos: u32) -> bool {
        self.at[..self.taken].binary_search(&pos).is_ok()
    }

    /// The positions overwritten so far.
    pub(crate) fn taken(&self) -> &[u32] {
        &self.at[..self.taken]
    }

    /// Node `pos`'s value, overwritten in speculative mode, was computed again.
    pub(crate) fn restored(&mut self, pos: u32) {
        if let Ok(i) = self.at[..self.taken].binary_search(&pos) {
            self.at.remove(i);
            self.taken -= 1;
        }
    }
}

impl<'s, T> InPlace<'s, T> {
    /// No in-place work pending, with `at` (emptied) kept for its capacity.
    pub(crate) fn with_capacity_of(mut at: Vec<u32>) -> InPlace<'s, T> {
        at.clear();
        InPlace { at, taken: 0, speculate: false, stopped: false, pending: None }
    }
}
