//! Large elementwise ops, reductions, softmax and the losses split over the graph's
//! threads, with results bitwise identical whatever the thread count.
//!
//! Below [`MIN_PARALLEL`] elements an op is one call of its kernel on the calling thread.
//! From there on the work is cut into chunks whose size depends only on the shapes, never
//! on the thread count, and each chunk is one call of the same per-chunk kernel that the
//! small case uses; threads only decide which chunks run where. So a vectorised kernel
//! with its own tail handling sees exactly the same calls at 1, 2 or 16 threads, and a
//! reduction sums at most [`MAX_PARTIALS`] per-chunk partial sums in chunk order, again
//! whatever the thread count. The chunks are spread over `threads` rayon tasks with
//! `rayon::join`, which keeps its jobs on the stack: no heap allocation per op.
//!
//! Each chunk hands its kernel a fresh `#[inline(always)]` closure that calls the formula,
//! not a reference to it: through `&F` the formula (GELU's, say) stayed behind a call per
//! element that LLVM did not inline into the vectorised loop (W10 ran 2.25x slower).

// The closures clippy calls redundant are the point: see the module doc.
#![allow(clippy::redundant_closure)]

use faer::Par;

use crate::dtype::Float;
use crate::shape::Shape;

/// Ops on fewer elements run as one kernel call on the calling thread: below this, a
/// fork-join (a few microseconds) costs more than the work it would share.
pub(crate) const MIN_PARALLEL: usize = 1 << 15;
/// Elements per chunk of an elementwise op (128 KiB of `f32`, a few L2-sized blocks per
/// thread on the W2 activations).
pub(crate) const CHUNK: usize = 1 << 13;
/// The most partial sums a full reduction combines; its chunks grow past [`CHUNK`] so that
/// there are never more, and the partials live in a stack array.
pub(crate) const MAX_PARTIALS: usize = 64;

/// Columns per piece when a reduction over rows is split by columns (a bias gradient):
/// 256 B of `f32` per row, so that a 256-wide bias splits four ways.
pub(crate) const COLUMN_BLOCK: usize = 64;

/// The thread count of `par` (1 for `Par::Seq`).
#[inline]
pub(crate) fn threads(par: Par) -> usize {
    par.degree().max(1)
}

/// Tasks per thread when an op is split over more than one thread.
///
/// One task per thread makes each op wait for its slowest thread: a thread that the
/// machine runs slower (a core shared with another process or VM, an interrupt, the calling
/// thread arriving late from serial work) holds up every op by its whole share. With four
/// runs of pieces per thread, `rayon::join`'s work stealing lets the threads that finish
/// first take the runs the slow one has not started. Which pieces exist, and so the bits,
/// does not change; only which thread runs them.
pub(crate) const TASKS_PER_THREAD: usize = 4;

/// Calls `f(start, piece)` for consecutive pieces of `out` of `chunk` elements (the last
/// may be shorter), `start` being the piece's offset in `out`. On one thread the pieces run
/// in order on the calling thread; on `threads > 1` they are cut into up to
/// `threads ×` [`TASKS_PER_THREAD`] tasks, each a contiguous run of pieces, which the
/// threads share by work stealing.
pub(crate) fn for_chunks<U: Send>(threads: usize, out: &mut [U], chunk: usize, f: &(impl Fn(usize, &mut [U]) + Sync)) {
    let chunk = chunk.max(1);
    let count = out.len().div_ceil(chunk);
    let tasks = if threads > 1 { threads.saturating_mul(TASKS_PER_THREAD) } else { 1 };
    split(out, 0, chunk, count, tasks.clamp(1, count.max(1)), f);
}

fn split<U: Send>(
    out: &mut [U],
    start: usize,
    chunk: usize,
    count: usize,
    tasks: usize,
    f: &(impl Fn(usize, &mut [U]) + Sync),
) {
    if tasks <= 1 {
        for (i, piece) in out.chunks_mut(chunk).enumerate() {
            f(start + i * chunk, piece);
        }
        return;
    }
    let left_tasks = tasks / 2;
    let left = count * left_tasks / tasks;
    let (l, r) = out.split_at_mut((left * chunk).min(out.len()));
    rayon::join(
        || split(l, start, chunk, left, left_tasks, f),
        || split(r, start + left * chunk, chunk, count - left, tasks - left_tasks, f),
    );
}

// Each entry point tests the size inline and keeps the split out of line
// (`#[inline(never)]`), so that the small case, which the tape-overhead workloads hit on
// every op, compiles to the same tight loop as a direct kernel call.

