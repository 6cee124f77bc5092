//! GEMM through faer: the only file that calls faer's matrix product.
//!
//! Row-major slices become faer views with `from_row_major_slice`; transposes are views
//! (`.transpose()`), never copies; backward accumulates with `Accum::Add`.
//!
//! On more than one thread a large product is cut into one tile of the output per thread
//! (the longer side halved at each level, so a square output becomes a grid), each a
//! sequential faer call, run with `rayon::join`. faer 0.24's own
//! parallel product allocates its job table and lets its workers allocate packing buffers
//! on every call (9 to 14 heap allocations per product); its sequential path packs into a
//! buffer kept per thread, so after the first product on each pool thread the tiled
//! product allocates nothing. faer's result does not depend on how the output is split
//! (each element is one microkernel's sum over the same `k` blocks), so the bits are those
//! of the one-thread product: checked for W2's eight shapes by
//! `benches/examples/gemm_par.rs` and by the training-step test at 1, 2 and 4 threads.

use faer::linalg::matmul::matmul;
use faer::{Accum, MatMut, MatRef, Par};

use crate::dtype::Float;
use crate::error::{Error, Loc};
use crate::shape::{Shape, MAX_RANK};

/// `dst (m×n) ← op(a)·op(b) (+ dst if accumulate)`, all row-major.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm<T>(
    dst: &mut [T],
    a: &[T],
    a_t: bool,
    b: &[T],
    b_t: bool,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
    par: Par,
) where
    T: faer::traits::ComplexField + faer::traits::Conjugate<Canonical = T> + Float,
{
    let dst = MatMut::from_row_major_slice_mut(dst, m, n);
    let a = if a_t { MatRef::from_row_major_slice(a, k, m).transpose() } else { MatRef::from_row_major_slice(a, m, k) };
    let b = if b_t { MatRef::from_row_major_slice(b, n, k).transpose() } else { MatRef::from_row_major_slice(b, k, n) };
    let beta = if accumulate { Accum::Add } else { Accum::Replace };
    // Decided on the whole product's shape, before any tiling, so that every thread count
    // takes the same path and gets the same bits.
    if (2..=NARROW).contains(&n) && m >= NARROW_MIN_ROWS && a_t {
        narrow(dst, beta, a, b);
        return;
    }
    // faer's own parallel path is never taken (it allocates): a product is split into
    // sequential calls, or runs whole on the calling thread. Matrix-vector products and
    // rank-1 updates (faer has special kernels for them) and products too small to share
    // run whole, and every tile keeps enough work to take faer's blocked path, as the whole
    // product does (faer switches to a different small-matrix kernel below 16³). `tiles`
    // halves the longer side at each level, so a square output (a weight gradient `xᵀ·dy`,
    // 256×256 in W8) is cut into a grid: up to one task per 32×32 block, where capping the
    // count at one per 32 rows or columns of the longer side left half of 16 threads idle.
    let blocks = (m / TILE_ALIGN).saturating_mul(n / TILE_ALIGN).max(m.max(n) / TILE_ALIGN);
    let tasks = par.degree().min(blocks).min(m.saturating_mul(n).saturating_mul(k) / MIN_TILE_MNK);
    if tasks > 1 && m.min(n) > 1 && k > 1 {
        tiles(dst, beta, a, b, tasks);
    } else {
        sequential(dst, beta, a, b);
    }
}

/// Above this inner dimension a sequential product runs as a sum of products over `k`
/// blocks of [`K_BLOCK`].
const K_SPLIT: usize = 1024;
/// The `k` block of a long reduction.
const K_BLOCK: usize = 256;

