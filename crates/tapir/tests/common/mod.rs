//! A counting global allocator for the allocation and memory tests.
//!
//! Counters are kept per thread: the test harness's own threads allocate now and then
//! while a test runs, and those allocations are not the engine's. The engine runs on the
//! calling thread when matrix products are sequential (`Graph::set_threads(1)`).
//!
//! Each test binary that uses it installs it with
//! `#[global_allocator] static ALLOC: common::Counting = common::Counting::new();`.

#![allow(dead_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

thread_local! {
    // `const` initialisers need no lazy set-up, so touching them never allocates.
    static ALLOCATIONS: Cell<usize> = const { Cell::new(0) };
    static LIVE: Cell<isize> = const { Cell::new(0) };
}

/// Forwards to the system allocator and counts, for the calling thread, allocation calls
/// and bytes allocated minus bytes freed.
pub struct Counting;

impl Counting {
    pub const fn new() -> Counting {
        Counting
    }

    /// Allocation calls made by this thread so far (alloc, alloc_zeroed and realloc).
    pub fn allocations(&self) -> usize {
        ALLOCATIONS.with(Cell::get)
    }

    /// Bytes this thread allocated minus bytes it freed.
    pub fn live_bytes(&self) -> isize {
        LIVE.with(Cell::get)
    }
}

fn count(added: usize, freed: usize, call: bool) {
    // `try_with`: during thread teardown the slots may be gone; those calls go uncounted.
    let _ = LIVE.try_with(|l| l.set(l.get() + added as isize - freed as isize));
    if call {
        let _ = ALLOCATIONS.try_with(|a| a.set(a.get() + 1));
    }
}

// A global allocator cannot be written in safe code; this one serves tests only.
// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees carry over; the counters are const-initialised thread-locals.
unsafe impl GlobalAlloc for Counting {
    // SAFETY: the trait's contract passes through to `System::alloc`.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 0, true);
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    // SAFETY: the trait's contract passes through to `System::alloc_zeroed`.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count(layout.size(), 0, true);
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    // SAFETY: the trait's contract passes through to `System::dealloc`.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        count(0, layout.size(), false);
        // SAFETY: `ptr` came from this allocator (hence from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    // SAFETY: the trait's contract passes through to `System::realloc`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count(new_size, layout.size(), true);
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
