//! One small hand-worked case per op: values and gradients from closed forms worked out in
//! the comments, independent of the engine and of finite differences.

use tapir::{Graph, Scope, Tensor, Var};

const EPS: f64 = 1e-12;

/// An op under test, applied to one handle.
type UnaryCase = for<'s> fn(Var<'s, f64>) -> Var<'s, f64>;

/// Runs `f` on leaves made from `inputs`, backpropagates `L = Σ out`, and returns the
/// output's values and each input's gradient.
fn run<F>(inputs: &[(&[f64], &[usize])], f: F) -> (Vec<f64>, Vec<Vec<f64>>)
where
    F: for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &[Var<'s, f64>]) -> Var<'s, f64>,
{
    let tensors: Vec<Tensor<f64>> = inputs.iter().map(|(d, s)| Tensor::from_slice(d, s).unwrap()).collect();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let vars: Vec<_> = tensors.iter().map(|t| s.leaf(t)).collect();
        let out = f(s, &vars);
        let value = out.value().unwrap().to_vec();
        // A result no gradient-requesting leaf reaches (a comparison mask) has none to give.
        let loss = out.sum();
        if loss.requires_grad() {
            s.backward(loss).unwrap();
        } else {
            assert!(matches!(s.backward(loss), Err(tapir::Error::NoGradient { .. })));
        }
        let grads =
            vars.iter().zip(&tensors).map(|(v, t)| v.grad().map_or(vec![0.0; t.numel()], <[f64]>::to_vec)).collect();
        (value, grads)
    })
}

fn close(a: &[f64], b: &[f64]) {
    assert_eq!(a.len(), b.len(), "{a:?} vs {b:?}");
    for (x, y) in a.iter().zip(b) {
        assert!((x - y).abs() <= EPS * (1.0 + y.abs()), "{a:?} vs {b:?}");
    }
}

#[test]
fn add_sub_mul_div_with_broadcast() {
    // a = [[1, 2], [3, 4]], b = [10, 20] broadcast over rows.
    let (a, b): (&[f64], &[f64]) = (&[1.0, 2.0, 3.0, 4.0], &[10.0, 20.0]);
    let (v, g) = run(&[(a, &[2, 2]), (b, &[2])], |_, x| x[0] + x[1]);
    close(&v, &[11.0, 22.0, 13.0, 24.0]);
    close(&g[0], &[1.0; 4]);
    close(&g[1], &[2.0, 2.0]); // each b_j is used by both rows
    let (_, g) = run(&[(a, &[2, 2]), (b, &[2])], |_, x| x[0] - x[1]);
    close(&g[1], &[-2.0, -2.0]);
    // L = Σ a_ij b_j: dL/da_ij = b_j, dL/db_j = Σ_i a_ij.
    let (_, g) = run(&[(a, &[2, 2]), (b, &[2])], |_, x| x[0] * x[1]);
    close(&g[0], &[10.0, 20.0, 10.0, 20.0]);
    close(&g[1], &[4.0, 6.0]);
    // L = Σ a_ij / b_j: dL/da_ij = 1/b_j, dL/db_j = -Σ_i a_ij / b_j².
    let (_, g) = run(&[(a, &[2, 2]), (b, &[2])], |_, x| x[0] / x[1]);
    close(&g[0], &[0.1, 0.05, 0.1, 0.05]);
    close(&g[1], &[-4.0 / 100.0, -6.0 / 400.0]);
}

#[test]
fn pow_maximum_minimum() {
    // L = a^b at a = 2, b = 3: dL/da = b a^(b-1) = 12, dL/db = a^b ln a = 8 ln 2.
    let (v, g) = run(&[(&[2.0], &[1]), (&[3.0], &[1])], |_, x| x[0].pow(x[1]));
    close(&v, &[8.0]);
    close(&g[0], &[12.0]);
    close(&g[1], &[8.0 * 2f64.ln()]);
    // max([1, 5], [3, 5]) = [3, 5]; the gradient goes to the larger, halves on the tie.
    let (v, g) = run(&[(&[1.0, 5.0], &[2]), (&[3.0, 5.0], &[2])], |_, x| x[0].maximum(x[1]));
    close(&v, &[3.0, 5.0]);
    close(&g[0], &[0.0, 0.5]);
    close(&g[1], &[1.0, 0.5]);
    let (v, g) = run(&[(&[1.0, 5.0], &[2]), (&[3.0, 5.0], &[2])], |_, x| x[0].minimum(x[1]));
    close(&v, &[1.0, 5.0]);
    close(&g[0], &[1.0, 0.5]);
}

