//! Does faer's GEMM give the same bits whatever the thread count, and what does it cost to
//! run a product as sequential faer calls on column (or row) tiles, one per thread, instead
//! of faer's own parallel product? For each of W2's eight GEMM shapes (row-major, as Tapir
//! stores them), it prints whether `Par::rayon(2)`, `Par::rayon(4)` and 2 and 4 tiles match
//! `Par::Seq` bit for bit, the heap allocations of one warmed-up call (all threads), and
//! the median time of each.
//!
//! ```sh
//! cargo run --release -p benches --example gemm_par
//! ```

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Instant;

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

struct Counting;
static CALLS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every method forwards to `System` unchanged; the counter is a side table.
unsafe impl GlobalAlloc for Counting {
    // SAFETY: the caller's `GlobalAlloc` contract passes unchanged to `System`.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        CALLS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed through.
        unsafe { System.alloc(layout) }
    }
    // SAFETY: the caller's `GlobalAlloc` contract passes unchanged to `System`.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }
    // SAFETY: the caller's `GlobalAlloc` contract passes unchanged to `System`.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        CALLS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed through.
        unsafe { System.alloc_zeroed(layout) }
    }
    // SAFETY: the caller's `GlobalAlloc` contract passes unchanged to `System`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        CALLS.fetch_add(1, Relaxed);
        // SAFETY: the caller's contract, passed through.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// `op(x)` for a row-major `x`, as Tapir's `kernels::matmul::gemm` reads its operands.
fn view<'a>(x: &'a [f32], t: bool, r: usize, c: usize) -> MatRef<'a, f32> {
    if t {
        MatRef::from_row_major_slice(x, c, r).transpose()
    } else {
        MatRef::from_row_major_slice(x, r, c)
    }
}

/// A named product: `(m, k, n)`, whether `a` and `b` are read transposed.
type Product = (&'static str, (usize, usize, usize), bool, bool);

/// How a product is run.
#[derive(Clone, Copy)]
enum Way {
    Faer(Par),
    /// `t` tiles, each a sequential faer call, run with `rayon::join`.
    Tiles(usize),
}

fn tiles(dst: MatMut<'_, f32>, a: MatRef<'_, f32>, b: MatRef<'_, f32>, t: usize) {
    if t <= 1 {
        matmul(dst, Accum::Replace, a, b, 1.0, Par::Seq);
        return;
    }
    let (m, n) = (dst.nrows(), dst.ncols());
    let half = t / 2;
    if n >= m {
        // Split columns at a multiple of 16.
        let at = (n * half / t).div_ceil(16) * 16;
        let at = at.min(n);
        let (l, r) = dst.split_at_col_mut(at);
        let (bl, br) = b.split_at_col(at);
        rayon::join(|| tiles(l, a, bl, half), || tiles(r, a, br, t - half));
    } else {
        let at = ((m * half / t).div_ceil(16) * 16).min(m);
        let (top, bot) = dst.split_at_row_mut(at);
        let (at_, ab) = a.split_at_row(at);
        rayon::join(|| tiles(top, at_, b, half), || tiles(bot, ab, b, t - half));
    }
}

fn run(way: Way, c: &mut [f32], a: &[f32], b: &[f32], (m, k, n): (usize, usize, usize), ta: bool, tb: bool) {
    let dst = MatMut::from_row_major_slice_mut(c, m, n);
    let (a, b) = (view(a, ta, m, k), view(b, tb, k, n));
    match way {
        Way::Faer(par) => matmul(dst, Accum::Replace, a, b, 1.0, par),
        Way::Tiles(t) => tiles(dst, a, b, t),
    }
}

fn main() {
    let reps: usize = std::env::args().nth(1).and_then(|s| s.parse().ok()).unwrap_or(21);
    // W2 (784-1024-1024-10, batch 256): forward x·W, weight gradients hᵀ·dh, input
    // gradients dh·Wᵀ.
    let shapes: [Product; 8] = [
        ("fwd1 x·W0", (256, 784, 1024), false, false),
        ("fwd2 h·W1", (256, 1024, 1024), false, false),
        ("fwd3 h·W2", (256, 1024, 10), false, false),
        ("dW2 hᵀ·dh", (1024, 256, 10), true, false),
        ("dh1 dh·W2ᵀ", (256, 10, 1024), false, true),
        ("dW1 hᵀ·dh", (1024, 256, 1024), true, false),
        ("dh0 dh·W1ᵀ", (256, 1024, 1024), false, true),
        ("dW0 xᵀ·dh", (784, 256, 1024), true, false),
    ];
    let ways = [
        ("seq", Way::Faer(Par::Seq)),
        ("faer2", Way::Faer(Par::rayon(2))),
        ("faer4", Way::Faer(Par::rayon(4))),
        ("tiles2", Way::Tiles(2)),
        ("tiles4", Way::Tiles(4)),
    ];
    println!("shape | way | same bits as seq | allocations/call");
    let data: Vec<_> = shapes
        .iter()
        .map(|&(_, (m, k, n), _, _)| {
            let a: Vec<f32> = (0..m * k).map(|i| ((i * 7919) % 1013) as f32 / 1013.0 - 0.5).collect();
            let b: Vec<f32> = (0..k * n).map(|i| ((i * 104_729) % 997) as f32 / 997.0 - 0.5).collect();
            (a, b, vec![0.0f32; m * n])
        })
        .collect::<Vec<_>>();
    let mut data = data;
    for (si, &(name, dims, ta, tb)) in shapes.iter().enumerate() {
        let (a, b, c) = &mut data[si];
        let mut reference = vec![0.0f32; c.len()];
        run(Way::Faer(Par::Seq), &mut reference, a, b, dims, ta, tb);
        for &(wname, way) in &ways {
            for _ in 0..3 {
                run(way, c, a, b, dims, ta, tb);
            }
            let same = c.iter().zip(&reference).all(|(x, y)| x.to_bits() == y.to_bits());
            let before = CALLS.load(Relaxed);
            run(way, c, a, b, dims, ta, tb);
            let allocs = CALLS.load(Relaxed) - before;
            println!("{name} | {wname} | {same} | {allocs}");
        }
    }
    // The eight products as one step, the ways alternating repetition by repetition, so
    // that load on a shared machine falls on all of them alike.
    let mut times = vec![Vec::new(); ways.len()];
    for _ in 0..reps {
        for (wi, &(_, way)) in ways.iter().enumerate() {
            let t = Instant::now();
            for (si, &(_, dims, ta, tb)) in shapes.iter().enumerate() {
                let (a, b, c) = &mut data[si];
                run(way, c, a, b, dims, ta, tb);
            }
            times[wi].push(t.elapsed().as_secs_f64() * 1e3);
        }
    }
    for (&(wname, _), t) in ways.iter().zip(&mut times) {
        t.sort_by(f64::total_cmp);
        println!("eight products, {wname}: median {:.2} ms, min {:.2} ms ({reps} repetitions)", t[reps / 2], t[0]);
    }
}
