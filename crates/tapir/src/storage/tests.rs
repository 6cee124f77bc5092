//! Tests of the arena: fills, limits, priming and stale slices, consolidation.

use super::*;

#[test]
fn limit_is_an_error_and_reset_frees() {
    let mut a = Arena::new();
    a.set_limit(Some(64));
    assert_eq!(a.alloc_zeroed::<f32>(8).unwrap().len(), 8);
    let e = a.alloc_zeroed::<f64>(8).unwrap_err();
    assert_eq!(e, AllocFail::Limit { requested: 64, in_use: 32, limit: 64 });
    a.reset();
    assert_eq!(a.stats().bytes_in_use, 0);
    assert_eq!(a.alloc_fill::<f64>(8, 2.0).unwrap()[7], 2.0);
    assert_eq!(a.stats().high_water, 64);
}

#[test]
fn large_fills_write_every_element() {
    let mut a = Arena::new();
    // Leave other values in the memory the fills below reuse, so a skipped element shows.
    for _ in 0..2 {
        a.alloc_fill::<f64>(40_000, 9.0).unwrap();
        a.reset();
    }
    for len in [255, 256, 257, 1000, 4099] {
        let f = a.alloc_fill::<f32>(len, 1.5).unwrap();
        assert_eq!(f.len(), len);
        assert!(f.iter().all(|&v| v == 1.5), "f32, {len} elements");
        let z = a.alloc_zeroed::<f64>(len).unwrap();
        assert!(z.iter().all(|&v| v.to_bits() == 0), "f64, {len} elements");
        let b = a.alloc_fill::<[u8; 96]>(len / 8, [7; 96]).unwrap();
        assert!(b.iter().all(|e| e.iter().all(|&v| v == 7)), "96-byte elements");
    }
    // An iterator fill of a large slice writes each element once, into reused memory.
    a.reset();
    a.alloc_fill::<f32>(40_000, 9.0).unwrap();
    a.reset();
    let it = a.alloc_iter((0..3000).map(|i| i as f32)).unwrap();
    assert!(it.iter().enumerate().all(|(i, &v)| v == i as f32));
}

#[test]
fn split_zero_fills_write_every_element_at_any_thread_count() {
    use crate::kernels::par::{CHUNK, MIN_PARALLEL};
    // Zeros over the threads; any other value from the top down, on one.
    let mut a = Arena::new();
    for threads in [1, 2, 3, 16] {
        for len in [MIN_PARALLEL - 1, MIN_PARALLEL, MIN_PARALLEL + 1, 5 * CHUNK + 7, 200_003] {
            // Dirty memory first, so that a skipped element shows.
            a.reset();
            a.alloc_fill::<f64>(len + 64, f64::NAN).unwrap();
            a.reset();
            a.set_fill_threads(threads);
            let z = a.alloc_zeroed::<f64>(len).unwrap();
            assert_eq!(z.len(), len);
            assert!(z.iter().all(|&v| v.to_bits() == 0), "{threads} threads, {len} elements");
            let used = a.stats().bytes_in_use;
            assert!(used >= len * 8, "charged to the arena: {used} bytes for {len} elements");
            let f = a.alloc_fill::<f32>(len, -2.5).unwrap();
            assert!(f.iter().all(|&v| v == -2.5), "{threads} threads, {len} elements of -2.5");
        }
    }
}

/// An iterator that says it has more elements than it yields.
struct Short(std::ops::Range<u32>, usize);

impl Iterator for Short {
    type Item = f32;
    fn next(&mut self) -> Option<f32> {
        self.0.next().map(|i| i as f32 + 1.0)
    }
}

impl ExactSizeIterator for Short {
    fn len(&self) -> usize {
        self.1
    }
}

/// A safe `ExactSizeIterator` may overstate its length: what it leaves unwritten is
/// zero, never the stale values of reused memory.
#[test]
fn short_iterators_leave_zeros_not_stale_memory() {
    let mut a = Arena::new();
    a.alloc_fill::<f32>(10_000, 7.0).unwrap();
    a.reset();
    let out = a.alloc_iter(Short(0..100, 500)).unwrap();
    assert_eq!(out.len(), 500);
    assert!(out[..100].iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0));
    assert!(out[100..].iter().all(|&v| v.to_bits() == 0));
}

/// A scope's large stale slices come from the part of the chunk that the previous
/// reset primed, unwritten (release) or poisoned (debug); beyond it, and before any
/// reset, they are zeroed.
#[test]
fn stale_slices_come_unwritten_from_the_primed_part_only() {
    let mut a = Arena::new();
    let n = 50_000;
    let first = a.alloc_stale::<f32>(n).unwrap();
    assert!(first.iter().all(|&v| v.to_bits() == 0), "no chunk primed yet: zeros");
    first.fill(3.5);
    a.reset();
    // The reset primed (zeroed) the part the scope used; this scope's values stay there.
    let primed = a.alloc_stale::<f32>(n).unwrap();
    let poison = cfg!(debug_assertions).then_some(u32::MAX);
    assert!(primed.iter().all(|&v| v.to_bits() == poison.unwrap_or(0)), "primed: zeros");
    primed.fill(-1.25);
    a.reset();
    let again = a.alloc_stale::<f32>(n).unwrap();
    let expected = poison.unwrap_or((-1.25f32).to_bits());
    assert!(again.iter().all(|&v| v.to_bits() == expected), "the last scope's values");
    // Past the primed part (the first scope used n elements): zeros.
    let beyond = a.alloc_stale::<f32>(n).unwrap();
    assert!(beyond.iter().all(|&v| v.to_bits() == 0), "beyond the primed part: zeros");
    assert!(a.stats().bytes_in_use >= 2 * n * 4, "charged to the arena");
    // Small slices are zeroed.
    a.alloc_fill::<f32>(100, 9.0).unwrap();
    a.reset();
    assert!(a.alloc_stale::<f32>(100).unwrap().iter().all(|&v| v == 0.0));
    // A released arena starts over unprimed.
    a.shrink_to_fit();
    assert!(a.alloc_stale::<f64>(n).unwrap().iter().all(|&v| v.to_bits() == 0));
}

#[test]
fn reset_consolidates_chunks() {
    let mut a = Arena::new();
    for _ in 0..100 {
        a.alloc_zeroed::<f32>(1000).unwrap();
    }
    a.reset();
    let cap = a.stats().capacity;
    assert!(cap >= 400_000, "one chunk holds the whole iteration, got {cap}");
    for _ in 0..100 {
        a.alloc_zeroed::<f32>(1000).unwrap();
    }
    assert_eq!(a.stats().capacity, cap, "second iteration needs no new chunk");
}