/// One faer call, or, for a long reduction with `a` used transposed (a weight gradient
/// `xᵀ·dy` sums over every row of the batch), one per block of 256 along `k`, each adding
/// into `dst`. On the 2-core AVX2 machine this is 7–17% faster
/// (two runs; CHANGELOG.md, `cc6b98a`) for W10's four weight-gradient shapes (`m, n ∈ {128, 384, 512}`,
/// `k = 2048`; `benches/examples/gemm_db.rs`): faer's own `k` blocking is coarser. The
/// split depends only on `k`, so every way of tiling the output gives the same bits.
fn sequential<T>(mut dst: MatMut<'_, T>, mut beta: Accum, a: MatRef<'_, T>, b: MatRef<'_, T>)
where
    T: faer::traits::ComplexField + faer::traits::Conjugate<Canonical = T> + Float,
{
    let k = a.ncols();
    // Only the measured case: `a` used transposed (unit row stride), as in `xᵀ·dy`.
    if k < K_SPLIT || a.row_stride() != 1 {
        matmul(dst, beta, a, b, T::ONE, Par::Seq);
        return;
    }
    for start in (0..k).step_by(K_BLOCK) {
        let len = K_BLOCK.min(k - start);
        let (ak, bk) = (a.subcols(start, len), b.subrows(start, len));
        matmul(dst.as_mut(), beta, ak, bk, T::ONE, Par::Seq);
        beta = Accum::Add;
    }
}

/// Output columns up to which a row-major product with `a` used transposed goes through
/// [`narrow`].
const NARROW: usize = 16;
/// Rows per block in [`narrow`].
const NARROW_ROWS: usize = 256;
/// The fewest output rows that take [`narrow`].
const NARROW_MIN_ROWS: usize = 64;

/// A tall, narrow row-major product (`2 <= n <= 16`, `m >= 64`) with `a` used transposed
/// (as in a classifier's weight gradient `hᵀ·dy`), on the calling thread, one block of up
/// to 256 rows at a time: faer computes each block into a column-major buffer on the
/// stack, which it fills with its full-height microkernel, and the block is added (or
/// copied) into `dst`.
/// Given `dst` as it is, faer would compute the transposed product, `n` rows high, with
/// most of each microkernel's rows idle: W2's `dW2 += h1ᵀ·g2` (1024×256×10) took 0.157 ms
/// that way and 0.065 ms this way, the add-back included (`benches/examples/gemm_w2`,
/// "col-dst", 1 thread, 2026-12-03). The blocks depend only on `m`, so the bits do not
/// depend on the thread count. (With `a` not transposed, as in the classifier's forward
/// `h·W`, packing `a`'s rows for this layout cost more than it saved: 0.106 against
/// 0.079 ms.)
fn narrow<T>(mut dst: MatMut<'_, T>, beta: Accum, a: MatRef<'_, T>, b: MatRef<'_, T>)
where
    T: faer::traits::ComplexField + faer::traits::Conjugate<Canonical = T> + Float,
{
    let (m, n) = (dst.nrows(), dst.ncols());
    let add = matches!(beta, Accum::Add);
    let mut buf = [T::ZERO; NARROW_ROWS * NARROW];
    for r0 in (0..m).step_by(NARROW_ROWS) {
        let rows = NARROW_ROWS.min(m - r0);
        let block = &mut buf[..rows * n];
        let tmp = MatMut::from_column_major_slice_mut(block, rows, n);
        matmul(tmp, Accum::Replace, a.subrows(r0, rows), b, T::ONE, Par::Seq);
        let mut out = dst.as_mut().subrows_mut(r0, rows);
        for i in 0..rows {
            for j in 0..n {
                let v = block[j * rows + i];
                let d = &mut out[(i, j)];
                *d = if add { *d + v } else { v };
            }
        }
    }
}

/// `dst ← op(a)·op(b) (+ dst if accumulate)` on one thread, for matrices that sit inside
/// larger row-major buffers: `dst` is `m×n` with `ld_dst` elements between row starts,
/// `a` is `m×k` (stored `k×m` when `a_t`) with row stride `lda`, `b` is `k×n` (stored
/// `n×k` when `b_t`) with row stride `ldb`. Each slice starts at its matrix's first element
/// and reaches at least its last. Attention's heads are such blocks of a packed
/// `[T, 3C]` sequence.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm_strided<T>(
    dst: &mut [T],
    ld_dst: usize,
    a: &[T],
    lda: usize,
    a_t: bool,
    b: &[T],
    ldb: usize,
    b_t: bool,
    (m, k, n): (usize, usize, usize),
    accumulate: bool,
) where
    T: faer::traits::ComplexField + faer::traits::Conjugate<Canonical = T> + Float,
{
    // Not `MatMut::from_row_major_slice_with_stride_mut`: faer 0.24.4's builds a
    // column-major view (unit row stride), so the transposed column-major view it is.
    let dst = MatMut::from_column_major_slice_with_stride_mut(dst, n, m, ld_dst).transpose_mut();
    let view = |x, rows, cols, ld, t: bool| {
        if t {
            MatRef::from_row_major_slice_with_stride(x, cols, rows, ld).transpose()
        } else {
            MatRef::from_row_major_slice_with_stride(x, rows, cols, ld)
        }
    };
    let (a, b) = (view(a, m, k, lda, a_t), view(b, k, n, ldb, b_t));
    let beta = if accumulate { Accum::Add } else { Accum::Replace };
    matmul(dst, beta, a, b, T::ONE, Par::Seq);
}

/// Tile boundaries fall on multiples of this many rows or columns.
const TILE_ALIGN: usize = 32;
/// The fewest multiply-adds a tile gets: well above faer's small-matrix cut-off (16³), and
/// enough that splitting pays for the fork-join.
const MIN_TILE_MNK: usize = 1 << 16;

/// `dst ← a·b (+ dst)` as `threads` sequential faer calls on tiles of `dst`, halving the
/// longer side at each level (so a square output becomes a grid).
fn tiles<T>(dst: MatMut<'_, T>, beta: Accum, a: MatRef<'_, T>, b: MatRef<'_, T>, threads: usize)
where
    T: faer::traits::ComplexField + faer::traits::Conjugate<Canonical = T> + Float,
{
    let (m, n) = (dst.nrows(), dst.ncols());
    let long = m.max(n);
    // A side shorter than two blocks is not cut: each tile keeps at least 32 rows or columns.
    if threads <= 1 || long < 2 * TILE_ALIGN {
        sequential(dst, beta, a, b);
        return;
    }
    let left = threads / 2;
    let at = (long * left / threads).next_multiple_of(TILE_ALIGN).min(long - TILE_ALIGN);
    if n >= m {
        let (l, r) = dst.split_at_col_mut(at);
        let (bl, br) = b.split_at_col(at);
        rayon::join(|| tiles(l, beta, a, bl, left), || tiles(r, beta, a, br, threads - left));
    } else {
        let (top, bottom) = dst.split_at_row_mut(at);
        let (at_, ab) = a.split_at_row(at);
        rayon::join(|| tiles(top, beta, at_, b, left), || tiles(bottom, beta, ab, b, threads - left));
    }
}

/// The shapes of a (batched) product `op(a)·op(b)`: `op(a): [..., m, k]`,
/// `op(b): [..., k, n]`, where `op` transposes the last two axes of an operand whose flag
/// is set (`a` is then stored `[..., k, m]`, `b` `[..., n, k]`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct MatMulDims {
    pub m: usize,
    pub k: usize,
    pub n: usize,
    /// Broadcast batch shape (rank 0 for a plain 2-D product).
    pub batch: Shape,
    pub a_batch: Shape,
    pub b_batch: Shape,
    /// Whether `a`, `b` are used transposed.
    pub ta: bool,
    pub tb: bool,
}

impl MatMulDims {
    /// The product's dimensions and output shape; `Err(None)` if ranks are below 2, inner
    /// sizes differ or batch dims do not broadcast, `Err(Some(dims))` if the output `dims`
    /// would hold more elements than fit.
    pub(crate) fn new(a: &Shape, b: &Shape) -> Result<(MatMulDims, Shape), Option<Vec<usize>>> {
        MatMulDims::new_t(a, b, false, false)
    }

    /// As [`new`](MatMulDims::new), for `op(a)·op(b)` with `a` transposed if `ta` and `b`
    /// if `tb` (the last two axes; `a` and `b` are the stored shapes).
    pub(crate) fn new_t(a: &Shape, b: &Shape, ta: bool, tb: bool) -> Result<(MatMulDims, Shape), Option<Vec<usize>>> {
        let (ra, rb) = (a.rank(), b.rank());
        if ra < 2 || rb < 2 {
            return Err(None);
        }
        let (m, k) = if ta { (a.dim(ra - 1), a.dim(ra - 2)) } else { (a.dim(ra - 2), a.dim(ra - 1)) };
        let (k2, n) = if tb { (b.dim(rb - 1), b.dim(rb - 2)) } else { (b.dim(rb - 2), b.dim(rb - 1)) };
        if k != k2 {
            return Err(None);
        }
        // The batch parts of an empty operand may multiply past any limit: they are only
        // broadcast, never allocated.
        let a_batch = a.leading(ra - 2);
        let b_batch = b.leading(rb - 2);
        let batch = a_batch.broadcast_dims(&b_batch).ok_or(None)?;
        let mut out = batch.to_array();
        let r = batch.rank();
        if r + 2 > crate::shape::MAX_RANK {
            return Err(None);
        }
        out[r] = m;
        out[r + 1] = n;
        let out = Shape::new(&out[..r + 2]).map_err(|_| Some(out[..r + 2].to_vec()))?;
        Ok((MatMulDims { m, k, n, batch, a_batch, b_batch, ta, tb }, out))
    }

    /// The typed error of a product of `a` and `b` that [`new`](MatMulDims::new) refused.
    pub(crate) fn error(op: &'static str, a: Shape, b: Shape, problem: Option<Vec<usize>>, location: Loc) -> Error {
        match problem {
            None => Error::MatMulShape { lhs: a, rhs: b, location },
            Some(dims) => Error::InvalidShape {
                op,
                shape: a,
                detail: format!("the product with {b} would have shape {dims:?}, more elements than fit in memory"),
                location,
            },
        }
    }

    /// Calls `f(batch, a_batch, b_batch)` with matrix indices for every output matrix. Does
    /// nothing when any operand or the output is empty: then the product and both of its
    /// gradients are empty or zero (the buffers start zeroed), and the batch count may be
    /// astronomically large.
    pub(crate) fn for_each(&self, mut f: impl FnMut(usize, usize, usize)) {
        if self.m == 0 || self.k == 0 || self.n == 0 || self.batch.is_empty() {
            return;
        }
        if self.batch.rank() == 0 {
            f(0, 0, 0);
            return;
        }
        let sa = self.a_batch.broadcast_strides(&self.batch);
        let sb = self.b_batch.broadcast_strides(&self.batch);
        super::for_each2(&self.batch, &sa, &sb, f);
    }
}

/// Output item `o`'s operand items `(ia, ib)` in a batch where `a` or `b` may be broadcast.
struct Items {
    dims: [usize; MAX_RANK],
    sa: [usize; MAX_RANK],
    sb: [usize; MAX_RANK],
    rank: usize,
}

impl Items {
    fn new(d: &MatMulDims) -> Items {
        let mut dims = [1; MAX_RANK];
        for (o, &v) in dims.iter_mut().zip(d.batch.dims()) {
            *o = v as usize;
        }
        let (sa, sb) = (d.a_batch.broadcast_strides(&d.batch), d.b_batch.broadcast_strides(&d.batch));
        Items { dims, sa, sb, rank: d.batch.rank() }
    }

    #[inline]
    fn of(&self, mut o: usize) -> (usize, usize) {
        let (mut ia, mut ib) = (0, 0);
        for axis in (0..self.rank).rev() {
            let i = o % self.dims[axis];
            o /= self.dims[axis];
            ia += i * self.sa[axis];
            ib += i * self.sb[axis];
        }
        (ia, ib)
    }
}

/// Spreads a batch of products over the threads, one whole sequential product per item:
/// runs `f(o, ia, ib, block)` for every output item `o` (operand items `ia`, `ib`),
/// `block` being item `o`'s `len` elements of `dst`, and returns `true`; or returns
/// `false` without running anything, and the caller runs the items in order, each product
/// split as [`gemm`] decides. A batch is spread when `dst` has a block of its own per
/// output item (its batch shape `own` is the output's; the operands it reads may be
/// broadcast, as a convolution's weights are over its images) and the batch has at least
/// as many items as threads: attention's `[B, H, T, D]` products are 128 small GEMMs, and
/// splitting each of them in two cost a fork-join per GEMM. The bits are the same either
/// way (see the module doc).
fn spread<T: Float>(
    d: &MatMulDims,
    own: &Shape,
    par: Par,
    dst: &mut [T],
    len: usize,
    f: impl Fn(usize, usize, usize, &mut [T]) + Sync,
) -> bool {
    let threads = super::par::threads(par);
    let work = d.m > 0 && d.k > 0 && d.n > 0;
    let items = d.batch.numel();
    if !(threads > 1 && *own == d.batch && work && items >= threads) {
        return false;
    }
    let at = Items::new(d);
    super::par::for_chunks(threads, &mut dst[..items * len], len, &|s, block: &mut [T]| {
        let (ia, ib) = at.of(s / len);
        f(s / len, ia, ib, block)
    });
    true
}

/// At most this many groups of output items sum into a gradient shared by the whole batch
/// ([`sum_groups`]).
const SUM_GROUPS: usize = 16;

/// Into how many groups the products that sum into the gradient of an operand with batch
/// shape `own` are split, each group's sum computed on its own (in parallel) and the
/// group sums then added in group order: more than 1 only when the operand is one matrix
/// broadcast over a batch of products (a convolution's weights, summed over its images)
/// with at least [`MIN_TILE_MNK`] multiply-adds per group. A function of the shapes alone,
/// so the sums are the same bits at any thread count; the groups' sums live in
/// `groups × m×k` (or `× k×n`) elements of scratch that the caller provides.
pub(crate) fn sum_groups(d: &MatMulDims, own: &Shape) -> usize {
    let items = d.batch.numel();
    if own.numel() != 1 || items < 2 || d.m == 0 || d.k == 0 || d.n == 0 {
        return 1;
    }
    let work = items.saturating_mul(d.m).saturating_mul(d.k).saturating_mul(d.n);
    let groups = SUM_GROUPS.min(items).min(work / MIN_TILE_MNK).max(1);
    // Equal runs of items, none empty.
    items.div_ceil(items.div_ceil(groups))
}

/// Which operand's gradient a backward product writes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Side {
    A,
    B,
}