#[test]
fn unary_ops_at_one_point() {
    let x = 0.5f64;
    let sig = 1.0 / (1.0 + (-x).exp());
    let phi = 0.5 * (1.0 + libm::erf(x / 2f64.sqrt()));
    let pdf = (-x * x / 2.0).exp() / (2.0 * std::f64::consts::PI).sqrt();
    let k = (2.0 / std::f64::consts::PI).sqrt();
    let u = k * (x + 0.044715 * x.powi(3));
    let cases: Vec<(&str, UnaryCase, f64, f64)> = vec![
        ("neg", |v| -v, -x, -1.0),
        ("exp", |v| v.exp(), x.exp(), x.exp()),
        ("log", |v| v.log(), x.ln(), 1.0 / x),
        ("sqrt", |v| v.sqrt(), x.sqrt(), 0.5 / x.sqrt()),
        ("square", |v| v.square(), x * x, 2.0 * x),
        ("recip", |v| v.recip(), 1.0 / x, -1.0 / (x * x)),
        ("abs", |v| (-v).abs(), x, 1.0), // |−x| has slope +1 in x for x > 0
        ("sin", |v| v.sin(), x.sin(), x.cos()),
        ("cos", |v| v.cos(), x.cos(), -x.sin()),
        ("tanh", |v| v.tanh(), x.tanh(), 1.0 - x.tanh().powi(2)),
        ("sigmoid", |v| v.sigmoid(), sig, sig * (1.0 - sig)),
        ("relu", |v| v.relu(), x, 1.0),
        ("leaky_relu", |v| (-v).leaky_relu(0.1), -0.1 * x, -0.1),
        ("gelu", |v| v.gelu(), x * phi, phi + x * pdf),
        (
            "gelu_tanh",
            |v| v.gelu_tanh(),
            0.5 * x * (1.0 + u.tanh()),
            0.5 * (1.0 + u.tanh()) + 0.5 * x * (1.0 - u.tanh().powi(2)) * k * (1.0 + 3.0 * 0.044715 * x * x),
        ),
        ("softplus", |v| v.softplus(), (1.0 + x.exp()).ln(), sig),
        ("clamp", |v| v.clamp(0.0, 0.25), 0.25, 0.0), // clipped: no gradient
        ("powf", |v| v.powf(3.0), x.powi(3), 3.0 * x * x),
        ("add_scalar", |v| v + 2.0, x + 2.0, 1.0),
        ("mul_scalar", |v| v * 4.0, 4.0 * x, 4.0),
        // erf' = 2/√π e^(−x²); erf(0.5) = 0.5204998778130465 (Abramowitz & Stegun, table 7.1).
        ("erf", |v| v.erf(), 0.520_499_877_813_046_5, 2.0 / std::f64::consts::PI.sqrt() * (-x * x).exp()),
        // log1p(x) = ln 1.5, slope 1/(1 + x) = 2/3.
        ("log1p", |v| v.log1p(), 1.5f64.ln(), 2.0 / 3.0),
        // expm1(x) = e^0.5 − 1, slope e^0.5.
        ("expm1", |v| v.expm1(), x.exp() - 1.0, x.exp()),
        // atan(0.5), slope 1/(1 + 0.25) = 0.8.
        ("atan", |v| v.atan(), x.atan(), 0.8),
        // silu = x σ(x), slope σ(x) + x σ(x)(1 − σ(x)).
        ("silu", |v| v.silu(), x * sig, sig + x * sig * (1.0 - sig)),
        // rsqrt(0.5) = √2, slope −½ x^(−3/2) = −√2.
        ("rsqrt", |v| v.rsqrt(), 2f64.sqrt(), -(2f64.sqrt())),
    ];
    for (name, f, value, slope) in cases {
        let (v, g) = run(&[(&[x], &[1])], |_, a| f(a[0]));
        assert!((v[0] - value).abs() < 1e-12, "{name}: value {} vs {value}", v[0]);
        assert!((g[0][0] - slope).abs() < 1e-12, "{name}: slope {} vs {slope}", g[0][0]);
    }
}

