//! User code the engine calls outside custom ops: a checkpointed block and the random
//! number generator of `Scope::randn`. A panic in either is `Error::Callback`, naming the
//! code and the caller's line, and the graph stays usable; a generator may record on the
//! scope that draws from it.

use std::cell::Cell;
use std::convert::Infallible;

use tapir::{Checkpoint, Error, Graph, Scope, Tensor, Var};

/// `x²`, panicking on its `panic_on`-th call (counting from 1).
struct Flaky {
    calls: Cell<u32>,
    panic_on: u32,
}

impl Checkpoint<f64> for Flaky {
    fn forward<'c, 'e>(&'e self, _: &'c Scope<'c, 'e, f64>, x: &[Var<'c, f64>], _: u32) -> Var<'c, f64> {
        self.calls.set(self.calls.get() + 1);
        assert_ne!(self.calls.get(), self.panic_on, "the block fails on call {}", self.panic_on);
        x[0].square()
    }
}

fn assert_block_error(e: &Error, line: u32, call: u32) {
    let Error::Callback { op, callback, detail, location } = e else { panic!("expected Error::Callback, got {e:?}") };
    assert_eq!(*op, "checkpoint", "{e}");
    assert_eq!(callback, "the checkpointed block (part 0)", "{e}");
    assert!(detail.contains(&format!("the block fails on call {call}")), "{e}");
    assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
    assert!(e.to_string().starts_with("checkpoint: the checkpointed block (part 0) panicked"), "{e}");
}

#[test]
fn a_block_that_panics_in_its_forward_is_the_scopes_error() {
    let x = Tensor::from_vec(vec![1.0, -2.0], &[2]).unwrap();
    let block = Flaky { calls: Cell::new(0), panic_on: 1 };
    let mut g = Graph::<f64>::new();
    let (e, line) = g.scope(|s| {
        let (y, line) = (s.checkpoint(&block, &[s.leaf(&x)]), line!());
        (y.sum().value().unwrap_err(), line)
    });
    assert_block_error(&e, line, 1);
    // The graph and the block are usable again: `∂Σx²/∂x = 2x`.
    let dx = g.scope(|s| {
        let x = s.leaf(&x);
        s.backward(s.checkpoint(&block, &[x]).sum()).unwrap();
        x.grad().unwrap().to_vec()
    });
    assert_eq!(dx, [2.0, -4.0]);
}

#[test]
fn a_block_that_panics_when_recomputed_is_an_error_of_backward_and_of_grad() {
    let x = Tensor::from_vec(vec![1.0, -2.0], &[2]).unwrap();
    let mut g = Graph::<f64>::new();
    for second_order in [false, true] {
        let block = Flaky { calls: Cell::new(0), panic_on: 2 };
        let (e, line) = g.scope(|s| {
            let xv = s.leaf(&x);
            let (y, line) = (s.checkpoint(&block, &[xv]), line!());
            let e = if second_order { s.grad(y.sum(), [xv]).unwrap_err() } else { s.backward(y.sum()).unwrap_err() };
            (e, line)
        });
        assert_block_error(&e, line, 2);
    }
}

/// A generator that records a node on the scope for every word it draws.
struct Recording<'s, 'g> {
    scope: &'s Scope<'s, 'g, f64>,
    state: u64,
}

impl rand::TryRng for Recording<'_, '_> {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        self.try_next_u64().map(|v| v as u32)
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        let _ = self.scope.scalar(1.0); // records on the scope that is drawing
        self.state = self.state.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        Ok(self.state)
    }
    fn try_fill_bytes(&mut self, dst: &mut [u8]) -> Result<(), Infallible> {
        for b in dst {
            *b = self.try_next_u64()? as u8;
        }
        Ok(())
    }
}

/// A generator that panics.
struct Broken;

impl rand::TryRng for Broken {
    type Error = Infallible;
    fn try_next_u32(&mut self) -> Result<u32, Infallible> {
        panic!("the entropy source is gone")
    }
    fn try_next_u64(&mut self) -> Result<u64, Infallible> {
        panic!("the entropy source is gone")
    }
    fn try_fill_bytes(&mut self, _: &mut [u8]) -> Result<(), Infallible> {
        panic!("the entropy source is gone")
    }
}

#[test]
fn a_generator_may_record_on_the_scope_that_draws_from_it() {
    let mut g = Graph::<f64>::new();
    let (nodes, value) = g.scope(|s| {
        let mut rng = Recording { scope: s, state: 7 };
        let z = s.randn(&[3], &mut rng);
        (s.stats().nodes, z.value().unwrap().to_vec())
    });
    // Each normal draw takes at least one word, and each word recorded a scalar first.
    assert!(nodes >= 4, "{nodes} nodes");
    assert_eq!(value.len(), 3);
    assert!(value.iter().all(|v| v.is_finite()), "{value:?}");
}

#[test]
fn a_generator_that_panics_is_the_scopes_error() {
    let mut g = Graph::<f64>::new();
    let (e, line) = g.scope(|s| {
        let (z, line) = (s.randn(&[2, 2], &mut Broken), line!());
        (z.sum().value().unwrap_err(), line)
    });
    let Error::Callback { op, callback, detail, location } = &e else { panic!("expected Error::Callback, got {e:?}") };
    assert_eq!((*op, callback.as_str()), ("randn", "the random number generator"), "{e}");
    assert!(detail.contains("the entropy source is gone"), "{e}");
    assert_eq!((location.file(), location.line()), (file!(), line), "{e}");
    // The next scope draws normally.
    let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
    let n = g.scope(|s| s.randn(&[5], &mut rng).value().map(<[f64]>::len));
    assert_eq!(n.unwrap(), 5);
}
