//! A global allocator that counts live heap bytes once enabled, for W6. Before
//! [`enable`] it costs one relaxed load per call, so the timed workloads are unaffected.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering::Relaxed};

pub struct Counting;

static ON: AtomicBool = AtomicBool::new(false);
static LIVE: AtomicI64 = AtomicI64::new(0);

/// Starts counting (bytes freed that were allocated before may make `live` negative;
/// only differences are meaningful).
pub fn enable() {
    ON.store(true, Relaxed);
}

/// Bytes allocated minus bytes freed since [`enable`].
pub fn live() -> i64 {
    LIVE.load(Relaxed)
}

// SAFETY: every call forwards to `System` with the caller's arguments unchanged; the
// counter is a side table that never touches the memory.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if ON.load(Relaxed) {
            LIVE.fetch_add(layout.size() as i64, Relaxed);
        }
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        if ON.load(Relaxed) {
            LIVE.fetch_sub(layout.size() as i64, Relaxed);
        }
        // SAFETY: `ptr` came from `System` through `alloc`/`realloc` with this layout.
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        if ON.load(Relaxed) {
            LIVE.fetch_add(layout.size() as i64, Relaxed);
        }
        // SAFETY: same contract as ours, passed through.
        unsafe { System.alloc_zeroed(layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if ON.load(Relaxed) {
            LIVE.fetch_add(new_size as i64 - layout.size() as i64, Relaxed);
        }
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds `new_size`'s rules.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}
