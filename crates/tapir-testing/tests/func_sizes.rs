//! Issue 31, class 6, as a generator: `tapir::func::jacobian` and `hessian` over input and
//! output sizes from tiny to far beyond memory. Every case must end in the result the
//! docs of `tapir::func` promise, worked out here without the library:
//!
//! - joined rank (`f`'s rank plus `x`'s, or `x`'s twice) above 6: `InvalidShape`;
//! - a zero dimension anywhere (next to dimensions up to `2^32 − 1`): an empty result of
//!   the joined shape;
//! - a result of more bytes than the child's address space (`ulimit -v`, 2 GB):
//!   `TensorOutOfMemory` naming the transform, with the exact byte count;
//! - small results: every element equal to the closed form (exact, on dyadic inputs).
//!
//! Sizes between "small" and "beyond the limit" are skipped: they would really be
//! computed, one vector-Jacobian product per output element. Each case runs in a child
//! process (this binary, `--exact` [`child`]) under `ulimit -v`, so that a refused
//! allocation is refused whatever the machine's memory and overcommit policy, and so that
//! an abort (`memory allocation of … failed`, what an infallible allocation does) fails
//! the case instead of the test binary. A product of sizes past `isize::MAX` bytes cannot
//! be reached with inputs that fit in memory (a `Shape` caps its elements at
//! `isize::MAX / 8`); `tapir`'s unit test `a_byte_count_past_isize_max_is_refused_without_allocating`
//! covers that guard.

use proptest::prelude::*;
use tapir::{Error, Float, Graph, Tensor};

/// The child's environment variable: the case to run.
const CASE: &str = "TAPIR_TEST_FUNC_SIZES_CASE";

/// The child's address-space limit, in KiB (`ulimit -v`).
const LIMIT_KIB: usize = 2_000_000;

/// Results from this many bytes must be refused under the limit.
const REFUSED: usize = 1 << 31;

/// Results up to this many bytes, and up to [`MAX_PRODUCTS`] vector-Jacobian products,
/// are computed and compared with the closed form.
const SMALL: usize = 1 << 26;
const MAX_PRODUCTS: usize = 256;

/// The element count of `dims` (0 if a dimension is, however large the others).
fn numel(dims: &[usize]) -> usize {
    if dims.contains(&0) {
        0
    } else {
        dims.iter().product()
    }
}

/// The function differentiated.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Func {
    /// Jacobian of `y = x`: `δᵢⱼ`.
    Identity,
    /// Jacobian of `y = 3x`: `3δᵢⱼ`.
    Triple,
    /// Jacobian of `y = x²`: `2xⱼδᵢⱼ`.
    Square,
    /// Jacobian of `y = Σx` (shape `[]`): all ones.
    Sum,
    /// Jacobian of `y = x` broadcast to `[k, …x]`: `δᵢⱼ` for each of the `k` copies.
    Broadcast(usize),
    /// Hessian of `Σx²`: `2δᵢⱼ`.
    SumSquares,
    /// Hessian of `(Σx)²`: all twos.
    SquareOfSum,
    /// Hessian of `Σx³`: `6xⱼδᵢⱼ`.
    SumCubes,
}

impl Func {
    /// The variant's name without its argument.
    fn name(self) -> String {
        format!("{self:?}").chars().take_while(|c| c.is_alphabetic()).collect()
    }

    fn hessian(self) -> bool {
        matches!(self, Func::SumSquares | Func::SquareOfSum | Func::SumCubes)
    }

    /// `f`'s output dimensions for an input of `x`'s.
    fn out_dims(self, x: &[usize]) -> Vec<usize> {
        match self {
            Func::Identity | Func::Triple | Func::Square => x.to_vec(),
            Func::Broadcast(k) => std::iter::once(k).chain(x.iter().copied()).collect(),
            Func::Sum | Func::SumSquares | Func::SquareOfSum | Func::SumCubes => vec![],
        }
    }

    /// Element `(i, j)` of the Jacobian or Hessian, with `n` input elements and the input `x`.
    fn element(self, i: usize, j: usize, n: usize, x: &[f64]) -> f64 {
        let d = |i: usize, j: usize| if i == j { 1.0 } else { 0.0 };
        match self {
            Func::Identity | Func::SumSquares => d(i, j) * if self == Func::SumSquares { 2.0 } else { 1.0 },
            Func::Triple => 3.0 * d(i, j),
            Func::Square => 2.0 * x[j] * d(i, j),
            Func::Sum => 1.0,
            Func::Broadcast(_) => d(i % n, j),
            Func::SquareOfSum => 2.0,
            Func::SumCubes => 6.0 * x[j] * d(i, j),
        }
    }
}

/// One case: the function, the element type (`f64` if `double`) and `x`'s dimensions.
#[derive(Debug, Clone, PartialEq)]
struct Case {
    func: Func,
    double: bool,
    x: Vec<usize>,
}

/// What a case must end in.
#[derive(Debug, PartialEq)]
enum Expected {
    InvalidShape,
    Empty(Vec<usize>),
    OutOfMemory(usize),
    Values(Vec<usize>),
    /// Too large to compute, too small to be refused: not run.
    Skip,
}