impl Side {
    /// `(this side's item, the other operand's item)` of an output item's `(ia, ib)`.
    #[inline]
    fn pick(self, (ia, ib): (usize, usize)) -> (usize, usize) {
        if self == Side::A {
            (ia, ib)
        } else {
            (ib, ia)
        }
    }
}

/// `dst (=|+=) Σ_o item(o)` over the output items in `groups` runs of consecutive items:
/// run `r`'s sum goes into `scratch`'s `r`-th block of `len` (`item(o, other, block, add)`
/// writes or adds item `o`'s product, `other` being the other operand's item), runs spread
/// over the threads; then every element of `dst` gets its runs' sums added in run order.
fn grouped<T: Float>(
    d: &MatMulDims,
    (groups, side): (usize, Side),
    par: Par,
    (dst, first): (&mut [T], bool),
    scratch: &mut [T],
    item: impl Fn(usize, usize, &mut [T], bool) + Sync,
) {
    let (items, len) = (d.batch.numel(), dst.len());
    let per = items.div_ceil(groups);
    let at = Items::new(d);
    let threads = super::par::threads(par);
    super::par::for_chunks(threads, &mut scratch[..groups * len], len, &|s, sum: &mut [T]| {
        let run = s / len;
        for (j, o) in (run * per..items.min((run + 1) * per)).enumerate() {
            item(o, side.pick(at.of(o)).1, sum, j > 0);
        }
    });
    let sums = &scratch[..groups * len];
    let chunk = if len < super::par::MIN_PARALLEL { len } else { super::par::CHUNK };
    super::par::for_chunks(threads, dst, chunk, &|s, out: &mut [T]| {
        for (i, o) in out.iter_mut().enumerate() {
            let mut acc = sums[s + i];
            for r in 1..groups {
                acc += sums[r * len + s + i];
            }
            *o = if first { acc } else { *o + acc };
        }
    });
}