#[test]
fn matmul_and_same_handle() {
    // a = [[1, 2], [3, 4]], L = Σ (a·a). With J the all-ones matrix,
    // dL/da = J·aᵀ + aᵀ·J: row sums of a as columns plus column sums as rows.
    let a: &[f64] = &[1.0, 2.0, 3.0, 4.0];
    let (v, g) = run(&[(a, &[2, 2])], |_, x| x[0].matmul(x[0]));
    close(&v, &[7.0, 10.0, 15.0, 22.0]);
    // J·aᵀ = [[3, 7], [3, 7]]; aᵀ·J = [[4, 4], [6, 6]].
    close(&g[0], &[7.0, 11.0, 9.0, 13.0]);
    // Batched against a broadcast matrix: [2, 1, 2] · [2, 1] sums the batch in db.
    let (v, g) = run(&[(&[1.0, 2.0, 3.0, 4.0], &[2, 1, 2]), (&[1.0, 1.0], &[2, 1])], |_, x| x[0].matmul(x[1]));
    close(&v, &[3.0, 7.0]);
    close(&g[1], &[4.0, 6.0]);
}

#[test]
fn linear_is_matmul_plus_bias_in_one_node() {
    // x = [[1, 2], [3, 4]], w = [[1, 0, 2], [0, 1, -1]], b = [10, 20, 30]; L = Σ out.
    // out = x·w + b = [[11, 22, 30], [13, 24, 32]]; with J all ones [2, 3]:
    // dx = J·wᵀ (row sums of w: 3, 0), dw = xᵀ·J (column sums of x: 4, 6), db = 2 each.
    let (v, g) = run(
        &[(&[1.0, 2.0, 3.0, 4.0], &[2, 2]), (&[1.0, 0.0, 2.0, 0.0, 1.0, -1.0], &[2, 3]), (&[10.0, 20.0, 30.0], &[3])],
        |_, x| x[0].linear(x[1], x[2]),
    );
    close(&v, &[11.0, 22.0, 30.0, 13.0, 24.0, 32.0]);
    close(&g[0], &[3.0, 0.0, 3.0, 0.0]);
    close(&g[1], &[4.0, 4.0, 4.0, 6.0, 6.0, 6.0]);
    close(&g[2], &[2.0, 2.0, 2.0]);
    // Batched x [2, 1, 2] against the same w: the rows of both batches share w and b.
    let (v, g) = run(
        &[
            (&[1.0, 2.0, 3.0, 4.0], &[2, 1, 2]),
            (&[1.0, 0.0, 2.0, 0.0, 1.0, -1.0], &[2, 3]),
            (&[10.0, 20.0, 30.0], &[3]),
        ],
        |_, x| x[0].linear(x[1], x[2]),
    );
    close(&v, &[11.0, 22.0, 30.0, 13.0, 24.0, 32.0]);
    close(&g[2], &[2.0, 2.0, 2.0]);
}

#[test]
fn shape_ops_route_gradients_back() {
    let a: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    // permute [2, 3] → [3, 2] then weight by position: L = Σ_k w_k out_k.
    let (v, g) = run(&[(a, &[2, 3])], |s, x| x[0].t() * s.tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2]));
    close(&v, &[1.0, 8.0, 6.0, 20.0, 15.0, 36.0]);
    close(&g[0], &[1.0, 3.0, 5.0, 2.0, 4.0, 6.0]);
    // narrow columns 1..3: the gradient is 1 there, 0 in column 0.
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].narrow(1, 1, 2));
    close(&v, &[2.0, 3.0, 5.0, 6.0]);
    close(&g[0], &[0.0, 1.0, 1.0, 0.0, 1.0, 1.0]);
    // index_select rows [1, 1, 0]: row 1 is used twice.
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].index_select(0, &[1, 1, 0]));
    close(&v, &[4.0, 5.0, 6.0, 4.0, 5.0, 6.0, 1.0, 2.0, 3.0]);
    close(&g[0], &[1.0, 1.0, 1.0, 2.0, 2.0, 2.0]);
    // broadcast_to [2, 3] from [3]: each element is used twice.
    let (_, g) = run(&[(&[1.0, 2.0, 3.0], &[3])], |_, x| x[0].broadcast_to(&[2, 3]));
    close(&g[0], &[2.0, 2.0, 2.0]);
    // concat [a, a] along 0 and reshape: both uses count.
    let (v, g) =
        run(&[(&[1.0, 2.0], &[2])], |s, x| s.concat(&[x[0], x[0]], 0).reshape(&[2, 2]).unsqueeze(0).squeeze(0));
    close(&v, &[1.0, 2.0, 1.0, 2.0]);
    close(&g[0], &[2.0, 2.0]);
    // stack along a new last axis: [[1, 3], [2, 4]].
    let (v, _) = run(&[(&[1.0, 2.0], &[2]), (&[3.0, 4.0], &[2])], |s, x| s.stack(&[x[0], x[1]], -1));
    close(&v, &[1.0, 3.0, 2.0, 4.0]);
    // where(cond, a, b): a where cond ≠ 0.
    let (v, g) =
        run(&[(&[1.0, 2.0], &[2]), (&[10.0, 20.0], &[2])], |s, x| s.where_(s.tensor(&[1.0, 0.0], &[2]), x[0], x[1]));
    close(&v, &[1.0, 20.0]);
    close(&g[0], &[1.0, 0.0]);
    close(&g[1], &[0.0, 1.0]);
}

