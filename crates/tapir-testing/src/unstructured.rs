//! [`Unstructured`]: a cursor that turns raw fuzzer bytes into choices.
//!
//! Every read is total: once the bytes run out, reads return zero, so any byte string,
//! including the empty one, decodes to some program. Small choices take one byte, so a
//! fuzzer's one-byte mutations move between neighbouring programs.

/// Reads choices from a byte string, front to back.
#[derive(Debug, Clone)]
pub struct Unstructured<'a> {
    data: &'a [u8],
}

impl<'a> Unstructured<'a> {
    /// A reader over `data`.
    pub fn new(data: &'a [u8]) -> Unstructured<'a> {
        Unstructured { data }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Bytes not read yet.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// The next byte, or 0 once the input is exhausted.
    pub fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&b, rest)) => {
                self.data = rest;
                b
            }
            None => 0,
        }
    }

    /// The next 8 bytes as a little-endian `u64` (missing bytes read as 0).
    pub fn u64(&mut self) -> u64 {
        let mut out = [0u8; 8];
        for b in &mut out {
            *b = self.byte();
        }
        u64::from_le_bytes(out)
    }

    /// A number in `0..n` (0 when `n` is 0 or 1): one byte for `n ≤ 256`, two above.
    pub fn below(&mut self, n: usize) -> usize {
        match n {
            0 | 1 => 0,
            2..=256 => usize::from(self.byte()) % n,
            _ => (usize::from(self.byte()) | usize::from(self.byte()) << 8) % n,
        }
    }

    /// A number in `lo..=hi` (`lo` if `hi < lo`).
    pub fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability about `num/den`.
    pub fn chance(&mut self, num: u8, den: u8) -> bool {
        den == 0 || self.byte() % den < num
    }

    /// A small signed axis in `-rank-1..=rank`: just outside the valid range at either end
    /// now and then.
    pub fn axis(&mut self, rank: usize) -> isize {
        let r = rank as isize;
        self.range(0, 2 * rank + 2) as isize - r - 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_are_total() {
        let mut u = Unstructured::new(&[7, 1, 2]);
        assert_eq!(u.byte(), 7);
        assert_eq!(u.below(2), 1);
        assert_eq!(u.range(3, 5), 5);
        assert!(u.is_empty());
        assert_eq!(u.byte(), 0);
        assert_eq!(u.u64(), 0);
        assert_eq!(u.below(1000), 0);
        assert_eq!(u.axis(2), -3);
    }
}
