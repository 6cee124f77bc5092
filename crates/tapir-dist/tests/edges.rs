//! Properties over integer edge values (0, 1, powers of two and their neighbours, the
//! type's maximum and its halves), against independent models: a batch index or sample
//! count past any real run must give an empty batch or a typed error that changes
//! nothing, never a wrapped value or a panic (issue 31, class 4; the generator of
//! `docs/robustness.md`, "Generators of the hardening classes").
//!
//! The generator is `edge()`: proptest's own `any::<usize>()` almost never draws the values
//! near `usize::MAX / k` where `batch · global_batch` wraps, so the edges are listed.
//! The models are written from the documented behaviour, not from the code: the
//! permutation is the Fisher–Yates shuffle of `sampler.rs`'s module doc over a SplitMix64
//! written out here again (its order is part of the checkpoint format, so it must not
//! move), a shard is counted out one index at a time, and the pending sample count is a
//! plain sum checked against the limit.

use proptest::prelude::*;
use tapir::{Float, ParamStore, Tensor};
use tapir_dist::{DataParallel, DistributedSampler, Error, Local, SamplerState};

/// Values where arithmetic on sizes goes wrong, with a few ordinary ones.
fn edge() -> impl Strategy<Value = usize> {
    prop_oneof![
        0usize..=40,
        (0u32..usize::BITS).prop_flat_map(|k| {
            let p = 1usize << k;
            prop_oneof![Just(p - 1), Just(p), Just(p.wrapping_add(1))]
        }),
        (1usize..=16).prop_map(|d| usize::MAX / d),
        (2usize..=16).prop_map(|d| usize::MAX / d + 1),
        (0usize..=16).prop_map(|d| usize::MAX - d),
    ]
}

/// The model's SplitMix64 (Steele, Lea and Flood), from the published constants.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let z = (self.0 ^ (self.0 >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n ≥ 1`) by Lemire's multiply-and-reject.
    fn below(&mut self, n: u64) -> u64 {
        loop {
            let m = u128::from(self.next()) * u128::from(n);
            if (m as u64) >= n.wrapping_neg() % n {
                return (m >> 64) as u64;
            }
        }
    }
}

/// The epoch's order: `0..len` in order, or shuffled by Fisher–Yates from the last
/// position down, drawing from a SplitMix64 seeded with the seed's first output xor the
/// epoch.
fn model_order(len: usize, seed: u64, epoch: u64, shuffle: bool) -> Vec<usize> {
    let mut order: Vec<usize> = (0..len).collect();
    if shuffle {
        let mut rng = Mix(Mix(seed).next() ^ epoch);
        for i in (1..len).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            order.swap(i, j);
        }
    }
    order
}

/// Global batch `batch`: the order cut into pieces of `global_batch`, counted out one
/// piece at a time (no multiplication to overflow); empty past the last piece.
fn model_global(order: &[usize], global_batch: usize, batch: usize) -> Vec<usize> {
    let mut rest = order;
    for _ in 0..batch {
        if rest.is_empty() {
            return Vec::new();
        }
        rest = &rest[global_batch.min(rest.len())..];
    }
    rest[..global_batch.min(rest.len())].to_vec()
}

/// Rank `rank`'s shard: deal the global batch's positions round-robin to `size` ranks to
/// count each rank's share (the first `n % size` get one more), then cut the batch into
/// contiguous pieces of those lengths in rank order.
fn model_shard(global: &[usize], rank: usize, size: usize) -> Vec<usize> {
    let before = (0..global.len()).filter(|k| k % size < rank).count();
    let mine = (0..global.len()).filter(|k| k % size == rank).count();
    global[before..before + mine].to_vec()
}

/// A batch index: an edge value, or one of the four around the end of the epoch.
#[derive(Debug, Clone, Copy)]
enum Batch {
    Edge(usize),
    FromEnd(usize),
}

