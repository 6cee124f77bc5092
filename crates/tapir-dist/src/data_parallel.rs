//! [`DataParallel`]: start-up broadcast and model check, gradient averaging in one
//! collective per step, gradient accumulation without communication, metric averaging,
//! and error propagation from any rank to every rank.
//!
//! ## One reduction per step
//!
//! The reduction buffer is one flat `Vec<T>` of `P + 1 + size` elements, allocated once:
//!
//! ```text
//! [ w_r·g_r (P gradient elements) | w_r (sample count) | 0 … 1 … 0 (one failure flag per rank) ]
//! ```
//!
//! One `MPI_Allreduce(MPI_SUM)` of it gives every rank `Σ_r w_r·g_r`, the global sample
//! count `B = Σ_r w_r`, and which ranks failed, so the common step costs exactly one MPI
//! call; the failed-rank path adds one broadcast of the failed rank's message. The
//! gradient becomes `Σ_r w_r·g_r / B`: the mean over the *global* batch when each rank's
//! `g_r` is the mean over its own `w_r` samples, whether or not the shards are equal.
//!
//! rsmpi has no in-place all-reduce, so a second buffer of the same size receives the
//! sum. The copy into the send buffer is not extra work: it is the pass that multiplies
//! by `w_r`, and the copy out is the pass that divides by `B`. (A contiguous
//! `GradBuffer` would therefore save no pass, which is why `tapir::GradBuffer` is left as
//! it is.)

use tapir::{Float, GradBuffer, ParamStore, Shape};

use crate::comm::Comm;
use crate::error::{invalid, try_grow, try_vec, Error, Result};
use crate::fault;

/// How the summed gradient reaches every rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// One `MPI_Allreduce`. MPI only *recommends* that every rank gets bitwise the same
    /// result; OpenMPI's algorithms for a fixed world size do (our tests hash the
    /// parameters of every rank after every step), but an MPI library that breaks it would
    /// let ranks drift apart. [`DataParallel::check_in_sync`] detects that.
    #[default]
    AllReduce,
    /// `MPI_Reduce` to rank 0, then `MPI_Bcast` of rank 0's sum: two calls, but every rank
    /// holds rank 0's bits by construction, on any MPI library.
    ReduceBroadcast,
}

/// What a reduction produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reduced {
    /// Samples over all ranks (and all accumulated micro-batches) in this step.
    pub samples: usize,
}

/// Data-parallel training over the ranks of a [`Comm`]: every rank holds the whole
/// model, computes gradients on its shard, and [`DataParallel::all_reduce`] averages them.
///
/// The flat reduction buffers are allocated once, in [`DataParallel::new`]; after the
/// first step nothing here allocates on the Rust heap (the MPI library's own buffers are
/// its business).
#[derive(Debug)]
pub struct DataParallel<T: Float, C: Comm> {
    comm: C,
    reduction: Reduction,
    names: Vec<String>,
    shapes: Vec<Shape>,
    numel: usize,
    send: Vec<T>,
    recv: Vec<T>,
    /// Samples accumulated into `send` since the last reduction.
    pending: usize,
    /// Whether `send[..numel]` holds an accumulation (otherwise it is stale).
    has_pending: bool,
    metrics_send: Vec<f64>,
    metrics_recv: Vec<f64>,
    hashes: Vec<u64>,
}

/// Rank 0's description of the model, one entry per parameter: `"name" f32 [2, 3]`.
fn describe<T: Float>(store: &ParamStore<T>) -> Vec<String> {
    store.iter().map(|(_, name, t)| format!("{name:?} {} {}", T::NAME, t.shape())).collect()
}

