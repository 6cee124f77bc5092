//! [`DistributedSampler`]: each epoch, one seeded permutation of the dataset, cut into
//! global batches; each global batch is split into `size` contiguous, disjoint shards,
//! one per rank. The union of the shards is the global batch, and the union of the global
//! batches is the epoch, so training on `k` ranks sees exactly the batches that a single
//! process with the same seed sees.
//!
//! Unlike PyTorch's `DistributedSampler` nothing is padded or dropped: when the last
//! global batch (or a batch smaller than the world) does not split evenly, the first
//! ranks get one sample more and some may get none; [`DataParallel`](crate::DataParallel)
//! weights each rank's gradient by its sample count, so the average is still over the
//! global batch.
//!
//! The permutation is a Fisher–Yates shuffle driven by [`SplitMix64`] seeded with
//! `seed` and the epoch, defined here rather than borrowed from `rand`, so that a
//! checkpoint resumes the same order with any version of any dependency.

use crate::error::{invalid, try_vec, Result};

/// Steele, Lea and Flood's SplitMix64: a 64-bit state, one multiply-xorshift output.
/// Small enough to checkpoint as one `u64` ([`SplitMix64::state`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    /// A generator whose next output depends on `seed` only.
    pub fn new(seed: u64) -> SplitMix64 {
        SplitMix64 { state: seed }
    }

    /// The state, to save in a checkpoint; [`SplitMix64::new`] of it resumes the stream.
    pub fn state(&self) -> u64 {
        self.state
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A uniform integer in `0..n`, by Lemire's multiply-and-reject. `n = 0` stands for
    /// `2^64` (the count `n` wraps to in `u64`): the result is then uniform over every
    /// `u64`, as [`SplitMix64::next_u64`]; it never panics.
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            return self.next_u64();
        }
        let threshold = n.wrapping_neg() % n;
        loop {
            let m = u128::from(self.next_u64()) * u128::from(n);
            if (m as u64) >= threshold {
                return (m >> 64) as u64;
            }
        }
    }
}

/// Where a sampler is in its run: enough to resume it exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SamplerState {
    /// The current epoch.
    pub epoch: u64,
    /// Global batches of this epoch already handed out.
    pub batch: usize,
}

/// Seeded, disjoint shards of every global batch; see the module docs.
#[derive(Debug, Clone)]
pub struct DistributedSampler {
    len: usize,
    global_batch: usize,
    rank: usize,
    size: usize,
    seed: u64,
    shuffle: bool,
    state: SamplerState,
    perm: Vec<usize>,
}