/// `out[i] = f(x[i])` (see [`super::map`]).
#[inline]
pub(crate) fn map<T: Float>(par: Par, x: &[T], out: &mut [T], f: impl Fn(T) -> T + Sync) {
    if out.len() < MIN_PARALLEL {
        super::map(x, out, f);
    } else {
        map_chunks(par, x, out, f);
    }
}

#[inline(never)]
fn map_chunks<T: Float>(par: Par, x: &[T], out: &mut [T], f: impl Fn(T) -> T + Sync) {
    for_chunks(threads(par), out, CHUNK, &|s, o: &mut [T]| {
        super::map(
            &x[s..s + o.len()],
            o,
            #[inline(always)]
            |v| f(v),
        )
    });
}

/// `x[i] = f(x[i])` in place (see [`super::map_in_place`]).
#[inline(never)]
pub(crate) fn map_in_place<T: Float>(par: Par, x: &mut [T], f: impl Fn(T) -> T + Sync) {
    if x.len() < MIN_PARALLEL {
        super::map_in_place(x, f);
    } else {
        for_chunks(threads(par), x, CHUNK, &|_, o: &mut [T]| {
            super::map_in_place(
                o,
                #[inline(always)]
                |v| f(v),
            )
        });
    }
}

/// `dx[i] += dout[i] · d(x[i], y[i])` (see [`super::map_grad`]).
#[inline]
pub(crate) fn map_grad<T: Float>(par: Par, dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T + Sync) {
    if dx.len() < MIN_PARALLEL {
        super::map_grad(dout, x, y, dx, d);
    } else {
        map_grad_chunks(par, dout, x, y, dx, d);
    }
}

/// Each chunk runs under SIMD dispatch ([`super::map_grad_long`]): a chunk is long enough
/// that the dispatch check costs nothing, and through the plain kernel the chunks ran at
/// the baseline instruction set (GELU's derivative took a fifth of a W10 step).
#[inline(never)]
fn map_grad_chunks<T: Float>(par: Par, dout: &[T], x: &[T], y: &[T], dx: &mut [T], d: impl Fn(T, T) -> T + Sync) {
    for_chunks(threads(par), dx, CHUNK, &|s, g: &mut [T]| {
        let e = s + g.len();
        super::map_grad_long(
            &dout[s..e],
            &x[s..e],
            &y[s..e],
            g,
            #[inline(always)]
            |a, b| d(a, b),
        );
    });
}

/// `dx[i] = 0 + dout[i] · d(x[i], y[i])` into a first gradient of at least
/// [`MIN_PARALLEL`] elements, whose elements are unspecified (see
/// [`super::map_grad_write`]).
#[inline(never)]
pub(crate) fn map_grad_write<T: Float>(
    par: Par,
    dout: &[T],
    x: &[T],
    y: &[T],
    dx: &mut [T],
    d: impl Fn(T, T) -> T + Sync,
) {
    for_chunks(threads(par), dx, CHUNK, &|s, g: &mut [T]| {
        let e = s + g.len();
        super::map_grad_write(
            &dout[s..e],
            &x[s..e],
            &y[s..e],
            g,
            #[inline(always)]
            |a, b| d(a, b),
        );
    });
}

/// A unary rule's derivative written into a first gradient of at least [`MIN_PARALLEL`]
/// elements, whose elements are unspecified: `dx = 0 + dout ⊙ f'(x, y)`.
pub(crate) struct WriteGrad<'a, T> {
    pub x: &'a [T],
    pub y: &'a [T],
    pub dout: &'a [T],
    pub dx: &'a mut [T],
    pub par: Par,
}

impl<T: Float> super::GradMap<T> for WriteGrad<'_, T> {
    type Out = ();
    fn map(self, d: impl Fn(T, T) -> T + Sync) {
        map_grad_write(self.par, self.dout, self.x, self.y, self.dx, d);
    }
    fn scale(self, c: T) {
        map(self.par, self.dout, self.dx, move |g| T::ZERO + c * g);
    }
    fn map_long(self, d: impl Fn(T, T) -> T + Sync) {
        self.map(d);
    }
}

/// `out[i] = v`: a released gradient buffer zeroed for reuse, split over the threads (on
/// the calling thread alone it was a serial pass: 5% of a 2-thread W10 step was `memset`).
#[inline]
pub(crate) fn fill<T: Float>(par: Par, out: &mut [T], v: T) {
    if out.len() < MIN_PARALLEL {
        out.fill(v);
    } else {
        fill_chunks(par, out, v);
    }
}

#[inline(never)]
fn fill_chunks<T: Float>(par: Par, out: &mut [T], v: T) {
    for_chunks(threads(par), out, CHUNK, &|_, o: &mut [T]| o.fill(v));
}