/// The products of a backward pass into the gradient `g` of operand `side` (one block of
/// `len` per item of that operand): `item(o, other, block, add, par)` writes or adds
/// output item `o`'s product into its block, `other` being the other operand's item. In
/// groups (`sum_groups`, when `scratch` holds them), spread over the threads, or item by
/// item in order, each product then split as [`gemm`] decides.
fn grad_items<T: Float>(
    d: &MatMulDims,
    side: Side,
    (g, first): (&mut [T], bool),
    par: Par,
    scratch: &mut [T],
    item: impl Fn(usize, usize, &mut [T], bool, Par) + Sync,
) {
    let (own, len) = if side == Side::A { (&d.a_batch, d.m * d.k) } else { (&d.b_batch, d.k * d.n) };
    let groups = sum_groups(d, own);
    if groups > 1 && scratch.len() >= groups * len {
        grouped(d, (groups, side), par, (g, first), scratch, |o, x, g, add| item(o, x, g, add, Par::Seq));
        return;
    }
    let add = adds_into(d, own, first, g, par);
    if !spread(d, own, par, g, len, |o, ia, ib, blk| item(o, side.pick((ia, ib)).1, blk, add, Par::Seq)) {
        d.for_each(|o, ia, ib| {
            let (mine, other) = side.pick((ia, ib));
            item(o, other, &mut g[mine * len..(mine + 1) * len], add, par)
        });
    }
}