fn batch() -> impl Strategy<Value = Batch> {
    prop_oneof![edge().prop_map(Batch::Edge), (0usize..4).prop_map(Batch::FromEnd)]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// `global(b)` and `shard(b)`, shuffled or not, at any epoch: the model's indices
    /// within the epoch, empty past it; `set_state` and `next_shard` agree.
    #[test]
    fn batches_match_the_model_or_are_empty(
        len in 1usize..=64,
        global_batch in edge().prop_filter("positive", |&b| b > 0),
        batch in batch(),
        size in prop_oneof![1usize..=5, edge().prop_filter("positive", |&s| s > 0)],
        rank_pick in edge(),
        seed: u64,
        epoch in prop_oneof![edge().prop_map(|e| e as u64), any::<u64>()],
        shuffle: bool,
    ) {
        let rank = rank_pick % size;
        let mut s = DistributedSampler::new(len, global_batch, rank, size, seed).unwrap();
        if !shuffle {
            s = s.sequential();
        }
        s.set_epoch(epoch);
        let batches = len.div_ceil(global_batch);
        prop_assert_eq!(s.batches_per_epoch(), batches);
        let b = match batch {
            Batch::Edge(b) => b,
            Batch::FromEnd(k) => (batches + k).saturating_sub(2),
        };
        let order = model_order(len, seed, epoch, shuffle);
        let global = model_global(&order, global_batch, b);
        prop_assert_eq!(b >= batches, global.is_empty());
        prop_assert_eq!(s.global(b), global.as_slice(), "global batch {} of {}", b, batches);
        let shard = model_shard(&global, rank, size);
        prop_assert_eq!(s.shard(b), shard.as_slice(), "shard of rank {} of {}, batch {}", rank, size, b);
        // Resuming at `b` hands out that shard next, or nothing past the epoch.
        match s.set_state(SamplerState { epoch, batch: b }) {
            Ok(()) => {
                prop_assert!(b <= batches);
                let next = s.next_shard().map(<[usize]>::to_vec);
                prop_assert_eq!(next, (b < batches).then_some(shard), "next shard after batch {}", b);
            }
            Err(Error::InvalidArgument { op, .. }) => {
                prop_assert!(b > batches, "set_state refused batch {} of {}", b, batches);
                prop_assert_eq!(op, "DistributedSampler::set_state");
            }
            Err(e) => prop_assert!(false, "set_state: {}", e),
        }
    }

    /// A run of `accumulate` calls: a count that keeps the pending total within what `T`
    /// counts exactly is taken and zeroes the buffer; any other is
    /// `InvalidArgument` that leaves the buffer and the pending count and sum unchanged.
    /// The reduction then gives the model's total and mean.
    #[test]
    fn sample_counts_match_the_model(counts in prop::collection::vec(edge(), 1..=4), f32: bool) {
        if f32 {
            accumulate_run::<f32>(&counts, 1 << 24)?;
        } else {
            accumulate_run::<f64>(&counts, 1 << 53)?;
        }
    }
}

/// `accumulate` each count with micro-batch `k`'s gradient `[2^(k mod 3), −2^−(k mod 2)]`
/// (powers of two, so a rejected batch that leaked into the sum would show), against the
/// model: `limit` is the largest count `T` holds exactly.
fn accumulate_run<T: Float>(counts: &[usize], limit: usize) -> Result<(), TestCaseError> {
    let mut store = ParamStore::<T>::new();
    store.add("w", Tensor::zeros(&[2]).unwrap()).unwrap();
    let mut dp = DataParallel::new(Local, &mut store).unwrap();
    let (mut pending, mut sum) = (0usize, [0.0f64; 2]);
    for (k, &n) in counts.iter().enumerate() {
        let g = [f64::from(1 << (k % 3)), -1.0 / f64::from(1 << (k % 2))];
        let mut grads = store.zeros_like().unwrap();
        grads.as_mut_slice().iter_mut().zip(g).for_each(|(d, v)| *d = T::from_f64(v));
        let fits = pending.checked_add(n).is_some_and(|t| t <= limit);
        match dp.accumulate(&mut grads, n) {
            Ok(()) => {
                prop_assert!(fits, "{} pending + {} taken past {}", pending, n, limit);
                prop_assert!(grads.as_mut_slice().iter().all(|&v| v == T::ZERO), "buffer not zeroed");
                pending += n;
                sum.iter_mut().zip(g).for_each(|(s, v)| *s += n as f64 * v);
            }
            Err(Error::InvalidArgument { op, .. }) => {
                prop_assert!(!fits, "{} pending + {} refused", pending, n);
                prop_assert_eq!(op, "DataParallel::accumulate");
                let kept: Vec<f64> = grads.as_mut_slice().iter().map(|v| v.to_f64()).collect();
                prop_assert_eq!(kept, g.to_vec(), "a refused call changed the buffer");
            }
            Err(e) => prop_assert!(false, "accumulate({}): {}", n, e),
        }
    }
    let mut grads = store.zeros_like().unwrap();
    match dp.all_reduce(&mut grads) {
        Ok(r) => {
            prop_assert_eq!(r.samples, pending);
            for (got, s) in grads.as_mut_slice().iter().zip(sum) {
                let want = s / pending as f64;
                let tol = if limit == 1 << 24 { 1e-5 } else { 1e-12 };
                prop_assert!((got.to_f64() - want).abs() <= tol * want.abs(), "mean {} vs {}", got, want);
            }
        }
        Err(Error::InvalidArgument { op, .. }) => {
            prop_assert_eq!(pending, 0, "all_reduce refused {} samples", pending);
            prop_assert_eq!(op, "DataParallel::all_reduce");
        }
        Err(e) => prop_assert!(false, "all_reduce: {}", e),
    }
    Ok(())
}