impl<T: Float, C: Comm> DataParallel<T, C> {
    /// Checks that every rank built the same model as rank 0 and copies rank 0's
    /// parameter values into every rank's `store`.
    ///
    /// Collective: every rank calls it. Costs four collectives (the description's length
    /// and bytes, the comparison, the values); a mismatch costs two more.
    ///
    /// # Errors
    /// [`Error::ModelMismatch`], on every rank, naming the first differing rank, the
    /// first differing parameter and both versions of it (name, dtype, shape);
    /// [`Error::RankFailed`], on every rank, if a rank could not allocate its two reduction
    /// buffers (its message is that rank's [`Error::OutOfMemory`]).
    #[track_caller]
    pub fn new(comm: C, store: &mut ParamStore<T>) -> Result<DataParallel<T, C>> {
        const OP: &str = "DataParallel::new";
        // Gathered in place of a parameter index: this rank could not allocate its buffers.
        const NO_MEMORY: u64 = u64::MAX - 1;
        let mine = describe(store);
        let mut bytes = if comm.rank() == 0 { mine.join("\n").into_bytes() } else { Vec::new() };
        comm.broadcast_bytes(0, &mut bytes);
        let text = String::from_utf8(bytes).expect("rank 0 sent the UTF-8 it made");
        let root: Vec<&str> = if text.is_empty() { Vec::new() } else { text.split('\n').collect() };
        let numel = store.numel();
        // The model exists, so `numel` is a real size, but two more copies of it may not
        // fit: allocate fallibly and let every rank hear of a failure before any waits.
        let len = numel.saturating_add(1).saturating_add(comm.size());
        let buffers = try_vec(OP, "the reduction buffers", len, T::ZERO)
            .and_then(|send| Ok((send, try_vec(OP, "the reduction buffers", len, T::ZERO)?)));
        let first_diff = (0..root.len().max(mine.len()))
            .find(|&i| root.get(i).copied() != mine.get(i).map(String::as_str))
            .map_or(u64::MAX, |i| i as u64);
        let mut diffs = vec![0; comm.size()];
        comm.all_gather_u64(if buffers.is_err() { NO_MEMORY } else { first_diff }, &mut diffs);
        if let Some(rank) = diffs.iter().position(|&d| d == NO_MEMORY) {
            let mut message = match &buffers {
                Err(e) if comm.rank() == rank => e.to_string().into_bytes(),
                _ => Vec::new(),
            };
            comm.broadcast_bytes(rank, &mut message);
            let message = String::from_utf8_lossy(&message).into_owned();
            return Err(Error::RankFailed { op: OP, rank, size: comm.size(), message });
        }
        if let Some(rank) = diffs.iter().position(|&d| d != u64::MAX) {
            let index = usize::try_from(diffs[rank]).expect("an index into this rank's parameters");
            let mut theirs = if comm.rank() == rank {
                mine.get(index).map_or("nothing (it has fewer parameters)".into(), Clone::clone).into_bytes()
            } else {
                Vec::new()
            };
            comm.broadcast_bytes(rank, &mut theirs);
            let root = root.get(index).map_or("nothing (it has fewer parameters)".into(), |s| s.to_string());
            let theirs = String::from_utf8(theirs).expect("the rank sent the UTF-8 it made");
            return Err(Error::ModelMismatch { rank, index, root, theirs });
        }
        let (send, recv) = buffers.expect("every rank allocated its buffers, this one included");
        let shapes: Vec<Shape> = store.iter().map(|(_, _, t)| t.shape()).collect();
        let names: Vec<String> = store.iter().map(|(_, n, _)| n.to_string()).collect();
        let mut dp = DataParallel {
            reduction: Reduction::default(),
            names,
            shapes,
            numel,
            send,
            recv,
            pending: 0,
            has_pending: false,
            metrics_send: Vec::new(),
            metrics_recv: Vec::new(),
            hashes: vec![0; comm.size()],
            comm,
        };
        dp.broadcast_params(store);
        Ok(dp)
    }

    /// Chooses how sums reach every rank (default [`Reduction::AllReduce`]).
    #[must_use]
    pub fn reduction(mut self, reduction: Reduction) -> Self {
        self.reduction = reduction;
        self
    }

    /// The communicator.
    pub fn comm(&self) -> &C {
        &self.comm
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.comm.rank()
    }

    /// Number of ranks.
    pub fn size(&self) -> usize {
        self.comm.size()
    }

    /// Copies rank 0's parameter values to every rank (one broadcast).
    fn broadcast_params(&mut self, store: &mut ParamStore<T>) {
        let mut at = 0;
        for (_, _, t) in store.iter() {
            self.send[at..at + t.numel()].copy_from_slice(t.data());
            at += t.numel();
        }
        self.comm.broadcast(0, &mut self.send[..self.numel]);
        let mut at = 0;
        for (_, t) in store.iter_mut() {
            let n = t.numel();
            t.data_mut().copy_from_slice(&self.send[at..at + n]);
            at += n;
        }
    }

