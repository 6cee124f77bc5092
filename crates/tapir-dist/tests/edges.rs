//! Properties over integer edge values (0, 1, powers of two and their neighbours, the
//! type's maximum and its halves): a batch index or sample count past any real run must
//! give an empty batch or a typed error, never a wrapped value or a panic.
//!
//! The generator is `edge()`: proptest's own `any::<usize>()` almost never draws the values
//! near `usize::MAX / k` where `batch · global_batch` wraps, so the edges are listed.

use proptest::prelude::*;
use tapir::{ParamStore, Tensor};
use tapir_dist::{DataParallel, DistributedSampler, Local};

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

proptest! {
    #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

    /// `global(b)` is the `b`-th slice of the epoch's permutation, or empty past the epoch;
    /// `shard(b)` is a piece of it.
    #[test]
    fn batches_are_in_the_epoch_or_empty(
        len in 1usize..=64,
        global_batch in edge().prop_filter("positive", |&b| b > 0),
        batch in edge(),
        size in 1usize..=5,
        rank_pick in 0usize..5,
    ) {
        let rank = rank_pick % size;
        let s = DistributedSampler::new(len, global_batch, rank, size, 7).unwrap().sequential();
        let got = s.global(batch);
        let first = batch.checked_mul(global_batch).filter(|&start| start < len);
        match first {
            Some(start) => {
                let end = start + global_batch.min(len - start);
                let want: Vec<usize> = (start..end).collect();
                prop_assert_eq!(got, want.as_slice());
            }
            None => prop_assert!(got.is_empty(), "batch {} of {}: {:?}", batch, s.batches_per_epoch(), got),
        }
        let shard = s.shard(batch);
        prop_assert!(shard.iter().all(|i| got.contains(i)));
    }

    /// A sample count that does not fit is refused and changes nothing; one that fits is
    /// counted exactly.
    #[test]
    fn sample_counts_never_wrap(first in edge(), second in edge()) {
        let mut store = ParamStore::<f64>::new();
        store.add("w", Tensor::zeros(&[2]).unwrap()).unwrap();
        let mut dp = DataParallel::new(Local, &mut store).unwrap();
        let limit = 1usize << 53;
        let mut want = 0usize;
        for n in [first, second] {
            let mut grads = store.zeros_like().unwrap();
            let fits = want.checked_add(n).is_some_and(|t| t <= limit);
            prop_assert_eq!(dp.accumulate(&mut grads, n).is_ok(), fits, "{} + {}", want, n);
            if fits {
                want += n;
            }
        }
        let mut grads = store.zeros_like().unwrap();
        match dp.all_reduce(&mut grads) {
            Ok(r) => prop_assert_eq!(r.samples, want),
            Err(e) => prop_assert!(want == 0, "{}", e),
        }
    }
}
