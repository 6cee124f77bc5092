//! The per-iteration arena: a `bumpalo::Bump` that holds only [`bytemuck::Pod`] data.
//!
//! Values and gradients of one scope are bump-allocated here and freed all at once when
//! the scope ends. `Pod` types have no destructors and hold no pointers, so `reset` cannot
//! skip a destructor or leak what one would have freed; and `reset` takes `&mut self`, so
//! the borrow checker proves that no slice handed out by `alloc_*` survives it.
//!
//! Handing out slices below [`FILL_DOWN`] bytes needs no `unsafe`: bumpalo gives
//! `&'a mut [T]` through `&'a Bump`. The engine's other `unsafe` sites are here:
//! [`Arena::reserve_raw`] reserves larger slices without writing them, [`fill_down`]
//! fills them from their last cache line down, [`zero_split`] zeroes large ones over
//! several threads, [`fill_from`] writes an iterator's values straight into a larger
//! slice, [`Arena::alloc_stale`] hands out a primed chunk's memory as it is, and [`heap`]
//! asks glibc to give the pages of chunks the arena has freed back to the system.
//!
//! Primed chunks: when a scope ends, the one chunk the arena keeps is zeroed whole once
//! (see [`Arena::prime`]) unless it already was. Every byte of it is initialised from then
//! on: slices are reserved without writing (never by copying `MaybeUninit::uninit()`
//! into them) and filled with whole `Pod` values, which have no padding bytes. So a slice
//! that the caller overwrites whole (an op's output, a first gradient) can be handed out
//! holding an earlier scope's values, with no pass over it first; a zero fill before the
//! kernel's own pass was a second trip through memory for every output larger than the
//! caches (10% of a 1-thread W11 step, `perf`).
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
    /// The top of the bump's chunk that [`Arena::prime`] zeroed, if the bump has not been
    /// replaced since.
    primed: Option<Primed>,
}