    /// Checks `grads` against the model's layout (count and shapes, by position: the
    /// layout every rank agreed on in [`DataParallel::new`]), so that the reductions can
    /// walk its slots in order whichever store it was made for.
    #[track_caller]
    fn check_grads(&self, op: &'static str, grads: &GradBuffer<T>) -> Result<()> {
        if grads.len() != self.shapes.len() {
            return Err(invalid(
                op,
                format!("the model has {} parameters but the gradient buffer {}", self.shapes.len(), grads.len()),
            ));
        }
        for (((_, g), &shape), name) in grads.iter().zip(&self.shapes).zip(&self.names) {
            if g.shape() != shape {
                return Err(invalid(
                    op,
                    format!("parameter {name:?} has shape {shape} but its gradient {}", g.shape()),
                ));
            }
        }
        Ok(())
    }

    /// Adds `samples · grads` to this rank's pending sum and zeroes `grads`, without any
    /// communication: PyTorch DDP's `no_sync()`. Call it after each micro-batch's
    /// `backward_into` (with `grads` holding the mean gradient over its `samples` samples);
    /// the next [`DataParallel::all_reduce`] or [`DataParallel::step`] reduces the lot, so
    /// the result is the mean over every sample of every micro-batch on every rank.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] if `grads` does not match the model.
    #[track_caller]
    pub fn accumulate(&mut self, grads: &mut GradBuffer<T>, samples: usize) -> Result<()> {
        const OP: &str = "DataParallel::accumulate";
        self.check_grads(OP, grads)?;
        // The sample count travels in the gradient buffer, as `T`: exact up to 2^24 in f32.
        let limit = if T::NAME == "f32" { 1usize << 24 } else { 1usize << 53 };
        // Checked: a huge `samples` must not wrap the pending count back under the limit.
        let pending = self.pending.checked_add(samples).filter(|&n| n <= limit / self.comm.size());
        let Some(pending) = pending else {
            return Err(invalid(
                OP,
                format!(
                    "{} pending + {samples} new samples on each of {} ranks exceed {limit}, the largest count {} \
                     holds exactly",
                    self.pending,
                    self.comm.size(),
                    T::NAME
                ),
            ));
        };
        let w = T::from_usize(samples);
        // The buffer is one slice in the model's layout (checked above): one pass over it.
        let g = grads.as_mut_slice();
        let dst = &mut self.send[..g.len()];
        if self.has_pending {
            dst.iter_mut().zip(&*g).for_each(|(d, &g)| *d += w * g);
        } else {
            dst.iter_mut().zip(&*g).for_each(|(d, &g)| *d = w * g);
        }
        g.fill(T::ZERO);
        self.has_pending = true;
        self.pending = pending;
        Ok(())
    }

    /// Averages the gradients over every rank: the pending sum of
    /// [`DataParallel::accumulate`] (or zero, for a rank with no samples this step) is
    /// reduced, divided by the global sample count and written into `grads`, bitwise the
    /// same on every rank. One collective.
    ///
    /// # Errors
    /// [`Error::RankFailed`] if another rank called [`DataParallel::fail`] (or its
    /// [`DataParallel::step`] closure failed); [`Error::InvalidArgument`] if `grads` does
    /// not match the model, or no rank had a sample (on every rank).
    #[track_caller]
    pub fn all_reduce(&mut self, grads: &mut GradBuffer<T>) -> Result<Reduced> {
        const OP: &str = "DataParallel::all_reduce";
        // A mismatched buffer is this rank's failure: the others must hear of it.
        if let Err(e) = self.check_grads(OP, grads) {
            return self.fail_with(OP, e.to_string());
        }
        self.reduce_flagged(OP, None)?;
        let total = self.recv[self.numel];
        if total == T::ZERO {
            return Err(invalid(OP, "no rank had a sample in this step; pass each rank's sample count"));
        }
        grads.as_mut_slice().iter_mut().zip(&self.recv[..self.numel]).for_each(|(g, &s)| *g = s / total);
        Ok(Reduced { samples: total.to_f64() as usize })
    }

