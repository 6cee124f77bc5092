//! The NaN table of `docs/robustness.md`, row by row: NaN in, NaN out (as PyTorch), and
//! where the gradient of a NaN goes.

use tapir::{Graph, Scope, Tensor, Var};

type Case = for<'s, 'g> fn(&'s Scope<'s, 'g, f64>, Var<'s, f64>) -> Var<'s, f64>;

/// The values of `f(x)` and `∂Σf/∂x` for `x = [NaN, 0.5, -0.5, 2]` (shape `[1, 1, 2, 2]`).
fn run(f: Case) -> (Vec<f64>, Vec<f64>) {
    let x = Tensor::from_vec(vec![f64::NAN, 0.5, -0.5, 2.0], &[1, 1, 2, 2]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let v = s.leaf(&x);
        let y = f(s, v);
        let value = y.value().unwrap().to_vec();
        s.backward(y.sum()).unwrap();
        (value, v.grad().unwrap().to_vec())
    })
}

/// `a` and `b` agree, NaN matching NaN.
fn same(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y || (x.is_nan() && y.is_nan()))
}

const N: f64 = f64::NAN;

#[test]
fn nan_table() {
    // (row of the table, op, value, gradient)
    let rows: Vec<(&str, Case, Vec<f64>, Vec<f64>)> = vec![
        // relu: value NaN; the gradient of a NaN passes dout (PyTorch's threshold_backward).
        ("relu", |_, x| x.relu(), vec![N, 0.5, 0.0, 2.0], vec![1.0, 1.0, 0.0, 1.0]),
        // clamp: value NaN; a NaN is not inside [lo, hi], so its gradient is 0.
        ("clamp", |_, x| x.clamp(-1.0, 1.0), vec![N, 0.5, -0.5, 1.0], vec![0.0, 1.0, 1.0, 0.0]),
        // leaky_relu: NaN·slope is NaN; a NaN is not > 0, so its gradient is the slope.
        ("leaky_relu", |_, x| x.leaky_relu(0.1), vec![N, 0.5, -0.05, 2.0], vec![0.1, 1.0, 0.1, 1.0]),
        // abs: value NaN, gradient sign(NaN) = NaN.
        ("abs", |_, x| x.abs(), vec![N, 0.5, 0.5, 2.0], vec![N, 1.0, -1.0, 1.0]),
        // maximum with 0, either order: NaN wins, and a NaN input takes the whole dout.
        ("maximum(x, 0)", |s, x| x.maximum(s.zeros(&[1])), vec![N, 0.5, 0.0, 2.0], vec![1.0, 1.0, 0.0, 1.0]),
        ("maximum(0, x)", |s, x| s.zeros(&[1]).maximum(x), vec![N, 0.5, 0.0, 2.0], vec![1.0, 1.0, 0.0, 1.0]),
        ("minimum(x, 0)", |s, x| x.minimum(s.zeros(&[1])), vec![N, 0.0, -0.5, 0.0], vec![1.0, 0.0, 1.0, 0.0]),
        ("minimum(0, x)", |s, x| s.zeros(&[1]).minimum(x), vec![N, 0.0, -0.5, 0.0], vec![1.0, 0.0, 1.0, 0.0]),
        // max/min over an axis: a NaN is the maximum and the minimum, and takes the gradient.
        ("max_axes", |_, x| x.max_axes(&[-1], false), vec![N, 2.0], vec![1.0, 0.0, 0.0, 1.0]),
        ("min_axes", |_, x| x.min_axes(&[-1], false), vec![N, -0.5], vec![1.0, 0.0, 1.0, 0.0]),
        ("max", |_, x| x.max(), vec![N], vec![1.0, 0.0, 0.0, 0.0]),
        // max_pool2d: the NaN in the window wins and takes the gradient.
        ("max_pool2d", |_, x| x.max_pool2d([2, 2], [2, 2], [0, 0]), vec![N], vec![1.0, 0.0, 0.0, 0.0]),
        // sum: NaN flows through; the other elements' gradients are untouched.
        ("sum", |_, x| x.sum(), vec![N], vec![1.0, 1.0, 1.0, 1.0]),
    ];
    for (row, f, value, grad) in rows {
        let (v, g) = run(f);
        assert!(same(&v, &value), "{row}: value {v:?}, table says {value:?}");
        assert!(same(&g, &grad), "{row}: gradient {g:?}, table says {grad:?}");
    }
}

#[test]
fn smooth_functions_map_nan_to_nan() {
    let x = Tensor::from_vec(vec![f64::NAN], &[1]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let v = s.input(&x);
        for (name, y) in [
            ("exp", v.exp()),
            ("log1p", v.log1p()),
            ("tanh", v.tanh()),
            ("sigmoid", v.sigmoid()),
            ("softplus", v.softplus()),
            ("gelu", v.gelu()),
            ("silu", v.silu()),
            ("erf", v.erf()),
            ("softmax", v.softmax(0)),
            ("logsumexp", v.logsumexp(0, false)),
        ] {
            assert!(y.value().unwrap()[0].is_nan(), "{name}(NaN) must be NaN");
        }
    });
}

/// A gradient check never passes on a NaN: a loss that is NaN or infinite at the inputs
/// is `GradcheckError::NonFinite` (docs/design.md, "NaN policy").
#[test]
fn gradcheck_refuses_a_non_finite_loss() {
    use tapir::testing::{gradcheck, gradgradcheck, GradcheckError, GradcheckOptions};
    let x = Tensor::from_vec(vec![-1.0, 2.0], &[2]).unwrap();
    let opts = GradcheckOptions::default();
    // log(−1) is NaN, and 1/0 is infinite.
    let e = gradcheck(std::slice::from_ref(&x), opts, |_, v| v[0].log()).unwrap_err();
    assert!(matches!(e, GradcheckError::NonFinite), "{e}");
    let e = gradgradcheck(std::slice::from_ref(&x), opts, |_, v| v[0].log()).unwrap_err();
    assert!(matches!(e, GradcheckError::NonFinite), "{e}");
    let zero = Tensor::from_vec(vec![0.0, 2.0], &[2]).unwrap();
    let e = gradcheck(&[zero], opts, |_, v| v[0].recip()).unwrap_err();
    assert!(matches!(e, GradcheckError::NonFinite), "{e}");
}
