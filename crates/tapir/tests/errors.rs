//! The bad-input catalogue: one test per documented [`Error`] variant. Each makes the
//! mistake a user would, then checks the variant, and that the message names the op,
//! every shape involved, and the caller's file and line, so that a failure deep in a
//! model points at the line that caused it.

use std::panic::Location;

use tapir::{Error, Graph, ParamStore, Tensor};

/// Checks that `msg` starts with `op`, names every shape in `shapes`, and points at this
/// file (the caller's location), when `located`.
#[track_caller]
fn assert_names(e: &Error, op: &str, shapes: &[&str], located: bool) {
    let msg = e.to_string();
    assert_eq!(e.op(), op, "{msg}");
    assert!(msg.starts_with(&format!("{op}: ")), "message should start with the op: {msg}");
    for shape in shapes {
        assert!(msg.contains(shape), "message should name {shape}: {msg}");
    }
    if located {
        let at = e.location().expect("a located error");
        assert_eq!(at.file(), file!(), "{msg}");
        assert!(msg.contains(&format!("{}:{}", file!(), at.line())), "message should name the caller: {msg}");
    }
}

fn t(dims: &[usize]) -> Tensor<f64> {
    let n = dims.iter().product::<usize>();
    Tensor::from_vec((0..n).map(|i| i as f64 * 0.5 - 1.0).collect(), dims).expect("valid dims")
}

/// The scope's first error after `$body` records some ops on the scope `$s`.
macro_rules! scope_error {
    (|$s:ident| $body:expr) => {{
        let mut g = Graph::<f64>::new();
        g.scope(|$s| {
            let _ = $body;
            $s.check().expect_err("the op should have failed")
        })
    }};
}

#[test]
fn shape_mismatch() {
    let (a, b) = (t(&[2, 3]), t(&[3]));
    let e = scope_error!(|s| s.leaf(&a).bce_with_logits(s.input(&b)));
    assert!(matches!(e, Error::ShapeMismatch { .. }), "{e:?}");
    assert_names(&e, "bce_with_logits", &["[2, 3]", "[3]"], true);
}

#[test]
fn broadcast() {
    let (a, b) = (t(&[2, 3]), t(&[4]));
    let e = scope_error!(|s| s.leaf(&a) + s.leaf(&b));
    assert!(matches!(e, Error::Broadcast { .. }), "{e:?}");
    assert_names(&e, "add", &["[2, 3]", "[4]"], true);
}

#[test]
fn matmul_shape() {
    let a = t(&[2, 3]);
    let e = scope_error!(|s| s.leaf(&a).matmul(s.leaf(&a)));
    assert!(matches!(e, Error::MatMulShape { .. }), "{e:?}");
    assert_names(&e, "matmul", &["[2, 3] × [2, 3]"], true);
}

#[test]
fn linear_shapes() {
    let (x, w, b) = (t(&[4, 3]), t(&[3, 2]), t(&[2]));
    for (xs, ws, bs, names) in [
        (&x, &w, &t(&[3]), ["[4, 3]", "[3, 2]", "[3]"]),
        (&x, &t(&[2, 2]), &b, ["[4, 3]", "[2, 2]", "[2]"]),
        (&t(&[3]), &w, &b, ["[3]", "[3, 2]", "[2]"]),
        (&x, &t(&[1, 3, 2]), &b, ["[4, 3]", "[1, 3, 2]", "[2]"]),
    ] {
        let e = scope_error!(|s| s.leaf(xs).linear(s.leaf(ws), s.leaf(bs)));
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert_names(&e, "linear", &names, true);
    }
}

#[test]
fn layer_norm_shapes_and_eps() {
    let (x, w) = (t(&[4, 3]), t(&[3]));
    for (xs, ws, bs, eps, names) in [
        (&x, &w, &t(&[2]), 1e-5, ["[4, 3]", "[3]", "[2]", "eps 0.00001"]),
        (&x, &t(&[1, 3]), &w, 1e-5, ["[4, 3]", "[1, 3]", "[3]", "eps 0.00001"]),
        (&t(&[]), &t(&[1]), &t(&[1]), 1e-5, ["[]", "[1]", "[1]", "eps 0.00001"]),
        (&x, &w, &w, -1.0, ["[4, 3]", "[3]", "[3]", "eps -1"]),
        (&x, &w, &w, f64::NAN, ["[4, 3]", "[3]", "[3]", "eps NaN"]),
    ] {
        let e = scope_error!(|s| s.leaf(xs).layer_norm(s.leaf(ws), s.leaf(bs), eps));
        assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
        assert_names(&e, "layer_norm", &names, true);
    }
}