    /// One data-parallel step: zeroes `grads`, runs `local` (forward and `backward_into`
    /// on this rank's shard, returning the number of samples it used; 0 is allowed), adds
    /// its gradient to any pending accumulation and averages over every rank.
    ///
    /// An `Err` or a panic in `local` does not leave the other ranks waiting: this rank
    /// joins the reduction with its failure flag set, and every rank returns
    /// [`Error::RankFailed`] naming it and its message.
    ///
    /// # Errors
    /// [`Error::RankFailed`] (on every rank) if any rank's `local` failed; as
    /// [`DataParallel::all_reduce`].
    #[track_caller]
    pub fn step<E, F>(&mut self, grads: &mut GradBuffer<T>, local: F) -> Result<Reduced>
    where
        E: std::fmt::Display,
        F: FnOnce(&mut GradBuffer<T>) -> std::result::Result<usize, E>,
    {
        const OP: &str = "DataParallel::step";
        grads.zero();
        let samples = match fault::catch(|| local(grads)) {
            Ok(Ok(samples)) => samples,
            Ok(Err(e)) => return self.fail_with(OP, e.to_string()),
            Err(panic) => return self.fail_with(OP, panic),
        };
        if let Err(e) = self.accumulate(grads, samples) {
            return self.fail_with(OP, e.to_string());
        }
        self.all_reduce(grads)
    }

    /// This rank failed: joins the pending reduction with its failure flag set so that no
    /// rank waits, and returns the [`Error::RankFailed`] every rank gets.
    ///
    /// Call it in place of [`DataParallel::all_reduce`] when a rank cannot compute its
    /// gradient; [`DataParallel::step`] does so for you.
    pub fn fail(&mut self, message: impl Into<String>) -> Error {
        match self.fail_with("DataParallel::fail", message.into()) {
            Err(e) => e,
            Ok(_) => unreachable!("fail_with always returns an error"),
        }
    }

    fn fail_with(&mut self, op: &'static str, message: String) -> Result<Reduced> {
        self.send[..self.numel].fill(T::ZERO);
        self.has_pending = true;
        self.pending = 0;
        match self.reduce_flagged(op, Some(message)) {
            Err(e) => Err(e),
            Ok(()) => unreachable!("this rank's own flag is set, so the reduction reports a failure"),
        }
    }

    /// The one collective of a step, then the failure check.
    fn reduce_flagged(&mut self, op: &'static str, failure: Option<String>) -> Result<()> {
        let (p, size, rank) = (self.numel, self.comm.size(), self.comm.rank());
        if !self.has_pending {
            self.send[..p].fill(T::ZERO);
        }
        self.send[p] = T::from_usize(self.pending);
        self.send[p + 1..].fill(T::ZERO);
        if failure.is_some() {
            self.send[p + 1 + rank] = T::ONE;
        }
        match self.reduction {
            Reduction::AllReduce => self.comm.all_reduce_sum(&self.send, &mut self.recv),
            Reduction::ReduceBroadcast => {
                self.comm.reduce_sum_to_root(&self.send, &mut self.recv);
                self.comm.broadcast(0, &mut self.recv);
            }
        }
        self.has_pending = false;
        self.pending = 0;
        if let Some(failed) = self.recv[p + 1..].iter().position(|&f| f != T::ZERO) {
            let mut message = if failed == rank { failure.unwrap_or_default().into_bytes() } else { Vec::new() };
            self.comm.broadcast_bytes(failed, &mut message);
            let message = String::from_utf8_lossy(&message).into_owned();
            return Err(Error::RankFailed { op, rank: failed, size, message });
        }
        Ok(())
    }