#[test]
fn reductions() {
    let a: &[f64] = &[1.0, 5.0, 3.0, 2.0, 4.0, 6.0];
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].sum_axes(&[1], false));
    close(&v, &[9.0, 12.0]);
    close(&g[0], &[1.0; 6]);
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].mean_axes(&[0], true));
    close(&v, &[1.5, 4.5, 4.5]);
    close(&g[0], &[0.5; 6]);
    // Row maxima 5 and 6: the gradient goes to them only.
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].max_axes(&[-1], false));
    close(&v, &[5.0, 6.0]);
    close(&g[0], &[0.0, 1.0, 0.0, 0.0, 0.0, 1.0]);
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].min());
    close(&v, &[1.0]);
    close(&g[0], &[1.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    // logsumexp of [0, ln 3] is ln 4; the gradient is the softmax [1/4, 3/4].
    let (v, g) = run(&[(&[0.0, 3f64.ln()], &[2])], |_, x| x[0].logsumexp(0, false));
    close(&v, &[4f64.ln()]);
    close(&g[0], &[0.25, 0.75]);
    // var([1, 2, 3, 4]) unbiased = 5/3; d var/dx_i = 2(x_i − mean)/(n − 1).
    let (v, g) = run(&[(&[1.0, 2.0, 3.0, 4.0], &[4])], |_, x| x[0].var(&[0], false, 1));
    close(&v, &[5.0 / 3.0]);
    close(&g[0], &[-1.0, -1.0 / 3.0, 1.0 / 3.0, 1.0]);
}

#[test]
fn softmax_and_losses() {
    // softmax([0, ln 3]) = [1/4, 3/4]; Σ softmax = 1, so its gradient under L = Σ out is 0.
    let x: &[f64] = &[0.0, 3f64.ln()];
    let (v, g) = run(&[(x, &[1, 2])], |_, a| a[0].softmax(-1));
    close(&v, &[0.25, 0.75]);
    close(&g[0], &[0.0, 0.0]);
    // log_softmax: Σ_k (x_k − lse); d/dx_j = 1 − 2·p_j.
    let (v, g) = run(&[(x, &[1, 2])], |_, a| a[0].log_softmax(-1));
    close(&v, &[0.25f64.ln(), 0.75f64.ln()]);
    close(&g[0], &[0.5, -0.5]);
    // cross_entropy with label 1: −ln 0.75; gradient p − onehot = [0.25, −0.25].
    let (v, g) = run(&[(x, &[1, 2])], |_, a| a[0].cross_entropy(&[1]));
    close(&v, &[-(0.75f64.ln())]);
    close(&g[0], &[0.25, -0.25]);
    // nll_loss on log-probabilities [[ln .2, ln .8], [ln .5, ln .5]] with labels [1, 0]:
    // −(ln .8 + ln .5)/2; gradient −1/2 at the labels.
    let lp: &[f64] = &[0.2f64.ln(), 0.8f64.ln(), 0.5f64.ln(), 0.5f64.ln()];
    let (v, g) = run(&[(lp, &[2, 2])], |_, a| a[0].nll_loss(&[1, 0]));
    close(&v, &[-(0.8f64.ln() + 0.5f64.ln()) / 2.0]);
    close(&g[0], &[0.0, -0.5, -0.5, 0.0]);
    // bce_with_logits at x = 0, y = 1: ln 2; dx = σ(0) − 1 = −1/2, dy = −x = 0.
    let (v, g) = run(&[(&[0.0], &[1]), (&[1.0], &[1])], |_, a| a[0].bce_with_logits(a[1]));
    close(&v, &[2f64.ln()]);
    close(&g[0], &[-0.5]);
    close(&g[1], &[0.0]);
    // mse([1, 3], [0, 0]) = 5; d/da = 2(a − b)/n = [1, 3].
    let (v, g) = run(&[(&[1.0, 3.0], &[2]), (&[0.0, 0.0], &[2])], |_, a| a[0].mse_loss(a[1]));
    close(&v, &[5.0]);
    close(&g[0], &[1.0, 3.0]);
    close(&g[1], &[-1.0, -3.0]);
}

#[test]
fn comparisons_are_masks_without_gradient() {
    let (v, g) = run(&[(&[1.0, 2.0, 3.0], &[3]), (&[2.0], &[1])], |_, a| {
        a[0].gt(a[1]) + a[0].ge(a[1]) * 10.0 + a[0].lt(a[1]) * 100.0 + a[0].le(a[1]) * 1000.0 + a[0].equal(a[1]) * 1e4
    });
    close(&v, &[1100.0, 11010.0, 11.0]);
    close(&g[0], &[0.0; 3]);
}

#[test]
fn f32_graphs_work_too() {
    let x = Tensor::<f32>::from_vec(vec![1.0, -2.0], &[2]).unwrap();
    let mut g = Graph::<f32>::new();
    let grad = g.scope(|s| {
        let v = s.leaf(&x);
        s.backward((v * v).sum()).unwrap();
        v.grad().unwrap().to_vec()
    });
    assert_eq!(grad, [2.0, -4.0]);
}

#[test]
fn adjoint_ops_put_values_back() {
    let a: &[f64] = &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    // pad_axis(1, 1, 2) on [2, 3]: a zero column in front, two behind; every input
    // element appears once, so the gradient of Σ out is 1.
    let (v, g) = run(&[(a, &[2, 3])], |_, x| x[0].pad_axis(1, 1, 2));
    close(&v, &[0.0, 1.0, 2.0, 3.0, 0.0, 0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0]);
    close(&g[0], &[1.0; 6]);
    // scatter_add rows to [2, 0, 2] of 3: rows 0 and 2 of the input add up in row 2.
    let (v, g) = run(&[(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[3, 2])], |_, x| x[0].scatter_add(0, &[2, 0, 2], 3));
    close(&v, &[3.0, 4.0, 0.0, 0.0, 6.0, 8.0]);
    close(&g[0], &[1.0; 6]);
    // col2im of [1, 4, 4] onto a 3×3 image, kernel 2, stride 1: the four 2×2 windows
    // overlap in the centre, which gets all four columns' entries; corners get one.
    let cols: Vec<f64> = (0..16).map(f64::from).collect();
    let (v, g) = run(&[(&cols, &[1, 4, 4])], |_, x| x[0].col2im([3, 3], [2, 2], [1, 1], [0, 0]));
    // cols[(a·2 + b)·4 + window]: window (oi, oj) = (0, 0) reads pixel (a, b).
    // Pixel (0, 0): only a = b = 0 of window 0 → cols[0] = 0.
    // Pixel (1, 1): (a, b) = (1, 1) of window 0 → cols[12]; (1, 0) of window 1 → cols[9];
    // (0, 1) of window 2 → cols[6]; (0, 0) of window 3 → cols[3]: 12 + 9 + 6 + 3 = 30.
    assert_eq!(v.len(), 9);
    close(&v[..1], &[0.0]);
    close(&v[4..5], &[30.0]);
    close(&v, &[0.0, 1.0 + 4.0, 5.0, 2.0 + 8.0, 30.0, 7.0 + 13.0, 10.0, 11.0 + 14.0, 15.0]);
    close(&g[0], &[1.0; 16]);
}

#[test]
fn layer_norm_of_one_row() {
    // x = [1, 2, 3], eps = 0: μ = 2, σ² = 2/3, r = √(3/2) = a, x̂ = [−a, 0, a].
    // out = x̂ ⊙ w + b with w = [2, 1, 1], b = [0, 1, 0]: [−2a, 1, a].
    // L = Σ out: g = [1, 1, 1], ĝ = g ⊙ w = [2, 1, 1], mean(ĝ) = 4/3,
    // mean(ĝ ⊙ x̂) = (−2a + a)/3 = −a/3, so dx = a·(ĝ − 4/3 − x̂·(−a/3))
    // = a·[2 − 4/3 − a²/3, 1 − 4/3, 1 − 4/3 + a²/3] = a·[1/6, −1/3, 1/6] (a² = 3/2);
    // dw = g ⊙ x̂ = [−a, 0, a], db = g = [1, 1, 1].
    let a = 1.5f64.sqrt();
    let (value, grads) =
        run(&[(&[1.0, 2.0, 3.0], &[1, 3]), (&[2.0, 1.0, 1.0], &[3]), (&[0.0, 1.0, 0.0], &[3])], |_, v| {
            v[0].layer_norm(v[1], v[2], 0.0)
        });
    close(&value, &[-2.0 * a, 1.0, a]);
    close(&grads[0], &[a / 6.0, -a / 3.0, a / 6.0]);
    close(&grads[1], &[-a, 0.0, a]);
    close(&grads[2], &[1.0, 1.0, 1.0]);
}
