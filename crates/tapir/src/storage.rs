//! The per-iteration arena: a `bumpalo::Bump` that holds only [`bytemuck::Pod`] data.
//!
//! Values and gradients of one scope are bump-allocated here and freed all at once when
//! the scope ends. `Pod` types have no destructors and hold no pointers, so `reset` cannot
//! skip a destructor or leak what one would have freed; and `reset` takes `&mut self`, so
//! the borrow checker proves that no slice handed out by `alloc_*` survives it.
//!
//! Handing out slices below [`FILL_DOWN`] bytes needs no `unsafe`: bumpalo gives
//! `&'a mut [T]` through `&'a Bump`. Four of the engine's `unsafe` sites are here:
//! [`fill_down`] fills larger slices from their last cache line down, [`zero_split`]
//! zeroes large ones over several threads, [`fill_from`] writes an iterator's values
//! straight into a larger slice, and [`heap`] asks glibc to give the pages of chunks the
//! arena has freed back to the system.
//!
//! Warm-up: bumpalo keeps only its largest chunk on reset. If an iteration needed several
//! chunks, [`Arena::reset`] replaces them with one chunk of their total size, so from the
//! second iteration on a same-shaped graph fits in one chunk and allocates nothing.

use std::cell::Cell;
use std::mem::MaybeUninit;

use bumpalo::Bump;
use bytemuck::Pod;

/// Up to this many elements, [`Arena::alloc_iter`] fills element by element: below it a
/// memset call costs more than it saves.
const SMALL_FILL: usize = 16;

/// From this many bytes on, [`Arena::alloc_fill`] fills a slice from its last cache line
/// down (see [`fill_down`]).
const FILL_DOWN: usize = 1024;

/// From this many bytes on, a zero fill runs over the threads set by
/// [`Arena::set_fill_threads`] (see [`zero_split`]): 32,768 `f32`, the elementwise ops'
/// own threshold for going parallel.
const FILL_SPLIT: usize = 1 << 17;

/// The release policy: after this many consecutive scopes that each used under a quarter
/// of the arena's capacity, the arena shrinks to what the largest of them used...
pub(crate) const RELEASE_AFTER: u32 = 64;
/// ...if that gives back at least this many bytes (below it, a release would only make
/// the next larger scope allocate again).
const RELEASE_MIN: usize = 1 << 20;

/// Why the arena could not allocate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AllocFail {
    /// The byte limit would be exceeded.
    Limit { requested: usize, in_use: usize, limit: usize },
    /// The system allocator refused.
    Oom { requested: usize },
}

/// Memory statistics of an arena, readable at any time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ArenaStats {
    /// Bytes handed out since the last reset (values, gradients, index payloads).
    pub bytes_in_use: usize,
    /// The most bytes ever in use at once.
    pub high_water: usize,
    /// Bytes the arena holds from the system allocator (its chunks).
    pub capacity: usize,
    /// How many times the arena took new memory from the system after its first reset.
    pub regrowths: usize,
    /// How many times the release policy gave memory back to the system (see
    /// [`Graph::shrink_to_fit`](crate::Graph::shrink_to_fit)).
    pub releases: usize,
}

/// A bump arena for `Pod` slices with an optional byte limit.
#[derive(Debug)]
pub(crate) struct Arena {
    bump: Bump,
    in_use: Cell<usize>,
    high_water: Cell<usize>,
    limit: Option<usize>,
    resets: usize,
    regrowths: usize,
    releases: usize,
    /// Consecutive scopes that used under a quarter of the capacity, and the most any of
    /// them used.
    small_streak: u32,
    streak_max: usize,
    /// Threads for zero fills of [`FILL_SPLIT`] bytes or more: the open scope's.
    fill_threads: Cell<usize>,
}

impl Arena {
    pub(crate) fn new() -> Arena {
        Arena {
            bump: Bump::new(),
            in_use: Cell::new(0),
            high_water: Cell::new(0),
            limit: None,
            resets: 0,
            regrowths: 0,
            releases: 0,
            small_streak: 0,
            streak_max: 0,
            fill_threads: Cell::new(1),
        }
    }

    /// Threads for large zero fills from now on (a scope sets its graph's): a gradient
    /// buffer zeroed by one thread before a parallel rule adds into it made the zeroing a
    /// serial part of every step.
    pub(crate) fn set_fill_threads(&self, threads: usize) {
        self.fill_threads.set(threads.max(1));
    }

    pub(crate) fn set_limit(&mut self, limit: Option<usize>) {
        self.limit = limit;
    }