/// Batched forward: `out[i] = op(a[ia]) · op(b[ib])`.
pub(crate) fn forward<T: Float>(d: &MatMulDims, a: &[T], b: &[T], out: &mut [T], par: Par) {
    let (m, k, n, ta, tb) = (d.m, d.k, d.n, d.ta, d.tb);
    let item = |ia: usize, ib: usize, o: &mut [T], par| {
        let (a, b) = (&a[ia * m * k..(ia + 1) * m * k], &b[ib * k * n..(ib + 1) * k * n]);
        T::gemm(o, a, ta, b, tb, (m, k, n), false, par);
    };
    if !spread(d, &d.batch, par, out, m * n, |_, ia, ib, o| item(ia, ib, o, Par::Seq)) {
        d.for_each(|o, ia, ib| item(ia, ib, &mut out[o * m * n..(o + 1) * m * n], par));
    }
}

/// Whether the products into gradient `g` of an operand with batch shape `own` add
/// (`Accum::Add`) rather than write. A first gradient (`first`: `g`'s elements are
/// unspecified) is written when every output item writes its own block (nothing is
/// broadcast) and the product is not empty, so every element is written once; otherwise
/// `g` is zero-filled here and the products add into it.
fn adds_into<T: Float>(d: &MatMulDims, own: &Shape, first: bool, g: &mut [T], par: Par) -> bool {
    let writes_all = d.m > 0 && d.k > 0 && d.n > 0 && *own == d.batch;
    let add = !(first && writes_all);
    if first && add {
        super::par::fill(par, g, T::ZERO);
    }
    add
}