/// `dst[i] += c · src[i]` (see [`super::axpy`]).
#[inline]
pub(crate) fn axpy<T: Float>(par: Par, dst: &mut [T], c: T, src: &[T]) {
    if dst.len() < MIN_PARALLEL {
        super::axpy(dst, c, src);
    } else {
        axpy_chunks(par, dst, c, src);
    }
}

#[inline(never)]
fn axpy_chunks<T: Float>(par: Par, dst: &mut [T], c: T, src: &[T]) {
    for_chunks(threads(par), dst, CHUNK, &|s, d: &mut [T]| super::axpy(d, c, &src[s..s + d.len()]));
}

/// `dst[i] += src[i]`.
#[inline]
pub(crate) fn add_assign<T: Float>(par: Par, dst: &mut [T], src: &[T]) {
    if dst.len() < MIN_PARALLEL {
        super::add_assign(dst, src);
    } else {
        for_chunks(threads(par), dst, CHUNK, &|s, d: &mut [T]| super::add_assign(d, &src[s..s + d.len()]));
    }
}

/// Every row of `out` (rows of `row.len()` elements) set to `row`: a bias before the
/// product that adds into it.
pub(crate) fn fill_rows<T: Float>(par: Par, out: &mut [T], row: &[T]) {
    let n = row.len().max(1);
    if out.len() < MIN_PARALLEL {
        out.chunks_exact_mut(n).for_each(|r| r.copy_from_slice(row));
    } else {
        for_chunks(threads(par), out, tile_chunk(n), &|_, o: &mut [T]| {
            o.chunks_exact_mut(n).for_each(|r| r.copy_from_slice(row))
        });
    }
}

/// A 2-D shape `[rows, cols]` for a piece of a tiled broadcast.
fn rows(rows: usize, cols: usize) -> Shape {
    Shape::new(&[rows, cols]).expect("a piece of a shape that exists")
}

/// Elements per chunk of a broadcast whose small side repeats every `n` elements: whole
/// repetitions, about [`CHUNK`] elements.
fn tile_chunk(n: usize) -> usize {
    (CHUNK / n).max(1) * n
}

/// `out[i] = f(a[ia], b[ib])` with broadcasting (see [`super::binary`]). Equal shapes and
/// a side that repeats end to end (a bias row) are split; other broadcasts run on the
/// calling thread.
#[inline]
pub(crate) fn binary<T: Float>(
    par: Par,
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (out, so): (&mut [T], &Shape),
    f: impl Fn(T, T) -> T + Sync,
) {
    if out.len() < MIN_PARALLEL {
        super::binary((a, sa), (b, sb), (out, so), f);
    } else {
        binary_chunks(par, (a, sa), (b, sb), (out, so), f);
    }
}

#[inline(never)]
fn binary_chunks<T: Float>(
    par: Par,
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    (out, so): (&mut [T], &Shape),
    f: impl Fn(T, T) -> T + Sync,
) {
    let t = threads(par);
    if sa == so && sb == so {
        for_chunks(t, out, CHUNK, &|s, o: &mut [T]| {
            let e = s + o.len();
            let sh = rows(1, o.len());
            super::binary(
                (&a[s..e], &sh),
                (&b[s..e], &sh),
                (o, &sh),
                #[inline(always)]
                |p, q| f(p, q),
            );
        });
    } else if let (true, Some(n)) = (sa == so, super::tile_len(sb, so)) {
        for_chunks(t, out, tile_chunk(n), &|s, o: &mut [T]| {
            let sh = rows(o.len() / n, n);
            super::binary(
                (&a[s..s + o.len()], &sh),
                (b, &rows(1, n)),
                (o, &sh),
                #[inline(always)]
                |p, q| f(p, q),
            );
        });
    } else if let (true, Some(n)) = (sb == so, super::tile_len(sa, so)) {
        for_chunks(t, out, tile_chunk(n), &|s, o: &mut [T]| {
            let sh = rows(o.len() / n, n);
            super::binary(
                (a, &rows(1, n)),
                (&b[s..s + o.len()], &sh),
                (o, &sh),
                #[inline(always)]
                |p, q| f(p, q),
            );
        });
    } else {
        super::binary((a, sa), (b, sb), (out, so), f);
    }
}