impl Case {
    fn op(&self) -> &'static str {
        if self.func.hessian() {
            "hessian"
        } else {
            "jacobian"
        }
    }

    /// The result's dimensions: `f`'s then `x`'s, or `x`'s twice.
    fn joined(&self) -> Vec<usize> {
        let first = if self.func.hessian() { self.x.clone() } else { self.func.out_dims(&self.x) };
        first.into_iter().chain(self.x.iter().copied()).collect()
    }

    fn expected(&self) -> Expected {
        let joined = self.joined();
        if joined.len() > 6 {
            return Expected::InvalidShape;
        }
        if joined.contains(&0) {
            return Expected::Empty(joined);
        }
        let size = if self.double { 8 } else { 4 };
        let bytes = joined.iter().try_fold(size, |a: usize, &d| a.checked_mul(d));
        let products = numel(&if self.func.hessian() { self.x.clone() } else { self.func.out_dims(&self.x) });
        match bytes {
            None => Expected::InvalidShape,
            Some(b) if b >= REFUSED => Expected::OutOfMemory(b),
            Some(b) if b <= SMALL && products <= MAX_PRODUCTS => Expected::Values(joined),
            Some(_) => Expected::Skip,
        }
    }

    /// The case as one line for the child's environment, and back.
    fn encode(&self) -> String {
        let dims: Vec<String> = self.x.iter().map(usize::to_string).collect();
        let k = if let Func::Broadcast(k) = self.func { k } else { 0 };
        format!("{} {k} {} {}", self.func.name(), self.double, dims.join(","))
    }

    fn decode(s: &str) -> Case {
        let parts: Vec<&str> = s.split(' ').collect();
        let k: usize = parts[1].parse().expect("k");
        let func = [
            Func::Identity,
            Func::Triple,
            Func::Square,
            Func::Sum,
            Func::Broadcast(k),
            Func::SumSquares,
            Func::SquareOfSum,
            Func::SumCubes,
        ]
        .into_iter()
        .find(|f| f.name() == parts[0])
        .expect("a function name");
        let x = parts[3].split(',').filter(|d| !d.is_empty()).map(|d| d.parse().expect("a dimension")).collect();
        Case { func, double: parts[2] == "true", x }
    }
}

/// Runs the case in this process, in `T`, and checks it.
fn run_case<T: Float>(case: &Case) {
    let n = numel(&case.x);
    // Dyadic values in [-3/4, 3/4]: every product and sum below is exact.
    let xs: Vec<f64> = (0..n).map(|j| ((j % 7) as f64 - 3.0) / 4.0).collect();
    let x = Tensor::<T>::from_vec(xs.iter().map(|&v| T::from_f64(v)).collect(), &case.x).expect("x fits");
    let mut g = Graph::<T>::new();
    let got = match case.func {
        Func::Identity => tapir::func::jacobian(&mut g, &x, |_, x| x),
        Func::Triple => tapir::func::jacobian(&mut g, &x, |_, x| x.mul_scalar(T::from_f64(3.0))),
        Func::Square => tapir::func::jacobian(&mut g, &x, |_, x| x.square()),
        Func::Sum => tapir::func::jacobian(&mut g, &x, |_, x| x.sum()),
        Func::Broadcast(k) => {
            let dims = case.func.out_dims(&case.x);
            debug_assert_eq!(dims[0], k);
            tapir::func::jacobian(&mut g, &x, move |_, x| x.broadcast_to(&dims))
        }
        Func::SumSquares => tapir::func::hessian(&mut g, &x, |_, x| x.square().sum()),
        Func::SquareOfSum => tapir::func::hessian(&mut g, &x, |_, x| x.sum().square()),
        Func::SumCubes => tapir::func::hessian(&mut g, &x, |_, x| (x.square() * x).sum()),
    };
    let expected = case.expected();
    match (&expected, &got) {
        (Expected::InvalidShape, Err(Error::InvalidShape { op, .. })) => assert_eq!(*op, case.op()),
        (Expected::OutOfMemory(bytes), Err(Error::TensorOutOfMemory { op, shape, requested, .. })) => {
            assert_eq!((*op, *requested), (case.op(), *bytes), "{got:?}");
            assert_eq!(shape.to_vec(), case.joined());
        }
        (Expected::Empty(dims), Ok(t)) => assert_eq!((t.shape().to_vec(), t.data().len()), (dims.clone(), 0)),
        (Expected::Values(dims), Ok(t)) => {
            assert_eq!(&t.shape().to_vec(), dims);
            let cols = n;
            for (at, v) in t.data().iter().enumerate() {
                let want = case.func.element(at / cols, at % cols, n, &xs);
                assert!(v.to_f64() == want, "element ({}, {}): {v} against {want}", at / cols, at % cols);
            }
        }
        _ => panic!("{case:?}: expected {expected:?}, got {got:?}"),
    }
    println!("child: {case:?}: {expected:?}");
}