    fn reserve(&self, len: usize, size: usize) -> Result<usize, AllocFail> {
        let requested = len.checked_mul(size).ok_or(AllocFail::Oom { requested: usize::MAX })?;
        let in_use = self.in_use.get();
        let total = in_use.saturating_add(requested);
        if let Some(limit) = self.limit {
            if total > limit {
                return Err(AllocFail::Limit { requested, in_use, limit });
            }
        }
        Ok(requested)
    }

    fn commit(&self, requested: usize) {
        let total = self.in_use.get() + requested;
        self.in_use.set(total);
        if total > self.high_water.get() {
            self.high_water.set(total);
        }
    }

    /// Counts `bytes` held elsewhere for this scope (the tape's index payloads) against the
    /// limit and in the statistics, as if they were allocated here.
    pub(crate) fn charge(&self, bytes: usize) -> Result<(), AllocFail> {
        let requested = self.reserve(bytes, 1)?;
        self.commit(requested);
        Ok(())
    }

    /// A zero-filled slice of `len` elements.
    #[inline]
    pub(crate) fn alloc_zeroed<T: Pod>(&self, len: usize) -> Result<&mut [T], AllocFail> {
        self.alloc_fill(len, T::zeroed())
    }

    /// A slice of `len` copies of `value`.
    #[inline]
    pub(crate) fn alloc_fill<T: Pod>(&self, len: usize, value: T) -> Result<&mut [T], AllocFail> {
        let requested = self.reserve(len, std::mem::size_of::<T>())?;
        if requested >= FILL_DOWN {
            return self.alloc_fill_down(len, value, requested);
        }
        let out = self.bump.try_alloc_slice_fill_copy(len, value).map_err(|_| AllocFail::Oom { requested })?;
        self.commit(requested);
        Ok(out)
    }

    /// [`alloc_fill`](Self::alloc_fill) of `requested >= FILL_DOWN` bytes. Out of line so
    /// that the small path, inlined into every op's recording and backward, stays short.
    #[inline(never)]
    fn alloc_fill_down<T: Pod>(&self, len: usize, value: T, requested: usize) -> Result<&mut [T], AllocFail> {
        // Copying `uninit` stores nothing: this only reserves the slice.
        let raw = self.bump.try_alloc_slice_fill_copy(len, MaybeUninit::uninit());
        let raw = raw.map_err(|_| AllocFail::Oom { requested })?;
        let threads = self.fill_threads.get();
        let out = if threads > 1 && requested >= FILL_SPLIT && bytemuck::bytes_of(&value).iter().all(|&b| b == 0) {
            zero_split(raw, threads)
        } else {
            fill_down(raw, value)
        };
        self.commit(requested);
        Ok(out)
    }

    /// A slice filled from an exact-size iterator, in one pass. Out of line: inlined, it
    /// made each op's recording function too large to be inlined itself (W3 `tanh` on one
    /// element: 6 more instructions per op, callgrind).
    #[inline(never)]
    pub(crate) fn alloc_iter<T: Pod, I>(&self, iter: I) -> Result<&mut [T], AllocFail>
    where
        I: IntoIterator<Item = T>,
        I::IntoIter: ExactSizeIterator,
    {
        let iter = iter.into_iter();
        let len = iter.len();
        if len <= SMALL_FILL {
            let requested = self.reserve(len, std::mem::size_of::<T>())?;
            let out = self.bump.try_alloc_slice_fill_iter(iter).map_err(|_| AllocFail::Oom { requested })?;
            self.commit(requested);
            return Ok(out);
        }
        self.alloc_iter_long(iter, len)
    }

    /// [`alloc_iter`](Self::alloc_iter) of more than [`SMALL_FILL`] elements.
    ///
    /// bumpalo fills from an iterator through `next().expect(..)` per element, a loop that
    /// does not vectorise. Writing through a zip into the reserved slice is a counted loop
    /// over both, which vectorises, and stores every element once.
    #[inline]
    fn alloc_iter_long<T: Pod>(&self, iter: impl Iterator<Item = T>, len: usize) -> Result<&mut [T], AllocFail> {
        let requested = self.reserve(len, std::mem::size_of::<T>())?;
        // Copying `uninit` stores nothing: this only reserves the slice.
        let raw = self.bump.try_alloc_slice_fill_copy(len, MaybeUninit::uninit());
        let out = fill_from(raw.map_err(|_| AllocFail::Oom { requested })?, iter);
        self.commit(requested);
        Ok(out)
    }