/// `da[ia] += g(dout[i], a[ia], b[ib])`, summed over `a`'s broadcast dimensions (see
/// [`super::binary_grad`]). When `a` repeats along `dout` (a bias), its gradient is a sum
/// over the repetitions: the columns are split, and every element still sums its rows in
/// order, so the bits do not depend on the split.
#[inline]
pub(crate) fn binary_grad<T: Float>(
    par: Par,
    (dout, so): (&[T], &Shape),
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    da: &mut [T],
    g: impl Fn(T, T, T) -> T + Sync,
) {
    if dout.len() < MIN_PARALLEL {
        super::binary_grad((dout, so), (a, sa), (b, sb), da, g);
    } else {
        binary_grad_chunks(par, (dout, so), (a, sa), (b, sb), da, g);
    }
}

#[inline(never)]
fn binary_grad_chunks<T: Float>(
    par: Par,
    (dout, so): (&[T], &Shape),
    (a, sa): (&[T], &Shape),
    (b, sb): (&[T], &Shape),
    da: &mut [T],
    g: impl Fn(T, T, T) -> T + Sync,
) {
    let t = threads(par);
    if sa == so && sb == so {
        for_chunks(t, da, CHUNK, &|s, d: &mut [T]| {
            let e = s + d.len();
            let sh = rows(1, d.len());
            super::binary_grad(
                (&dout[s..e], &sh),
                (&a[s..e], &sh),
                (&b[s..e], &sh),
                d,
                #[inline(always)]
                |u, p, q| g(u, p, q),
            );
        });
    } else if let (true, Some(n)) = (sa == so, super::tile_len(sb, so)) {
        for_chunks(t, da, tile_chunk(n), &|s, d: &mut [T]| {
            let e = s + d.len();
            let sh = rows(d.len() / n, n);
            super::binary_grad(
                (&dout[s..e], &sh),
                (&a[s..e], &sh),
                (b, &rows(1, n)),
                d,
                #[inline(always)]
                |u, p, q| g(u, p, q),
            );
        });
    } else if let (true, Some(n)) = (sb == so, super::tile_len(sa, so)) {
        // Column blocks of a fixed width; every block walks all rows in order.
        for_chunks(t, da, COLUMN_BLOCK, &|c, d: &mut [T]| {
            let e = c + d.len();
            super::simd::run(
                d.len() * (dout.len() / n.max(1)),
                #[inline(always)]
                || {
                    for (gc, bc) in dout.chunks_exact(n).zip(b.chunks_exact(n)) {
                        for (((d, &go), &x), &y) in d.iter_mut().zip(&gc[c..e]).zip(&a[c..e]).zip(&bc[c..e]) {
                            *d += g(go, x, y);
                        }
                    }
                },
            );
        });
    } else {
        super::binary_grad((dout, so), (a, sa), (b, sb), da, g);
    }
}

/// Sum of all elements: above [`MIN_PARALLEL`], at most [`MAX_PARTIALS`] chunk sums (each
/// by [`super::reduce::sum`]) added in chunk order.
#[inline]
pub(crate) fn sum<T: Float>(par: Par, x: &[T]) -> T {
    if x.len() < MIN_PARALLEL {
        super::reduce::sum(x)
    } else {
        sum_large(par, x)
    }
}

#[inline(never)]
fn sum_large<T: Float>(par: Par, x: &[T]) -> T {
    let chunk = x.len().div_ceil(MAX_PARTIALS).next_multiple_of(64).max(CHUNK);
    sum_chunks(par, x.len(), chunk, &|s, e| super::reduce::sum(&x[s..e]))
}

/// `Σ_i part(start_i, end_i)` over chunks `[start_i, end_i)` of `0..len` of `chunk`
/// elements, at most [`MAX_PARTIALS`] of them (`chunk` must make it so), the partials
/// computed on `par`'s threads and added in order.
pub(crate) fn sum_chunks<T: Float>(
    par: Par,
    len: usize,
    chunk: usize,
    part: &(impl Fn(usize, usize) -> T + Sync),
) -> T {
    let count = len.div_ceil(chunk);
    assert!(count <= MAX_PARTIALS, "a reduction's chunks are sized to at most MAX_PARTIALS");
    let mut partials = [T::ZERO; MAX_PARTIALS];
    for_chunks(threads(par), &mut partials[..count], 1, &|i, p: &mut [T]| {
        p[0] = part(i * chunk, ((i + 1) * chunk).min(len));
    });
    let mut total = T::ZERO;
    for p in &partials[..count] {
        total += *p;
    }
    total
}

/// Rows per chunk of a row-wise op on rows of `len` elements: about [`CHUNK`] elements.
pub(crate) fn row_chunk(len: usize) -> usize {
    (CHUNK / len.max(1)).max(1)
}