/// The child: runs the case in [`CASE`], if set (otherwise there is nothing to do).
#[test]
fn child() {
    if let Ok(line) = std::env::var(CASE) {
        let case = Case::decode(&line);
        if case.double {
            run_case::<f64>(&case);
        } else {
            run_case::<f32>(&case);
        }
    }
}

/// Runs `case` in a child process under the address-space limit (under AddressSanitizer,
/// whose shadow memory needs terabytes of address space, under its own cap on one
/// allocation instead, as `tapir`'s `errors::jacobian_too_large_for_memory` does).
fn in_child(case: &Case) -> Result<(), String> {
    let exe = std::env::current_exe().expect("the test binary's path");
    let mut cmd = if let Some(asan) = std::env::var_os("ASAN_OPTIONS") {
        let mut c = std::process::Command::new(&exe);
        let mut options = asan;
        options.push(format!(":allocator_may_return_null=1:max_allocation_size_mb={}", LIMIT_KIB / 1024));
        c.env("ASAN_OPTIONS", options);
        c
    } else {
        let mut c = std::process::Command::new("bash");
        c.args(["-c", &format!(r#"ulimit -v {LIMIT_KIB}; exec "$0" "$@""#)]).arg(&exe);
        c
    };
    let args = ["--exact", "func_sizes::child", "--nocapture", "--test-threads", "1"];
    let out = cmd.args(args).env(CASE, case.encode()).output().map_err(|e| format!("run the child: {e}"))?;
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() && text.contains("child: ") && text.contains("1 passed") {
        Ok(())
    } else {
        Err(format!("{case:?} (expected {:?}): child {}:\n{text}", case.expected(), out.status))
    }
}

fn funcs() -> impl Strategy<Value = Func> {
    prop_oneof![
        Just(Func::Identity),
        Just(Func::Triple),
        Just(Func::Square),
        Just(Func::Sum),
        (1usize..=3).prop_map(Func::Broadcast),
        Just(Func::SumSquares),
        Just(Func::SquareOfSum),
        Just(Func::SumCubes),
    ]
}

/// `x`'s dimensions: small; large (2^15 to 2^20 elements, whose square is beyond the
/// limit); a zero next to dimensions up to `2^32 − 1`; or rank 4 and 5.
fn dims() -> impl Strategy<Value = Vec<usize>> {
    let large = (15u32..=20, 1usize..=8, 0usize..3).prop_map(|(e, a, shape)| {
        let n = (1usize << e) + a - 1;
        match shape {
            0 => vec![n],
            1 => vec![a, n / a],
            _ => vec![a, 1, n / a],
        }
    });
    let huge = prop::sample::select(vec![1usize, 3, 1 << 20, 1 << 31, u32::MAX as usize]);
    let zero = (prop::collection::vec(huge, 1..=3), any::<prop::sample::Index>()).prop_map(|(mut d, at)| {
        d.insert(at.index(d.len() + 1), 0);
        d
    });
    prop_oneof![
        1 => prop::collection::vec(1usize..=4, 0..=3),
        2 => large,
        1 => zero,
        1 => prop::collection::vec(1usize..=2, 4..=5),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn jacobian_and_hessian_sizes_end_in_a_result_or_a_typed_error(func in funcs(), double: bool, x in dims()) {
        let case = Case { func, double, x };
        prop_assume!(case.expected() != Expected::Skip);
        prop_assert_eq!(&Case::decode(&case.encode()), &case);
        if let Err(e) = in_child(&case) {
            prop_assert!(false, "{}", e);
        }
    }
}

/// The generator reaches every outcome, and the closed forms are the documented examples.
#[test]
fn every_outcome_is_reachable_and_the_closed_forms_hold() {
    let case = |func, x: &[usize]| Case { func, double: true, x: x.to_vec() };
    assert_eq!(case(Func::Identity, &[2, 2, 2, 2]).expected(), Expected::InvalidShape);
    assert_eq!(case(Func::Sum, &[0, 1 << 31]).expected(), Expected::Empty(vec![0, 1 << 31]));
    assert_eq!(case(Func::Identity, &[1 << 15]).expected(), Expected::OutOfMemory(1 << 33));
    assert_eq!(case(Func::Sum, &[1 << 20]).expected(), Expected::Values(vec![1 << 20]));
    assert_eq!(case(Func::Identity, &[1 << 12]).expected(), Expected::Skip);
    // The closed forms, as the functions' derivatives by hand: J(x²) = diag(2x) at
    // x = [-3/4, -1/2]; H((Σx)²) = 2; H(Σx³) = diag(6x).
    let xs = [-0.75, -0.5];
    assert_eq!(Func::Square.element(1, 1, 2, &xs), -1.0);
    assert_eq!(Func::Square.element(0, 1, 2, &xs), 0.0);
    assert_eq!(Func::SquareOfSum.element(0, 1, 2, &xs), 2.0);
    assert_eq!(Func::SumCubes.element(0, 0, 2, &xs), -4.5);
    assert_eq!(Func::Broadcast(2).element(3, 1, 2, &xs), 1.0);
    run_case::<f64>(&case(Func::SumCubes, &[2, 3]));
    run_case::<f32>(&Case { func: Func::Broadcast(2), double: false, x: vec![3, 1] });
}