    /// Frees everything at once. O(1) after warm-up: a `Pod`-only arena has nothing to drop.
    pub(crate) fn reset(&mut self) {
        let total = self.bump.allocated_bytes();
        self.bump.reset();
        if self.bump.allocated_bytes() < total {
            // Several chunks were needed: keep one that holds what this scope used, plus
            // room for alignment padding, so that the next iteration of the same shape
            // needs no new chunk. (The chunks' total overshoots: bumpalo doubles them.)
            if self.resets > 0 {
                self.regrowths += 1;
            }
            let capacity = slack(self.in_use.get()).min(total);
            if let Ok(bump) = Bump::try_with_capacity(capacity) {
                self.bump = bump;
            }
            heap::return_freed_pages();
        }
        self.resets += 1;
        self.in_use.set(0);
    }

    /// Ends a scope: frees everything, and applies the release policy. Returns whether
    /// memory went back to the system.
    ///
    /// Hysteresis: only a run of [`RELEASE_AFTER`] consecutive scopes that each used under
    /// a quarter of the capacity shrinks the arena (to the most any of them used, plus
    /// slack), and only if that frees at least 1 MiB. One large scope in the run (a
    /// training step between evaluation steps) starts it over, so alternating large and
    /// small scopes never shrinks and regrows.
    pub(crate) fn end_scope(&mut self) -> bool {
        let used = self.in_use.get();
        self.reset();
        let capacity = self.bump.allocated_bytes();
        if used < capacity / 4 {
            self.small_streak += 1;
            self.streak_max = self.streak_max.max(used);
        } else {
            self.small_streak = 0;
            self.streak_max = 0;
        }
        if self.small_streak < RELEASE_AFTER {
            return false;
        }
        let target = slack(self.streak_max);
        self.small_streak = 0;
        self.streak_max = 0;
        if capacity.saturating_sub(target) < RELEASE_MIN {
            return false;
        }
        self.bump = Bump::try_with_capacity(target).unwrap_or_else(|_| Bump::new());
        heap::return_freed_pages();
        self.releases += 1;
        true
    }

    /// Gives all of the arena's memory back to the system; the next scope allocates anew.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.reset();
        self.bump = Bump::new();
        heap::return_freed_pages();
        self.small_streak = 0;
        self.streak_max = 0;
        self.releases += 1;
    }

    pub(crate) fn stats(&self) -> ArenaStats {
        ArenaStats {
            bytes_in_use: self.in_use.get(),
            high_water: self.high_water.get(),
            capacity: self.bump.allocated_bytes(),
            regrowths: self.regrowths,
            releases: self.releases,
        }
    }
}

/// Giving freed chunks' pages back to the system.
///
/// glibc's malloc serves a block from the brk heap when it is below its mmap threshold,
/// and raises that threshold to the size of each mmapped block it frees, up to 32 MiB. So
/// once any large block has been freed (a scratch arena consolidating after a checkpointed
/// block, say), the chunks an arena grows through next come from the heap; freeing them
/// in the middle of the heap leaves their touched pages resident for the life of the
/// process, unless a later allocation happens to reuse them. A warmed-up graph allocates
/// nothing, so none does. Measured on W8 with checkpoints (CHANGELOG.md, `1808fce`): 25 MiB of
/// a 135 MiB peak RSS were such pages. The arena frees chunks only when it consolidates or
/// releases, at most once per growth, so trimming then costs nothing per step.
mod heap {
    /// Returns the free pages of the C heap to the system (glibc's `malloc_trim`).
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    #[allow(unsafe_code)]
    pub(super) fn return_freed_pages() {
        // SAFETY: `malloc_trim` has no preconditions. It takes the allocator's own locks
        // and gives back only pages inside chunks that are already free (glibc >= 2.8
        // `madvise`s those in the middle of the heap too), so no live allocation changes.
        unsafe {
            libc::malloc_trim(0);
        }
    }

    /// Other allocators return large blocks to the system on free, or offer no portable
    /// way to ask.
    #[cfg(not(all(target_os = "linux", target_env = "gnu")))]
    pub(super) fn return_freed_pages() {}
}