/// Runs `f(outer_range, in_piece, out_piece)` over blocks of the outer dimension of `x`
/// viewed as `(outer, len, inner)`, where `out` has `out_len` elements per outer index.
fn outer_blocks<T: Float>(
    par: Par,
    x: &[T],
    (outer, len, inner): (usize, usize, usize),
    out: &mut [T],
    out_len: usize,
    f: &(impl Fn(usize, &[T], &mut [T]) + Sync),
) {
    let per = row_chunk(len * inner);
    // Pieces of `out` of `per` outer indices each.
    for_chunks(threads(par), &mut out[..outer * out_len], per * out_len, &|s, o: &mut [T]| {
        let (o0, n) = (s / out_len, o.len() / out_len);
        f(n, &x[o0 * len * inner..(o0 + n) * len * inner], o);
    });
}

/// `out[o, i] = Σ_l x[o, l, i]` (see [`super::reduce::sum_axis`]); every output element sums its
/// `len` inputs in order, on whichever thread, so the split does not change the bits.
pub(crate) fn sum_axis<T: Float>(par: Par, x: &[T], dims: (usize, usize, usize), out: &mut [T]) {
    let (outer, len, inner) = dims;
    if x.len() < MIN_PARALLEL {
        return super::reduce::sum_axis(x, dims, out);
    }
    if outer >= 2 {
        outer_blocks(par, x, dims, out, inner, &|n, xp, op| super::reduce::sum_axis(xp, (n, len, inner), op));
        return;
    }
    // Few outer blocks (a bias gradient: outer = 1): split the columns.
    for o in 0..outer {
        let xo = &x[o * len * inner..(o + 1) * len * inner];
        for_chunks(threads(par), &mut out[o * inner..(o + 1) * inner], COLUMN_BLOCK, &|c, d: &mut [T]| {
            for l in 0..len {
                super::add_assign(d, &xo[l * inner + c..l * inner + c + d.len()]);
            }
        });
    }
}

/// `dx[o, l, i] += dout[o, i]` (see [`super::reduce::sum_axis_grad`]).
pub(crate) fn sum_axis_grad<T: Float>(par: Par, dout: &[T], dims: (usize, usize, usize), dx: &mut [T]) {
    let (_, len, inner) = dims;
    if dx.len() < MIN_PARALLEL || len * inner == 0 {
        return super::reduce::sum_axis_grad(dout, dims, dx);
    }
    let per = row_chunk(len * inner);
    for_chunks(threads(par), dx, per * len * inner, &|s, d: &mut [T]| {
        let (o0, n) = (s / (len * inner), d.len() / (len * inner));
        super::reduce::sum_axis_grad(&dout[o0 * inner..(o0 + n) * inner], (n, len, inner), d);
    });
}

/// Softmax (or log-softmax) along the axis (see [`super::reduce::softmax_axis`]), split over the
/// outer dimension; each row is computed whole by one call, so the split does not change
/// the bits. With a single outer block it runs on the calling thread.
pub(crate) fn softmax_axis<T: Float>(par: Par, x: &[T], dims: (usize, usize, usize), out: &mut [T], log: bool) {
    let (outer, len, inner) = dims;
    if x.len() < MIN_PARALLEL || outer < 2 {
        return super::reduce::softmax_axis(x, dims, out, log);
    }
    let per = row_chunk(len * inner);
    for_chunks(threads(par), out, per * len * inner, &|s, o: &mut [T]| {
        let n = o.len() / (len * inner);
        super::reduce::softmax_axis(&x[s..s + o.len()], (n, len, inner), o, log);
    });
}

/// The gradient of [`softmax_axis`] (see [`super::reduce::softmax_axis_grad`]), split the same way.
pub(crate) fn softmax_axis_grad<T: Float>(
    par: Par,
    dy: &[T],
    y: &[T],
    dims: (usize, usize, usize),
    dx: &mut [T],
    log: bool,
) {
    let (outer, len, inner) = dims;
    if dx.len() < MIN_PARALLEL || outer < 2 {
        return super::reduce::softmax_axis_grad(dy, y, dims, dx, log);
    }
    let per = row_chunk(len * inner);
    for_chunks(threads(par), dx, per * len * inner, &|s, d: &mut [T]| {
        let e = s + d.len();
        let n = d.len() / (len * inner);
        super::reduce::softmax_axis_grad(&dy[s..e], &y[s..e], (n, len, inner), d, log);
    });
}

/// Rows per chunk of a loss over `n` rows of `c` classes: about [`CHUNK`] elements, and
/// never more than [`MAX_PARTIALS`] chunks. Depends only on the shape.
pub(crate) fn loss_rows(n: usize, c: usize) -> usize {
    row_chunk(c).max(n.div_ceil(MAX_PARTIALS)).max(1)
}