/// The part of a chunk that [`Arena::prime`] zeroed: the top `len` bytes, from address
/// `lo` up, of the one chunk the bump had when its `allocated_bytes()` was `total` (the
/// same value later means no chunk was added, as the bump is never trimmed in between).
#[derive(Debug, Clone, Copy)]
struct Primed {
    total: usize,
    lo: usize,
    len: usize,
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
            primed: None,
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
        let raw = self.reserve_raw(len, requested)?;
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
        let out = fill_from(self.reserve_raw(len, requested)?, iter);
        self.commit(requested);
        Ok(out)
    }

    /// Room for `len` elements (`requested` bytes), not written: whatever the memory held
    /// stays there (a store of `MaybeUninit::uninit()` would make it uninitialised again).
    // An arena hands out disjoint `&mut` slices through `&self`, as bumpalo does.
    #[allow(unsafe_code, clippy::mut_from_ref)]
    fn reserve_raw<T: Pod>(&self, len: usize, requested: usize) -> Result<&mut [MaybeUninit<T>], AllocFail> {
        let layout = std::alloc::Layout::array::<T>(len).map_err(|_| AllocFail::Oom { requested })?;
        let ptr = self.bump.try_alloc_layout(layout).map_err(|_| AllocFail::Oom { requested })?;
        // SAFETY: bumpalo hands out `layout` (`len` elements of `T`, aligned for `T`) at
        // `ptr`, overlapping no other allocation until `reset`, which takes `&mut self`, so
        // the slice's lifetime, tied to `&self`, ends first; `MaybeUninit<T>` may hold any
        // bytes.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.as_ptr().cast::<MaybeUninit<T>>(), len) })
    }

    /// A slice of `len` elements whose values are unspecified: the caller writes every
    /// one before anything reads it (an op's output that its kernel writes whole, a first
    /// gradient). Large slices from the primed part of the chunk keep an earlier scope's
    /// values, with no pass over them (debug builds set those to all-one bytes, NaN for
    /// floats, so that an element the caller leaves unwritten shows in tests); the others
    /// are zeroed.
    #[inline]
    pub(crate) fn alloc_stale<T: Pod>(&self, len: usize) -> Result<&mut [T], AllocFail> {
        let requested = self.reserve(len, std::mem::size_of::<T>())?;
        if requested < FILL_DOWN {
            return self.alloc_zeroed(len);
        }
        self.alloc_stale_large(len, requested)
    }

    #[inline(never)]
    #[allow(unsafe_code, clippy::mut_from_ref)]
    fn alloc_stale_large<T: Pod>(&self, len: usize, requested: usize) -> Result<&mut [T], AllocFail> {
        let raw = self.reserve_raw::<T>(len, requested)?;
        self.commit(requested);
        let total = self.bump.allocated_bytes();
        if !self.primed.is_some_and(|p| p.total == total && raw.as_ptr() as usize >= p.lo) {
            let threads = self.fill_threads.get();
            return Ok(if threads > 1 && requested >= FILL_SPLIT {
                zero_split(raw, threads)
            } else {
                fill_bytes(raw, 0)
            });
        }
        if cfg!(debug_assertions) {
            return Ok(fill_bytes(raw, 0xff));
        }
        let (ptr, len) = (raw.as_mut_ptr().cast::<T>(), raw.len());
        // SAFETY: `allocated_bytes` is what it was when `prime` zeroed the top of the
        // bump's one chunk (a new chunk would have raised it, and `primed` is cleared
        // whenever the bump is replaced), so `raw` lies in that chunk, at or above `lo`:
        // in the part `prime` zeroed. Every byte there has been initialised since: `prime`
        // wrote all of them, and afterwards they are written only with whole `Pod` values
        // (no padding bytes), reservations writing nothing (`reserve_raw`); any bytes are
        // a valid `T` (`Pod`); `MaybeUninit<T>` has `T`'s layout; the slice reborrows
        // `raw` mutably, so nothing else reaches it.
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr, len) })
    }

    /// Zeroes the top `want` bytes of the bump's one chunk (all of it if smaller), where a
    /// scope's slices go first, so that [`alloc_stale`](Self::alloc_stale) can hand that
    /// memory out as it is. Only the part a scope used is zeroed: the chunk's slack stays
    /// untouched, out of the resident set. Once per chunk and size: a no-op if that much
    /// is primed already. The bump must have been reset, so that its whole chunk is free.
    fn prime(&mut self, want: usize) {
        let total = self.bump.allocated_bytes();
        let free = self.bump.chunk_capacity();
        let want = want.min(free);
        if self.primed.is_some_and(|p| p.total == total && p.len >= want) || want < FILL_DOWN {
            return;
        }
        self.primed = None;
        let Ok(raw) = self.reserve_raw::<u8>(free, free) else { return };
        let top = &mut raw[free - want..];
        let lo = top.as_ptr() as usize;
        let threads = self.fill_threads.get();
        if threads > 1 && want >= FILL_SPLIT {
            zero_split(top, threads);
        } else {
            fill_bytes(top, 0);
        }
        // Primed only if that was the whole free space of the same chunk.
        let whole = self.bump.allocated_bytes() == total && self.bump.chunk_capacity() == 0;
        self.bump.reset();
        if whole {
            self.primed = Some(Primed { total, lo, len: want });
        }
    }

    /// Frees everything at once. O(1) after warm-up: a `Pod`-only arena has nothing to drop.
    pub(crate) fn reset(&mut self) {
        let used = self.in_use.get();
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
                self.primed = None;
            }
            heap::return_freed_pages();
        }
        self.prime(used);
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
        self.primed = None;
        self.prime(target);
        heap::return_freed_pages();
        self.releases += 1;
        true
    }

    /// Gives all of the arena's memory back to the system; the next scope allocates anew.
    pub(crate) fn shrink_to_fit(&mut self) {
        self.reset();
        self.bump = Bump::new();
        self.primed = None;
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

/// `out` with every byte set to `byte`, viewed as initialised: all-zero and all-one bytes
/// are a valid `T` for every `Pod` type, as any bytes are.
#[allow(unsafe_code)]
fn fill_bytes<T: Pod>(out: &mut [MaybeUninit<T>], byte: u8) -> &mut [T] {
    let (ptr, len, bytes) = (out.as_mut_ptr(), out.len(), std::mem::size_of_val(out));
    // SAFETY: the same memory as `out`, viewed as bytes, which `MaybeUninit<u8>` may hold
    // in any state; it reborrows `out` mutably, so nothing else reaches it.
    let raw = unsafe { std::slice::from_raw_parts_mut(ptr.cast::<MaybeUninit<u8>>(), bytes) };
    raw.fill(MaybeUninit::new(byte));
    // SAFETY: every byte of `out` was just written; any bytes are a valid `T` (`Pod`);
    // `MaybeUninit<T>` has `T`'s layout; `raw` is not used again.
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
mod tests;