/// Writes `value` into every element of `out`, the last cache line first, and returns it
/// initialised.
///
/// bumpalo hands out each chunk from its top down, so a scope's values follow one another
/// at falling addresses. Filled forwards, each new value is a short rising run of stores
/// below the last one, a pattern that the hardware prefetcher follows badly once the
/// values no longer fit in cache; filled from the top down, the stores of a whole chain of
/// values fall monotonically. On a chain of 10,000 ops on 4 KiB values (40 MB, beyond the
/// 32 MiB L3) recording measured about 1.5x faster in most runs (CHANGELOG.md, `84afa26`; first
/// described in `git show 7037a6f:docs/benchmarks.md`, "Values filled from the top down").
///
/// The cast at the end is `<[MaybeUninit<T>]>::assume_init_mut`, stable only from Rust
/// 1.93, after the workspace's MSRV.
#[allow(unsafe_code)]
fn fill_down<T: Pod>(out: &mut [MaybeUninit<T>], value: T) -> &mut [T] {
    const LINE: usize = 64;
    let per_line = (LINE / std::mem::size_of::<T>().max(1)).max(1);
    for line in out.rchunks_mut(per_line) {
        for e in line {
            e.write(value);
        }
    }
    let (ptr, len) = (out.as_mut_ptr().cast::<T>(), out.len());
    // SAFETY: the loop wrote all of `out` (`rchunks_mut` covers it); `MaybeUninit<T>` has
    // `T`'s layout; the slice reborrows `out` mutably, so nothing else reaches it.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}

/// [`zero_split`]'s pieces: 32 KiB, a few per thread on the W2 activations' gradients.
const SPLIT_PIECE: usize = 1 << 15;

/// `out` zeroed by pieces of [`SPLIT_PIECE`] bytes spread over `threads` tasks, then viewed
/// as initialised. Zeros only: all-zero bytes are a valid `T` for every `Pod` type.
#[allow(unsafe_code)]
fn zero_split<T: Pod>(out: &mut [MaybeUninit<T>], threads: usize) -> &mut [T] {
    let (ptr, len, bytes) = (out.as_mut_ptr(), out.len(), std::mem::size_of_val(out));
    // SAFETY: the same memory as `out`, viewed as bytes, which `MaybeUninit<u8>` may hold
    // in any state; it reborrows `out` mutably, so nothing else reaches it.
    let raw = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), bytes) };
    crate::kernels::par::for_chunks(threads, raw, SPLIT_PIECE, &|_, piece: &mut [MaybeUninit<u8>]| {
        piece.fill(MaybeUninit::new(0));
    });
    // SAFETY: `for_chunks` calls the closure once on each piece of a partition of `raw`
    // (the `chunks_mut` of the halves of `split_at_mut`, down to one task each), which
    // writes every byte of it, so every byte of `out` is 0, a valid `T` (`Pod` implies
    // `Zeroable`); `MaybeUninit<T>` has `T`'s layout; `raw` is not used again.
    unsafe { std::slice::from_raw_parts_mut(ptr.cast::<T>(), len) }
}

/// Room for `used` bytes, plus alignment padding and slack.
fn slack(used: usize) -> usize {
    used.saturating_add(used / 16).saturating_add(64 * 1024)
}

/// `out[i] = iter.next()` for every `i`; elements the iterator does not supply (an
/// `ExactSizeIterator` whose `len` overstated) are zero. A function of its own so that `out`
/// is a `&mut` argument, which tells LLVM that no store to it changes what the iterator's
/// closure reads (a captured scalar, say); without that it reloads the scalar for every
/// element and cannot vectorise.
///
/// Writing straight into the reserved slice replaced zero-filling it first and then
/// overwriting it: on W3 `tanh` over 1,024 elements the fill was 2,300 of the 10,340
/// instructions an op's recording took (callgrind, CHANGELOG.md).
#[inline(never)]
#[allow(unsafe_code)]
fn fill_from<T: Pod>(out: &mut [MaybeUninit<T>], iter: impl Iterator<Item = T>) -> &mut [T] {
    // Under runtime dispatch, so that the iterator's work (an elementwise function, say)
    // vectorises for AVX2/AVX-512 where the CPU has them.
    let written = crate::kernels::simd::run(
        out.len(),
        #[inline(always)]
        || fill_loop(out, iter),
    );
    if written < out.len() {
        fill_cold(&mut out[written..]);
    }
    let (ptr, len) = (out.as_mut_ptr().cast::<T>(), out.len());
    // SAFETY: `fill_loop` wrote `out[..written]` and `fill_cold` the rest, so every element
    // is initialised; `MaybeUninit<T>` has `T`'s layout; the slice reborrows `out`
    // mutably, so nothing else reaches it.
    unsafe { std::slice::from_raw_parts_mut(ptr, len) }
}

/// Zeroes what a short iterator left unwritten. Cold: the engine's iterators are exact.
#[cold]
fn fill_cold<T: Pod>(rest: &mut [MaybeUninit<T>]) {
    for e in rest {
        e.write(T::zeroed());
    }
}

/// The loop of [`fill_from`]; returns how many elements it wrote. `out` must be a function
/// argument: its `noalias` tells LLVM that stores to it cannot change what the iterator
/// reads (a captured scalar, say), which a closure's captured reference does not.
#[inline(always)]
fn fill_loop<T: Pod>(out: &mut [MaybeUninit<T>], iter: impl Iterator<Item = T>) -> usize {
    let mut written = 0;
    for (o, v) in out.iter_mut().zip(iter) {
        o.write(v);
        written += 1;
    }
    written
}

#[cfg(test)]
mod tests {
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
}