impl DistributedSampler {
    /// A sampler over `len` samples in global batches of `global_batch`, for rank `rank`
    /// of `size`, at epoch 0.
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] if `len` or `global_batch` is 0 or `rank >= size`;
    /// [`crate::Error::OutOfMemory`] if the permutation (`len` indices) cannot be allocated,
    /// its byte count past `isize::MAX` included.
    #[track_caller]
    pub fn new(len: usize, global_batch: usize, rank: usize, size: usize, seed: u64) -> Result<DistributedSampler> {
        const OP: &str = "DistributedSampler::new";
        if len == 0 || global_batch == 0 {
            return Err(invalid(OP, format!("dataset length {len} and global batch {global_batch} must be positive")));
        }
        if rank >= size {
            return Err(invalid(OP, format!("rank {rank} must be below the world size {size}")));
        }
        let mut s = DistributedSampler {
            len,
            global_batch,
            rank,
            size,
            seed,
            shuffle: true,
            state: SamplerState::default(),
            perm: try_vec(OP, "the permutation", len, 0)?,
        };
        s.permute();
        Ok(s)
    }

    /// Keeps the dataset's order (for evaluation).
    #[must_use]
    pub fn sequential(mut self) -> Self {
        self.shuffle = false;
        self.permute();
        self
    }

    fn permute(&mut self) {
        // `perm` holds `len` elements from `new` on, so this rewrites it without allocating.
        self.perm.iter_mut().enumerate().for_each(|(i, p)| *p = i);
        if self.shuffle {
            // Mix the epoch into the seed through one SplitMix step, so that epochs e and
            // seeds s never collide as `seed + epoch` would.
            let mut rng = SplitMix64::new(SplitMix64::new(self.seed).next_u64() ^ self.state.epoch);
            for i in (1..self.len).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                self.perm.swap(i, j);
            }
        }
    }

    /// Global batches per epoch (the last may be short).
    pub fn batches_per_epoch(&self) -> usize {
        self.len.div_ceil(self.global_batch)
    }

    /// The state to checkpoint.
    pub fn state(&self) -> SamplerState {
        self.state
    }

    /// Resumes at `state` (from [`DistributedSampler::state`]).
    ///
    /// # Errors
    /// [`crate::Error::InvalidArgument`] if `state.batch` is past the end of an epoch.
    #[track_caller]
    pub fn set_state(&mut self, state: SamplerState) -> Result<()> {
        if state.batch > self.batches_per_epoch() {
            return Err(invalid(
                "DistributedSampler::set_state",
                format!("batch {} is past the epoch's {} batches", state.batch, self.batches_per_epoch()),
            ));
        }
        let new_epoch = state.epoch != self.state.epoch;
        self.state = state;
        if new_epoch {
            self.permute();
        }
        Ok(())
    }

    /// Starts epoch `epoch` from its first batch (allocation-free: the permutation's
    /// buffer is reused).
    pub fn set_epoch(&mut self, epoch: u64) {
        self.state = SamplerState { epoch, batch: 0 };
        self.permute();
    }

    /// The global batch `batch` of the current epoch, in permutation order; empty for a
    /// batch past the epoch (`batch >= batches_per_epoch()`, however large).
    pub fn global(&self, batch: usize) -> &[usize] {
        // `batch · global_batch` may overflow for a huge `batch`; such a batch starts past
        // the epoch, like any other `start >= len`.
        let start = batch.checked_mul(self.global_batch).map_or(self.len, |s| s.min(self.len));
        // `start ≤ len`, so `len - start` cannot underflow and the end stays within `len`.
        &self.perm[start..start + self.global_batch.min(self.len - start)]
    }

    /// This rank's shard of global batch `batch`: the `rank`-th of `size` contiguous
    /// pieces, the first `n % size` one longer. Empty for a batch past the epoch.
    pub fn shard(&self, batch: usize) -> &[usize] {
        let global = self.global(batch);
        let (q, r) = (global.len() / self.size, global.len() % self.size);
        let start = self.rank * q + self.rank.min(r);
        let len = q + usize::from(self.rank < r);
        &global[start..start + len]
    }

    /// This rank's shard of the next global batch, or `None` at the end of the epoch
    /// (then call [`DistributedSampler::set_epoch`]). A shard may be empty when the batch
    /// is smaller than the world; the rank then contributes 0 samples.
    pub fn next_shard(&mut self) -> Option<&[usize]> {
        if self.state.batch >= self.batches_per_epoch() {
            return None;
        }
        self.state.batch += 1;
        Some(self.shard(self.state.batch - 1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_disjoint_and_cover_every_epoch() {
        for (len, batch, size) in [(10, 4, 3), (7, 7, 4), (100, 32, 2), (5, 2, 4), (1, 1, 1)] {
            for epoch in 0..3 {
                let mut seen = vec![0usize; len];
                let mut samplers: Vec<_> =
                    (0..size).map(|r| DistributedSampler::new(len, batch, r, size, 42).unwrap()).collect();
                for b in 0..samplers[0].batches_per_epoch() {
                    let mut union: Vec<usize> = Vec::new();
                    for s in &mut samplers {
                        s.set_state(SamplerState { epoch, batch: b }).unwrap();
                        union.extend_from_slice(s.next_shard().unwrap());
                    }
                    // The shards, in rank order, are exactly the global batch.
                    assert_eq!(union, samplers[0].global(b), "len {len} batch {batch} size {size}");
                    union.iter().for_each(|&i| seen[i] += 1);
                }
                assert!(seen.iter().all(|&c| c == 1), "len {len} batch {batch} size {size}: {seen:?}");
                assert!(samplers[0].next_shard().is_none());
            }
        }
    }

    #[test]
    fn seeds_and_epochs_change_the_order_reproducibly() {
        let a = DistributedSampler::new(50, 50, 0, 1, 1).unwrap();
        let b = DistributedSampler::new(50, 50, 0, 1, 1).unwrap();
        let c = DistributedSampler::new(50, 50, 0, 1, 2).unwrap();
        assert_eq!(a.global(0), b.global(0));
        assert_ne!(a.global(0), c.global(0));
        let mut d = a.clone();
        d.set_epoch(1);
        assert_ne!(a.global(0), d.global(0));
        let seq = DistributedSampler::new(5, 2, 1, 2, 9).unwrap().sequential();
        assert_eq!(seq.global(1), [2, 3]);
        assert_eq!(seq.shard(1), [3]);
        assert_eq!(seq.shard(2), [] as [usize; 0]);
        assert!(DistributedSampler::new(5, 2, 2, 2, 0).is_err());
        assert!(DistributedSampler::new(0, 2, 0, 2, 0).is_err());
    }

    #[test]
    fn batches_past_the_epoch_are_empty_however_large() {
        let s = DistributedSampler::new(10, 4, 1, 2, 3).unwrap().sequential();
        assert_eq!(s.global(2), [8, 9]);
        for batch in [3, 4, usize::MAX / 4 + 1, usize::MAX / 2, usize::MAX] {
            assert_eq!(s.global(batch), [] as [usize; 0], "batch {batch}");
            assert_eq!(s.shard(batch), [] as [usize; 0], "batch {batch}");
        }
        // A global batch larger than the dataset: one short batch, then nothing.
        let wide = DistributedSampler::new(3, usize::MAX, 0, 1, 0).unwrap().sequential();
        assert_eq!((wide.global(0), wide.global(1)), (&[0, 1, 2][..], &[][..]));
    }

    #[test]
    fn a_permutation_too_large_to_allocate_is_a_typed_error() {
        // 2⁶² indices of 8 bytes: 2⁶⁵ bytes, past isize::MAX (no allocator is asked).
        let line = line!() + 1;
        let e = DistributedSampler::new(1 << 62, 4, 0, 1, 0).unwrap_err();
        let crate::Error::OutOfMemory { op, what, count, elem_bytes, location } = &e else { panic!("{e}") };
        assert_eq!((*op, *what, *count, *elem_bytes), ("DistributedSampler::new", "the permutation", 1 << 62, 8));
        assert_eq!((location.file(), location.line()), (file!(), line));
        assert_eq!(
            e.to_string(),
            format!(
                "DistributedSampler::new: out of memory allocating the permutation: 4611686018427387904 elements \
                 of 8 bytes (more than isize::MAX bytes) (at {location})"
            )
        );
    }

    #[test]
    fn below_zero_is_the_whole_u64_range_and_never_panics() {
        let (mut a, mut b) = (SplitMix64::new(11), SplitMix64::new(11));
        for _ in 0..100 {
            assert_eq!(a.below(0), b.next_u64());
        }
        assert_eq!(SplitMix64::new(1).below(1), 0);
    }

    #[test]
    fn splitmix_matches_the_reference_outputs() {
        // First outputs for seed 1234567 from the reference C implementation
        // (Vigna's splitmix64.c), as listed in its test vectors.
        let mut r = SplitMix64::new(1234567);
        assert_eq!(r.next_u64(), 6457827717110365317);
        assert_eq!(r.next_u64(), 3203168211198807973);
        let mut u = SplitMix64::new(7);
        assert!((0..1000).all(|_| u.below(3) < 3));
    }
}