#[test]
fn bad_axis() {
    let a = t(&[2, 3]);
    let e = scope_error!(|s| s.leaf(&a).softmax(5));
    assert!(matches!(e, Error::BadAxis { axis: 5, .. }), "{e:?}");
    assert_names(&e, "softmax", &["[2, 3]", "axis 5", "-2..2"], true);
}

#[test]
fn invalid_shape() {
    let a = t(&[2, 3]);
    let e = scope_error!(|s| s.leaf(&a).reshape(&[4]));
    assert!(matches!(e, Error::InvalidShape { .. }), "{e:?}");
    assert_names(&e, "reshape", &["[2, 3]", "[4]"], true);
}

#[test]
fn invalid_shape_instead_of_overflow() {
    // Regression (found by the tape_program fuzz target's generator): im2col computed
    // `oh · ow` with a plain multiplication, which overflowed (a panic in debug builds)
    // for paddings near 2^31; now the output shape is rejected.
    let a = t(&[1, 1, 1, 1]);
    let e = scope_error!(|s| s.leaf(&a).im2col([1, 1], [1, 1], [1 << 31, 1 << 31]));
    assert!(matches!(e, Error::InvalidShape { .. }), "{e:?}");
    assert_names(&e, "im2col", &["[1, 1, 1, 1]", "overflow"], true);
}

#[test]
fn shape_list() {
    let (a, b) = (t(&[2, 3]), t(&[3, 3]));
    let e = scope_error!(|s| s.concat(&[s.leaf(&a), s.leaf(&b)], 1));
    assert!(matches!(e, Error::ShapeList { axis: 1, .. }), "{e:?}");
    assert_names(&e, "concat", &["[2, 3], [3, 3]"], true);
}

#[test]
fn index_out_of_range() {
    let a = t(&[2, 3]);
    let e = scope_error!(|s| s.leaf(&a).index_select(0, &[1, 7]));
    assert!(matches!(e, Error::IndexOutOfRange { index: 7, len: 2, .. }), "{e:?}");
    assert_names(&e, "index_select", &["[2, 3]", "index 7"], true);
    // Class labels are indices too.
    let e = scope_error!(|s| s.leaf(&a).cross_entropy(&[0, 3]));
    assert!(matches!(e, Error::IndexOutOfRange { index: 3, len: 3, .. }), "{e:?}");
    assert_names(&e, "cross_entropy", &["[2, 3]"], true);
}

#[test]
fn data_length() {
    let e = Tensor::<f32>::from_vec(vec![1.0; 5], &[2, 3]).unwrap_err();
    assert!(matches!(e, Error::DataLength { len: 5, .. }), "{e:?}");
    assert_names(&e, "from_vec", &["[2, 3]", "5 elements"], true);
    let e = scope_error!(|s| s.tensor(&[1.0, 2.0], &[3]));
    assert!(matches!(e, Error::DataLength { len: 2, .. }), "{e:?}");
    assert_names(&e, "tensor", &["[3]"], true);
}

#[test]
fn not_scalar() {
    let a = t(&[2, 3]);
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| s.backward(s.leaf(&a).exp()).unwrap_err());
    assert!(matches!(e, Error::NotScalar { .. }), "{e:?}");
    assert_names(&e, "backward", &["[2, 3]"], true);
}

#[test]
fn backward_twice() {
    let a = t(&[2, 3]);
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let loss = s.leaf(&a).square().sum();
        s.backward(loss).expect("the first pass succeeds");
        s.backward(loss).unwrap_err()
    });
    assert!(matches!(e, Error::BackwardTwice { .. }), "{e:?}");
    assert_names(&e, "backward", &["backward_retain"], true);
}

#[test]
fn arena_limit() {
    let mut g = Graph::<f64>::new();
    g.set_arena_limit(Some(64));
    let e = g.scope(|s| {
        let _ = s.full(&[100], 1.0);
        s.check().unwrap_err()
    });
    assert!(matches!(e, Error::ArenaLimit { requested: 800, limit: 64, .. }), "{e:?}");
    assert_names(&e, "full", &["800 bytes", "limit 64"], true);
}

