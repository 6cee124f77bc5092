//! The per-op profile ([`Graph::set_profiling`](crate::Graph::set_profiling)): for every op
//! kind, how many nodes were recorded and how long recording took (the forward kernel),
//! how many backward rules ran and how long they took, and how much of both was spent in
//! matrix products.
//!
//! [`Profiler`] is the graph's accumulator: a fixed table of counters indexed by
//! [`OpKind::index`], so that counting allocates nothing. A scope holds it while profiling
//! is on; the record path and the backward walk each test one flag they test anyway (the
//! record path's `slow`, the walk's anomaly check), so profiling off costs no branch of
//! its own.
//!
//! Times are exclusive: an op whose rule records or walks other ops (a checkpointed block,
//! recomputed during backward) is charged only for what its nested ops did not take, so
//! that the rows add up to the time the profile covers and nothing is counted twice. A
//! checkpoint's recomputation shows up as the forward time of the ops it records again.

use std::cell::Cell;
use std::fmt;
use std::time::{Duration, Instant};

use crate::tape::op::OpKind;

/// One op kind's counters (nanoseconds).
#[derive(Debug, Default)]
struct Counters {
    calls: Cell<u64>,
    forward: Cell<u64>,
    backward_calls: Cell<u64>,
    backward: Cell<u64>,
    gemm: Cell<u64>,
}

/// A graph's profile so far: one row of counters per op kind.
#[derive(Debug)]
pub(crate) struct Profiler {
    rows: [Counters; OpKind::COUNT],
    /// The time charged to rows so far, to take nested ops' time out of an enclosing op's.
    charged: Cell<u64>,
    /// Matrix-product time of the op being timed, charged to its row when it ends.
    gemm: Cell<u64>,
    /// The backward walk's timer of the rule to come (see [`lap`](Profiler::lap)).
    lap: Cell<Option<Timer>>,
}

/// An op being timed: when it started, and the profile's counters then.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Timer {
    start: Instant,
    charged: u64,
    /// The enclosing op's matrix-product time, restored when this op ends.
    outer_gemm: u64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

fn add(cell: &Cell<u64>, v: u64) {
    cell.set(cell.get().saturating_add(v));
}

impl Default for Profiler {
    fn default() -> Self {
        Profiler {
            rows: std::array::from_fn(|_| Counters::default()),
            charged: Cell::new(0),
            gemm: Cell::new(0),
            lap: Cell::new(None),
        }
    }
}

impl Profiler {
    /// Starts timing an op.
    #[inline]
    pub(crate) fn start(&self) -> Timer {
        Timer { charged: self.charged.get(), outer_gemm: self.gemm.replace(0), start: Instant::now() }
    }

    /// Ends the op that `t` timed: a recording of `kind` (`backward` false) or its backward
    /// rule, charged the time that ops nested in it did not take.
    pub(crate) fn stop(&self, kind: OpKind, backward: bool, t: Timer) {
        let elapsed = nanos(t.start.elapsed());
        let own = elapsed.saturating_sub(self.charged.get() - t.charged);
        let row = &self.rows[kind.index()];
        let (calls, time) = if backward { (&row.backward_calls, &row.backward) } else { (&row.calls, &row.forward) };
        add(calls, 1);
        add(time, own);
        add(&self.charged, own);
        add(&row.gemm, self.gemm.replace(t.outer_gemm));
    }

    /// Starts a backward walk's laps; returns the enclosing walk's timer (a checkpoint's
    /// recomputation walks inside a rule), for [`end_laps`](Profiler::end_laps).
    pub(crate) fn begin_laps(&self) -> Option<Timer> {
        self.lap.replace(Some(self.start()))
    }

    /// Ends the backward rule of a node of `kind` and starts timing the next: the walk's
    /// bookkeeping between two rules is charged to the later one.
    pub(crate) fn lap(&self, kind: OpKind) {
        if let Some(t) = self.lap.get() {
            self.stop(kind, true, t);
            self.lap.set(Some(self.start()));
        }
    }

    /// Ends a walk's laps: the time after its last rule stays with the enclosing op.
    pub(crate) fn end_laps(&self, outer: Option<Timer>) {
        if let Some(t) = self.lap.replace(outer) {
            self.gemm.set(self.gemm.get().saturating_add(t.outer_gemm));
        }
    }

    /// Runs `f`, a matrix product inside the op being timed, and counts its time.
    pub(crate) fn product<R>(&self, f: impl FnOnce() -> R) -> R {
        let start = Instant::now();
        let out = f();
        add(&self.gemm, nanos(start.elapsed()));
        out
    }

    /// Zeroes every counter.
    pub(crate) fn reset(&mut self) {
        *self = Profiler::default();
    }

    /// The rows with any call, most time first.
    pub(crate) fn report(&self) -> Profile {
        let ns = |c: &Cell<u64>| Duration::from_nanos(c.get());
        let mut ops: Vec<OpTime> = OpKind::all()
            .filter_map(|kind| {
                let row = &self.rows[kind.index()];
                (row.calls.get() + row.backward_calls.get() > 0).then(|| OpTime {
                    op: kind.name(),
                    kind,
                    calls: row.calls.get(),
                    forward: ns(&row.forward),
                    backward_calls: row.backward_calls.get(),
                    backward: ns(&row.backward),
                    gemm: ns(&row.gemm),
                })
            })
            .collect();
        ops.sort_by(|a, b| b.total().cmp(&a.total()).then(a.op.cmp(b.op)));
        Profile { ops }
    }