    /// Replaces `values` by their weighted mean over the ranks, `Σ_r w_r·v_r / Σ_r w_r`,
    /// with `weight` this rank's `w_r` (its sample count, for a loss or an accuracy). One
    /// collective, of `values.len() + 1 + size` numbers: the weighted values, the weight,
    /// and one slot per rank holding its weight if that weight is invalid; allocation-free
    /// once called with the longest `values`.
    ///
    /// Every rank decides from the reduced slots, so every rank returns the same outcome
    /// and none is left waiting. `values` is unchanged on error.
    ///
    /// # Errors
    /// On every rank, [`Error::InvalidArgument`] naming the first rank whose weight is NaN,
    /// infinite or negative, with that weight; or if the weights sum to zero or to a
    /// non-finite number; [`Error::OutOfMemory`] (on this rank only, before any
    /// collective) if the buffers for `values` cannot be allocated.
    #[track_caller]
    pub fn mean_metrics(&mut self, values: &mut [f64], weight: f64) -> Result<()> {
        const OP: &str = "DataParallel::mean_metrics";
        let (n, size, rank) = (values.len(), self.comm.size(), self.comm.rank());
        // `values` exists and a world is small, so this cannot overflow in practice;
        // saturating all the same (a saturated size fails in `try_grow`, typed).
        let len = n.saturating_add(1 + size);
        if self.metrics_send.len() < len {
            try_grow(OP, "the metric buffers", &mut self.metrics_send, len)?;
            try_grow(OP, "the metric buffers", &mut self.metrics_recv, len)?;
            self.metrics_send.resize(len, 0.0);
            self.metrics_recv.resize(len, 0.0);
        }
        let (send, recv) = (&mut self.metrics_send[..len], &mut self.metrics_recv[..len]);
        let valid = weight.is_finite() && weight >= 0.0;
        // An invalid weight contributes nothing but its slot, so no NaN enters the sums.
        let w = if valid { weight } else { 0.0 };
        for (s, &v) in send.iter_mut().zip(values.iter()) {
            *s = w * v;
        }
        send[n] = w;
        send[n + 1..].fill(0.0);
        if !valid {
            send[n + 1 + rank] = weight;
        }
        self.comm.all_reduce_sum(send, recv);
        // Slot `r` is rank r's weight plus zeros: non-zero (or NaN) exactly when invalid.
        if let Some(bad) = recv[n + 1..].iter().position(|&b| b != 0.0) {
            return Err(invalid(
                OP,
                format!(
                    "rank {bad} of {size} passed the weight {}; weights must be finite and non-negative",
                    recv[n + 1 + bad]
                ),
            ));
        }
        let total = recv[n];
        if !(total.is_finite() && total > 0.0) {
            return Err(invalid(
                OP,
                format!("the weights of all {size} ranks sum to {total}; the sum must be positive and finite"),
            ));
        }
        for (v, &s) in values.iter_mut().zip(recv.iter()) {
            *v = s / total;
        }
        Ok(())
    }

    /// Checks that every rank's `store` holds bitwise the same values (a 64-bit FNV-1a hash
    /// of the bits, gathered from every rank: one collective).
    ///
    /// # Errors
    /// [`Error::RankFailed`] on every rank, naming the first rank whose hash differs from
    /// rank 0's.
    pub fn check_in_sync(&mut self, store: &ParamStore<T>) -> Result<()> {
        let hash = params_hash(store);
        self.comm.all_gather_u64(hash, &mut self.hashes);
        match self.hashes.iter().position(|&h| h != self.hashes[0]) {
            None => Ok(()),
            Some(rank) => Err(Error::RankFailed {
                op: "DataParallel::check_in_sync",
                rank,
                size: self.comm.size(),
                message: format!(
                    "its parameters hash to {:#018x} but rank 0's to {:#018x}",
                    self.hashes[rank], self.hashes[0]
                ),
            }),
        }
    }

    /// Turns this rank's `result` into the same outcome on every rank: `Ok` everywhere if
    /// every rank is `Ok`, else [`Error::RankFailed`] naming the first failed rank and its
    /// message. For work outside [`DataParallel::step`] (loading data, evaluating) that
    /// can fail on one rank; one collective, two more on failure.
    ///
    /// # Errors
    /// As described.
    pub fn agree<R, E: std::fmt::Display>(&mut self, result: std::result::Result<R, E>) -> Result<R> {
        let failed = u64::from(result.is_err());
        self.comm.all_gather_u64(failed, &mut self.hashes);
        let Some(rank) = self.hashes.iter().position(|&f| f != 0) else {
            return Ok(result.unwrap_or_else(|_| unreachable!("this rank reported success")));
        };
        let mut message = match &result {
            Err(e) if rank == self.comm.rank() => e.to_string().into_bytes(),
            _ => Vec::new(),
        };
        self.comm.broadcast_bytes(rank, &mut message);
        Err(Error::RankFailed {
            op: "DataParallel::agree",
            rank,
            size: self.comm.size(),
            message: String::from_utf8_lossy(&message).into_owned(),
        })
    }
}

/// A 64-bit FNV-1a hash of every parameter's bits, in store order (names excluded).
pub fn params_hash<T: Float>(store: &ParamStore<T>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for (_, _, t) in store.iter() {
        for &b in bytemuck::cast_slice::<T, u8>(t.data()) {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

#[cfg(test)]
mod tests;