#[test]
fn out_of_memory() {
    // 2^40 f64s: 8 TiB, a valid shape that no allocator on a test machine grants.
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let _ = s.full(&[1 << 20, 1 << 20], 1.0);
        s.check().unwrap_err()
    });
    assert!(matches!(e, Error::OutOfMemory { .. }), "{e:?}");
    assert_names(&e, "full", &["8796093022208 bytes"], true);
}

#[test]
fn tape_full() {
    // Reaching it takes 2^32 nodes (256 GiB of tape), so only the message is checked.
    let e = Error::TapeFull { op: "add", len: u32::MAX as usize, location: Location::caller() };
    assert_names(&e, "add", &["4294967295 nodes"], true);
}

#[test]
fn non_finite() {
    let a = t(&[2, 3]);
    let mut g = Graph::<f64>::new();
    g.set_anomaly_detection(true);
    let e = g.scope(|s| {
        let _ = s.leaf(&a).log(); // ln of the negative elements is NaN
        s.check().unwrap_err()
    });
    assert!(matches!(e, Error::NonFinite { phase: "forward", .. }), "{e:?}");
    assert_names(&e, "log", &["[2, 3]", "forward"], true);
}

#[test]
fn invalid_argument() {
    let a = t(&[2, 3]);
    let e = scope_error!(|s| s.leaf(&a).clamp(1.0, 0.0));
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_names(&e, "clamp", &["[2, 3]", "lo <= hi"], true);
    let e = scope_error!(|s| s.concat(&[], 0));
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_names(&e, "concat", &["empty list"], true);
}

#[test]
fn unknown_param() {
    let mut store = ParamStore::<f64>::new();
    let w = store.add("w", t(&[2])).expect("a new name");
    let mut other = ParamStore::<f64>::new();
    other.add("v", t(&[3])).expect("a new name");
    let mut grads = other.zeros_like().unwrap();
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let loss = s.param(&store, w).square().sum();
        s.backward_into(loss, &mut grads).unwrap_err()
    });
    // The buffer was made for `other`, the parameter is `store`'s.
    assert!(matches!(e, Error::WrongStore { .. }), "{e:?}");
    assert_names(&e, "backward_into", &["gradient buffer", "store #"], true);
}

#[test]
fn io() {
    // Io errors come from checkpoint files, not call sites: no location.
    let e = Error::Io { op: "load", detail: "tensor \"w\" has shape [2] in the file, [3] in the model".into() };
    assert!(e.location().is_none());
    assert_names(&e, "load", &["[2]", "[3]"], false);
}

#[test]
fn adjoint_ops_reject_bad_input() {
    let a = t(&[2, 3]);
    // scatter_add: one index per row of the axis, each below the target length.
    let e = scope_error!(|s| s.leaf(&a).scatter_add(0, &[0, 4], 3));
    assert!(matches!(e, Error::IndexOutOfRange { index: 4, len: 3, .. }), "{e:?}");
    assert_names(&e, "scatter_add", &["[3, 3]", "index 4"], true);
    let e = scope_error!(|s| s.leaf(&a).scatter_add(0, &[0], 3));
    assert!(matches!(e, Error::InvalidShape { .. }), "{e:?}");
    assert_names(&e, "scatter_add", &["[2, 3]"], true);
    let e = scope_error!(|s| s.leaf(&a).pad_axis(2, 1, 1));
    assert!(matches!(e, Error::BadAxis { axis: 2, .. }), "{e:?}");
    assert_names(&e, "pad_axis", &["[2, 3]"], true);
    let e = scope_error!(|s| s.leaf(&a).pad_axis(0, usize::MAX, 1));
    assert!(matches!(e, Error::InvalidArgument { .. }), "{e:?}");
    assert_names(&e, "pad_axis", &["[2, 3]"], true);
    // col2im: columns [N, C·kh·kw, L] whose L matches the image's window count.
    let cols = t(&[1, 4, 5]);
    let e = scope_error!(|s| s.leaf(&cols).col2im([3, 3], [2, 2], [1, 1], [0, 0]));
    assert!(matches!(e, Error::InvalidShape { .. }), "{e:?}");
    assert_names(&e, "col2im", &["[1, 4, 5]", "[1, 1, 3, 3]"], true);
    let e = scope_error!(|s| s.leaf(&a).col2im([3, 3], [2, 2], [1, 1], [0, 0]));
    assert!(matches!(e, Error::InvalidShape { .. }), "{e:?}");
    assert_names(&e, "col2im", &["[2, 3]"], true);
}