/// `da[ia] += dout[i] · op(b[ib])ᵀ` over the batch (transposed back if `a` is used
/// transposed: `da[ia] += op(b[ib]) · dout[i]ᵀ`); with `first`, `da`'s elements are
/// unspecified and are overwritten (`=` instead of `+=`). `scratch` holds
/// [`sum_groups`]`(d, &d.a_batch) × m×k` elements or more when that is above 1 (its
/// contents are overwritten); with less, the products sum in one run.
pub(crate) fn backward_a<T: Float>(
    d: &MatMulDims,
    dout: &[T],
    b: &[T],
    da: &mut [T],
    first: bool,
    par: Par,
    scratch: &mut [T],
) {
    let (m, k, n, ta, tb) = (d.m, d.k, d.n, d.ta, d.tb);
    let item = |o: usize, ib: usize, g: &mut [T], add: bool, par| {
        let (dout, b) = (&dout[o * m * n..(o + 1) * m * n], &b[ib * k * n..(ib + 1) * k * n]);
        if ta {
            T::gemm(g, b, tb, dout, true, (k, n, m), add, par);
        } else {
            T::gemm(g, dout, false, b, !tb, (m, n, k), add, par);
        }
    };
    grad_items(d, Side::A, (da, first), par, scratch, item);
}

/// `db[ib] += op(a[ia])ᵀ · dout[i]` over the batch (transposed back if `b` is used
/// transposed: `db[ib] += dout[i]ᵀ · op(a[ia])`); with `first` and `scratch`, as for
/// [`backward_a`] (`k×n` per group).
pub(crate) fn backward_b<T: Float>(
    d: &MatMulDims,
    dout: &[T],
    a: &[T],
    db: &mut [T],
    first: bool,
    par: Par,
    scratch: &mut [T],
) {
    let (m, k, n, ta, tb) = (d.m, d.k, d.n, d.ta, d.tb);
    let item = |o: usize, ia: usize, g: &mut [T], add: bool, par| {
        let (a, dout) = (&a[ia * m * k..(ia + 1) * m * k], &dout[o * m * n..(o + 1) * m * n]);
        if tb {
            T::gemm(g, dout, true, a, ta, (n, m, k), add, par);
        } else {
            T::gemm(g, a, !ta, dout, false, (k, m, n), add, par);
        }
    };
    grad_items(d, Side::B, (db, first), par, scratch, item);
}