    #[cfg(test)]
    pub(crate) fn charged(&self) -> Duration {
        Duration::from_nanos(self.charged.get())
    }
}

/// Runs `f`, a matrix product, counting its time in `profile` if there is one.
#[inline]
pub(crate) fn product<R>(profile: Option<&Profiler>, f: impl FnOnce() -> R) -> R {
    match profile {
        None => f(),
        Some(p) => p.product(f),
    }
}

/// One op kind's row of a [`Profile`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct OpTime {
    /// The kind's name, as in [`Scope::dump`](crate::Scope::dump) (elementwise ops by
    /// function: `relu`, `add`, ...).
    pub op: &'static str,
    /// The kind.
    pub kind: OpKind,
    /// Nodes of this kind recorded.
    pub calls: u64,
    /// Time spent recording them: checking the arguments, the forward kernel, the node.
    pub forward: Duration,
    /// Backward rules of this kind run.
    pub backward_calls: u64,
    /// Time spent in those rules: the backward kernels and the gradient buffers.
    pub backward: Duration,
    /// Of `forward + backward`, the time inside matrix products (`matmul` and `linear`;
    /// the products inside attention's kernels are not told apart and count as zero).
    pub gemm: Duration,
}

impl OpTime {
    /// `forward + backward`.
    pub fn total(&self) -> Duration {
        self.forward + self.backward
    }
}

/// Where a graph's time went, per op kind: see
/// [`Graph::set_profiling`](crate::Graph::set_profiling). `Display` prints it as a table.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Profile {
    /// One entry per op kind that recorded a node or ran a backward rule, most time first.
    pub ops: Vec<OpTime>,
}

impl Profile {
    /// Whether nothing was profiled.
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }

    /// Time of all recordings.
    pub fn forward(&self) -> Duration {
        self.ops.iter().map(|o| o.forward).sum()
    }

    /// Time of all backward rules.
    pub fn backward(&self) -> Duration {
        self.ops.iter().map(|o| o.backward).sum()
    }

    /// Time inside matrix products.
    pub fn gemm(&self) -> Duration {
        self.ops.iter().map(|o| o.gemm).sum()
    }

    /// `forward() + backward()`: the time the profile covers.
    pub fn total(&self) -> Duration {
        self.forward() + self.backward()
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl fmt::Display for Profile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total = self.total().as_secs_f64();
        let share = |d: Duration| if total > 0.0 { 100.0 * d.as_secs_f64() / total } else { 0.0 };
        writeln!(
            f,
            "{:<18} {:>9} {:>11} {:>9} {:>11} {:>9} {:>6}",
            "op", "calls", "forward ms", "bwd calls", "backward ms", "GEMM ms", "share"
        )?;
        for o in &self.ops {
            writeln!(
                f,
                "{:<18} {:>9} {:>11.3} {:>9} {:>11.3} {:>9.3} {:>5.1}%",
                o.op,
                o.calls,
                ms(o.forward),
                o.backward_calls,
                ms(o.backward),
                ms(o.gemm),
                share(o.total())
            )?;
        }
        let (calls, backward_calls) = self.ops.iter().fold((0, 0), |(c, b), o| (c + o.calls, b + o.backward_calls));
        write!(
            f,
            "{:<18} {:>9} {:>11.3} {:>9} {:>11.3} {:>9.3} {:>5.1}%",
            "total",
            calls,
            ms(self.forward()),
            backward_calls,
            ms(self.backward()),
            ms(self.gemm()),
            if total > 0.0 { 100.0 } else { 0.0 }
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::unary_fn::UnaryFn;

    #[test]
    fn nested_time_is_charged_once() {
        let p = Profiler::default();
        let outer = p.start();
        let inner = p.start();
        p.product(|| std::thread::sleep(Duration::from_millis(2)));
        p.stop(OpKind::Unary(UnaryFn::Tanh), false, inner);
        std::thread::sleep(Duration::from_millis(1));
        p.stop(OpKind::Checkpoint, true, outer);
        let report = p.report();
        let tanh = report.ops.iter().find(|o| o.op == "tanh").unwrap();
        let block = report.ops.iter().find(|o| o.op == "checkpoint").unwrap();
        assert_eq!((tanh.calls, tanh.backward_calls, block.calls, block.backward_calls), (1, 0, 0, 1));
        assert!(tanh.forward >= Duration::from_millis(2) && tanh.gemm >= Duration::from_millis(2));
        assert!(block.backward >= Duration::from_millis(1) && block.gemm == Duration::ZERO);
        assert_eq!(report.total(), p.charged());
        // Which op took longer depends on the machine's load; the order must follow the times.
        assert!(report.ops.windows(2).all(|w| w[0].total() >= w[1].total()), "most time first");
    }
}