#[test]
fn squeeze_of_a_dimension_that_is_not_1() {
    // Regression: a size-3 axis was reported as out of range; it is in range, just not 1.
    let a = t(&[2, 3]);
    let mut g = Graph::<f64>::new();
    let (e, line) = g.scope(|s| {
        let line = line!() + 1;
        let _ = s.leaf(&a).squeeze(-1);
        (s.check().unwrap_err(), line)
    });
    assert!(matches!(&e, Error::InvalidShape { op: "squeeze", detail, .. } if detail.contains("size 3")), "{e:?}");
    let at = e.location().expect("a located error");
    assert_eq!((at.file(), at.line()), (file!(), line));
    assert_eq!(
        e.to_string(),
        format!(
            "squeeze: axis -1 (dimension 1) has size 3, not 1; only a dimension of size 1 can be squeezed \
             (input shape [2, 3]) (at {at})"
        )
    );
    // An axis out of range is still one.
    let e = scope_error!(|s| s.leaf(&a).squeeze(2));
    assert!(matches!(e, Error::BadAxis { op: "squeeze", axis: 2, .. }), "{e:?}");
    assert_names(&e, "squeeze", &["axis 2 is out of range for shape [2, 3] (valid: -2..2)"], true);
}

/// Set in the child process of [`jacobian_too_large_for_memory`].
const JACOBIAN_CHILD: &str = "TAPIR_TEST_JACOBIAN_OOM_CHILD";

/// The Jacobian of the identity on `2^17` `f32`s is a `2^17 × 2^17` matrix, 64 GiB. It
/// used to be allocated infallibly, which aborts the process; now it is refused with
/// [`Error::TensorOutOfMemory`]. The allocation runs in a child process (this test's own
/// binary, `--exact` this test) under `ulimit -v` of about 4 GB, so that the refusal does
/// not depend on the machine's memory or overcommit policy. AddressSanitizer reserves
/// terabytes of shadow memory, so under it the child runs without `ulimit` and with
/// ASan's own cap on one allocation (4000 MB, returning null) instead.
#[test]
fn jacobian_too_large_for_memory() {
    let name = "errors::jacobian_too_large_for_memory";
    if std::env::var_os(JACOBIAN_CHILD).is_some() {
        let x = Tensor::<f32>::zeros(&[1 << 17]).unwrap();
        let mut g = Graph::<f32>::new();
        let line = line!() + 1;
        let e = tapir::func::jacobian(&mut g, &x, |_, x| x).unwrap_err();
        let requested = (1usize << 34) * 4;
        assert!(matches!(e, Error::TensorOutOfMemory { op: "jacobian", requested: r, .. } if r == requested), "{e:?}");
        let at = e.location().expect("a located error");
        assert_eq!((at.file(), at.line()), (file!(), line));
        println!("child: {e}");
        return;
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    let args = ["--exact", name, "--nocapture", "--test-threads", "1"];
    let mut cmd = if let Some(asan) = std::env::var_os("ASAN_OPTIONS") {
        let mut c = std::process::Command::new(&exe);
        let mut options = asan;
        options.push(":allocator_may_return_null=1:max_allocation_size_mb=4000");
        c.env("ASAN_OPTIONS", options);
        c
    } else {
        let mut c = std::process::Command::new("bash");
        c.args(["-c", r#"ulimit -v 4000000; exec "$0" "$@""#]).arg(&exe);
        c
    };
    let out = cmd.args(args).env(JACOBIAN_CHILD, "1").output().expect("run the child");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed ({}):\n{text}", out.status);
    let expected = format!(
        "child: jacobian: out of memory allocating 68719476736 bytes for a tensor of shape [131072, 131072] (at {}:",
        file!()
    );
    assert!(text.contains(&expected), "expected {expected:?} in:\n{text}");
    assert!(text.contains("1 passed"), "the child ran exactly this test:\n{text}");
}
