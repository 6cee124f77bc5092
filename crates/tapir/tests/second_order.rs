//! Second and higher derivatives through [`Scope::grad`]: every op kind against the fast
//! backward and finite differences, and closed forms.
#![allow(clippy::needless_range_loop)] // indices address several arrays alike

use tapir::testing::{gradcheck, gradgradcheck, GradcheckOptions};
use tapir::{BinaryFn, CustomError, CustomInputs, CustomOp, Error, Graph, OpKind, Scope, Shape, Tensor, UnaryFn, Var};

/// `y = 2x`, with a recorded derivative and a forward rule when `hook` is set.
pub(crate) struct Double {
    pub(crate) hook: bool,
}

impl CustomOp<f64> for Double {
    fn name(&self) -> &'static str {
        "double"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn forward(&self, x: CustomInputs<'_, f64>, out: &mut [f64], _: &mut [f64]) -> Result<(), CustomError> {
        out.iter_mut().zip(x.value(0)).for_each(|(y, &x)| *y = 2.0 * x);
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, f64>,
        _: &[f64],
        _: &[f64],
        dout: &[f64],
        dx: &mut [Option<&mut [f64]>],
    ) -> Result<(), CustomError> {
        if let Some(dx) = dx[0].as_deref_mut() {
            dx.iter_mut().zip(dout).for_each(|(d, &g)| *d += 2.0 * g);
        }
        Ok(())
    }
    fn grad<'s>(
        &self,
        _: &[Var<'s, f64>],
        _: Var<'s, f64>,
        dout: Var<'s, f64>,
        dx: &mut [Option<Var<'s, f64>>],
    ) -> bool {
        if self.hook {
            dx[0] = Some(dout * 2.0);
        }
        self.hook
    }
    fn jvp<'s>(
        &self,
        _: &[Var<'s, f64>],
        _: Var<'s, f64>,
        tangents: &[Option<Var<'s, f64>>],
        tangent: &mut Option<Var<'s, f64>>,
    ) -> bool {
        if self.hook {
            *tangent = tangents[0].map(|t| t * 2.0);
        }
        self.hook
    }
}

/// The example block of [`OpKind::Checkpoint`]: `exp(tanh(x ⊙ y) · w)`, every input used.
fn checkpointed<'c>(_: &'c Scope<'c, '_, f64>, v: &[Var<'c, f64>]) -> Var<'c, f64> {
    (v[0] * v[1]).tanh().matmul(v[2]).exp()
}

/// The leaves every example reads: `x`, `y: [2, 3]` in (0.1, 0.9), apart from each other
/// and from every kink and tie; `w: [3, 2]`; `img: [1, 1, 4, 4]` with distinct values.
pub(crate) fn inputs() -> Vec<Tensor<f64>> {
    vec![
        Tensor::from_vec(vec![0.21, 0.33, 0.42, 0.51, 0.64, 0.87], &[2, 3]).unwrap(),
        Tensor::from_vec(vec![0.72, 0.28, 0.13, 0.79, 0.57, 0.46], &[2, 3]).unwrap(),
        Tensor::from_vec(vec![0.5, -0.5, 0.25, 0.75, -0.25, 1.0], &[3, 2]).unwrap(),
        Tensor::from_vec((0..16).map(|i| f64::from((i * 7) % 16) / 16.0 - 0.4).collect(), &[1, 1, 4, 4]).unwrap(),
    ]
}

/// One op of `kind` (the last node recorded) on the leaves `v = [x, y, w, img]`.
pub(crate) fn example<'s>(s: &'s Scope<'s, '_, f64>, v: &[Var<'s, f64>], kind: OpKind) -> Var<'s, f64> {
    let (x, y, w, img) = (v[0], v[1], v[2], v[3]);
    let mask = || s.tensor(&[1.0, 0.0, 1.0, 0.0, 1.0, 0.0], &[2, 3]);
    match kind {
        OpKind::Unary(f) => match f {
            UnaryFn::Neg => -x,
            UnaryFn::AddScalar => x + 1.0,
            UnaryFn::MulScalar => x * 2.0,
            UnaryFn::Powf => x.powf(2.5),
            UnaryFn::Exp => x.exp(),
            UnaryFn::Log => x.log(),
            UnaryFn::Log1p => x.log1p(),
            UnaryFn::Expm1 => x.expm1(),
            UnaryFn::Sqrt => x.sqrt(),
            UnaryFn::Rsqrt => x.rsqrt(),
            UnaryFn::Square => x.square(),
            UnaryFn::Recip => x.recip(),
            UnaryFn::Abs => (x - 0.45).abs(),
            UnaryFn::Sin => x.sin(),
            UnaryFn::Cos => x.cos(),
            UnaryFn::Tanh => x.tanh(),
            UnaryFn::Atan => x.atan(),
            UnaryFn::Erf => x.erf(),
            UnaryFn::Sigmoid => x.sigmoid(),
            UnaryFn::Relu => (x - 0.45).relu(),
            UnaryFn::LeakyRelu => (x - 0.45).leaky_relu(0.1),
            UnaryFn::Gelu => x.gelu(),
            UnaryFn::GeluTanh => x.gelu_tanh(),
            UnaryFn::Softplus => x.softplus(),
            UnaryFn::Silu => x.silu(),
            UnaryFn::Clamp => x.clamp(0.3, 0.6),
            other => panic!("no example for {other:?}: add one"),
        },
        OpKind::Binary(f) => match f {
            BinaryFn::Add => x + y,
            BinaryFn::Sub => x - y.sum_axes(&[0], true), // broadcasting
            BinaryFn::Mul => x * y,
            BinaryFn::Div => x / y.sum_axes(&[1], true),
            BinaryFn::Pow => x.pow(y),
            BinaryFn::Maximum => x.maximum(y),
            BinaryFn::Minimum => x.minimum(y),
            other => panic!("no example for {other:?}: add one"),
        },
        OpKind::MatMul => x.matmul(w).square(),
        OpKind::Linear => x.linear(w, y.sum_axes(&[1], false)).square(),
        OpKind::LayerNorm => x.layer_norm(y.sum_axes(&[0], false), y.narrow(0, 1, 1).reshape(&[3]), 1e-3).square(),
        OpKind::AttentionWeights => x.reshape(&[1, 2, 3]).attention_weights(1, true).square(),
        OpKind::Attend => (x * y).narrow(1, 0, 2).reshape(&[1, 1, 2, 2]).attend(y.exp().reshape(&[1, 2, 3])).square(),
        OpKind::Reshape => x.reshape(&[3, 2]).matmul(x),
        OpKind::Permute => x.permute(&[1, 0]) * w,
        OpKind::BroadcastTo => x.broadcast_to(&[4, 2, 3]) * y,
        OpKind::Narrow => x.narrow(1, 1, 2).square(),
        OpKind::Concat => s.concat(&[x, y], 0).square(),
        OpKind::IndexSelect => x.index_select(0, &[1, 0, 1]).square(),
        OpKind::Where => s.where_(mask(), x.square(), y.exp()),
        OpKind::Sum => x.square().sum(),
        OpKind::SumAxis => x.sum_axes(&[1], true).square(),
        OpKind::MaxAxis => (x * y).max_axes(&[1], true).square(),
        OpKind::MinAxis => (x * y).min_axes(&[0], true).square(),
        OpKind::LogSumExp => (x * y).logsumexp(1, true),
        OpKind::Softmax => (x * y).softmax(1),
        OpKind::LogSoftmax => (x * y).log_softmax(0),
        OpKind::CrossEntropy => (x * y).cross_entropy(&[0, 2]),
        OpKind::NllLoss => x.exp().nll_loss(&[0, 2]).square(),
        OpKind::BceWithLogits => x.bce_with_logits(y),
        OpKind::Im2Col => img.im2col([2, 2], [1, 1], [1, 0]).square(),
        OpKind::MaxPool2d => img.square().max_pool2d([2, 2], [2, 1], [1, 1]),
        OpKind::AvgPool2d => img.avg_pool2d([3, 2], [1, 2], [1, 0]).square(),
        OpKind::Pad => x.pad_axis(1, 1, 2).square(),
        OpKind::ScatterAdd => x.scatter_add(0, &[2, 2], 3).square(),
        OpKind::Col2Im => img.reshape(&[1, 4, 4]).col2im([3, 3], [2, 2], [1, 1], [0, 0]).square(),
        OpKind::Custom => s.custom(&Double { hook: true }, &[x]).square(),
        OpKind::Checkpoint => s.checkpoint(&checkpointed, &[x, y, w]).square(),
        other => panic!("no example for {other:?}: add one"),
    }
}

pub(crate) fn is_leaf(kind: OpKind) -> bool {
    matches!(kind, OpKind::Leaf | OpKind::Variable | OpKind::Param)
}

/// `s.grad` and the fast backward agree to 1e-12 on `L = Σ out ⊙ r`.
fn grad_matches_backward(kind: OpKind) {
    let t = inputs();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let v: Vec<_> = t.iter().map(|t| s.leaf(t)).collect();
        let out = example(s, &v, kind);
        let n = out.shape().numel();
        let r: Vec<f64> = (0..n).map(|i| 0.3 + (i as f64 * 0.37).sin()).collect();
        let l = (out * s.tensor(&r, &out.shape().to_vec())).sum();
        let mut recorded = vec![s.scalar(0.0); v.len()];
        s.grad_into(l, &v, &mut recorded).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        s.backward(l).unwrap();
        for (i, (x, dx)) in v.iter().zip(&recorded).enumerate() {
            let dx = dx.value().unwrap();
            assert_eq!(dx.len(), t[i].numel(), "{kind:?}: input {i}");
            let fast = x.grad().map_or_else(|| vec![0.0; dx.len()], <[f64]>::to_vec);
            for (a, b) in dx.iter().zip(&fast) {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{kind:?}: input {i}: recorded {a} vs backward {b}");
            }
        }
    });
}

/// The fast backward runs through recorded gradients too (a gradient penalty, a PINN
/// residual, a MAML step): for `M = Σ ⟨∂L/∂xᵢ, uᵢ⟩`, backward's gradient equals the
/// recorded one to 1e-12.
fn backward_through_recorded_gradients(kind: OpKind) {
    let t = inputs();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let v: Vec<_> = t.iter().map(|t| s.leaf(t)).collect();
        let out = example(s, &v, kind);
        let l = (out * out.detach().sin()).sum();
        let mut first = vec![l; v.len()];
        s.grad_into(l, &v, &mut first).unwrap();
        let mut m = s.scalar(0.0);
        for (gi, x) in first.iter().zip(&v) {
            m = m + (*gi * x.detach().cos()).sum();
        }
        if !m.requires_grad() {
            return;
        }
        let mut second = vec![l; v.len()];
        s.grad_into(m, &v, &mut second).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        s.backward(m).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        for (i, (x, h)) in v.iter().zip(&second).enumerate() {
            let h = h.value().unwrap();
            let fast = x.grad().map_or_else(|| vec![0.0; h.len()], <[f64]>::to_vec);
            for (a, b) in h.iter().zip(&fast) {
                assert!((a - b).abs() <= 1e-12 * b.abs().max(1.0), "{kind:?}: input {i}: recorded {a} vs backward {b}");
            }
        }
    });
}

#[test]
fn every_kind_has_an_exact_recorded_derivative() {
    let mut kinds = 0;
    for kind in OpKind::all().filter(|&k| !is_leaf(k)) {
        kinds += 1;
        grad_matches_backward(kind);
        backward_through_recorded_gradients(kind);
        let opts = GradcheckOptions { seed: 7, ..GradcheckOptions::default() };
        gradcheck(&inputs(), opts, |s, v| example(s, v, kind)).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        gradgradcheck(&inputs(), opts, |s, v| example(s, v, kind)).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
    }
    assert_eq!(kinds, UnaryFn::ALL.len() + BinaryFn::ALL.len() + 30);
}

#[test]
fn third_derivative_of_x4() {
    // y = x⁴: y' = 4x³, y'' = 12x², y''' = 24x.
    let x = Tensor::from_vec(vec![0.5f64, -1.5, 2.0], &[3]).unwrap();
    let mut g = Graph::<f64>::new();
    let (d1, d2, d3) = g
        .scope(|s| {
            let x = s.leaf(&x);
            let y = x.powf(4.0).sum();
            let [d1] = s.grad(y, [x])?;
            let [d2] = s.grad(d1.sum(), [x])?;
            let [d3] = s.grad(d2.sum(), [x])?;
            Ok::<_, Error>((d1.value()?.to_vec(), d2.value()?.to_vec(), d3.value()?.to_vec()))
        })
        .unwrap();
    for (i, &v) in [0.5f64, -1.5, 2.0].iter().enumerate() {
        assert!((d1[i] - 4.0 * v.powi(3)).abs() < 1e-12);
        assert!((d2[i] - 12.0 * v * v).abs() < 1e-12);
        assert!((d3[i] - 24.0 * v).abs() < 1e-12);
    }
}

#[test]
fn hessian_of_a_quadratic_form_is_a_plus_a_transpose() {
    // f = xᵀAx: ∇f = (A + Aᵀ)x, ∇²f = A + Aᵀ.
    let n = 4;
    let a: Vec<f64> = (0..n * n).map(|i| ((i * 5) % 7) as f64 - 2.5).collect();
    let at = Tensor::from_vec(a.clone(), &[n, n]).unwrap();
    let x = Tensor::from_vec(vec![0.3, -1.1, 2.0, 0.7], &[n]).unwrap();
    let mut g = Graph::<f64>::new();
    let h = tapir::func::hessian(&mut g, &x, |s, x| {
        let col = x.reshape(&[n, 1]);
        col.t().matmul(s.input(&at)).matmul(col).sum()
    })
    .unwrap();
    assert_eq!(h.shape().dims(), &[4, 4]);
    for i in 0..n {
        for j in 0..n {
            assert_eq!(h.data()[i * n + j], a[i * n + j] + a[j * n + i], "({i}, {j})");
        }
    }
}

#[test]
fn hessian_of_logsumexp_is_diag_p_minus_p_p_transpose() {
    // f = ln Σ eˣ: ∇f = p = softmax(x), ∇²f = diag(p) − ppᵀ.
    let xs = [0.4f64, -1.3, 2.2, 0.1, -0.5];
    let n = xs.len();
    let x = Tensor::from_vec(xs.to_vec(), &[n]).unwrap();
    let z: f64 = xs.iter().map(|v| v.exp()).sum();
    let p: Vec<f64> = xs.iter().map(|v| v.exp() / z).collect();
    let mut g = Graph::<f64>::new();
    let h = tapir::func::hessian(&mut g, &x, |_, x| x.logsumexp(0, false)).unwrap();
    for i in 0..n {
        for j in 0..n {
            let expected = if i == j { p[i] } else { 0.0 } - p[i] * p[j];
            assert!((h.data()[i * n + j] - expected).abs() < 1e-14, "({i}, {j})");
        }
    }
    // The same through the f32 path, looser.
    let x32 = Tensor::from_vec(xs.iter().map(|&v| v as f32).collect(), &[n]).unwrap();
    let mut g32 = Graph::<f32>::new();
    let h32 = tapir::func::hessian(&mut g32, &x32, |_, x| x.logsumexp(0, false)).unwrap();
    for (i, &v) in h32.data().iter().enumerate() {
        let expected = if i / n == i % n { p[i / n] } else { 0.0 } - p[i / n] * p[i % n];
        assert!((f64::from(v) - expected).abs() < 1e-6, "{i}");
    }
}

#[test]
fn jvp_and_jacobian_agree_with_a_closed_form() {
    // f = sin(x) ⊙ x: J = diag(cos x ⊙ x + sin x).
    let xs = [0.3f64, -0.8, 1.7];
    let x = Tensor::from_vec(xs.to_vec(), &[3]).unwrap();
    let v = Tensor::from_vec(vec![1.0, -2.0, 0.5], &[3]).unwrap();
    let d: Vec<f64> = xs.iter().map(|&x| x.cos() * x + x.sin()).collect();
    let mut g = Graph::<f64>::new();
    let (y, jv) = tapir::func::jvp(&mut g, &x, &v, |_, x| x.sin() * x).unwrap();
    let j = tapir::func::jacobian(&mut g, &x, |_, x| x.sin() * x).unwrap();
    for i in 0..3 {
        assert!((y.data()[i] - xs[i].sin() * xs[i]).abs() < 1e-15);
        assert!((jv.data()[i] - d[i] * v.data()[i]).abs() < 1e-14);
        for k in 0..3 {
            let expected = if i == k { d[i] } else { 0.0 };
            assert!((j.data()[i * 3 + k] - expected).abs() < 1e-14);
        }
    }
    // hvp of Σ x⁴/12: H = diag(x²).
    let hv = tapir::func::hvp(&mut g, &x, &v, |_, x| x.powf(4.0).sum() * (1.0 / 12.0)).unwrap();
    for i in 0..3 {
        assert!((hv.data()[i] - xs[i] * xs[i] * v.data()[i]).abs() < 1e-14);
    }
}

/// A sum's recorded derivative is kept small until needed (`GradCtx::add_broadcast`):
/// two sums of one input, a full-size contribution after them, an input reached only
/// through a sum, and a product of the summed values. `L = Σx + Σ_j (Σ_i x_ij)·c_j + Σ x²
/// + Σ(y ⊙ z)`, so `∂L/∂x = 1 + c + 2x` (c broadcast over rows), `∂L/∂y = z`, `∂L/∂z = y`.
#[test]
fn sums_derivatives_broadcast_lazily() {
    let x = Tensor::from_vec(vec![0.5, -1.0, 2.0, 0.25, 1.5, -0.75], &[2, 3]).unwrap();
    let (y, z) = (x.map(|v| v + 1.0).unwrap(), x.map(|v| 2.0 - v).unwrap());
    let c = [0.3, -0.2, 0.7];
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (xv, yv, zv) = (s.leaf(&x), s.leaf(&y), s.leaf(&z));
        let l =
            xv.sum() + (xv.sum_axes(&[0], true) * s.tensor(&c, &[1, 3])).sum() + xv.square().sum() + (yv * zv).sum();
        let [dx, dy, dz] = s.grad(l, [xv, yv, zv]).unwrap();
        assert_eq!(dx.shape().to_vec(), vec![2, 3]);
        for (i, (d, xi)) in dx.value().unwrap().iter().zip(x.data()).enumerate() {
            assert!((d - (1.0 + c[i % 3] + 2.0 * xi)).abs() < 1e-12, "{i}: {d}");
        }
        assert_eq!(dy.value().unwrap(), z.data());
        assert_eq!(dz.value().unwrap(), y.data());
        // The Hessian-vector product of the same L in direction u: 2u for x, (u_z, u_y).
        let u = s.tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]);
        let m = (dx * u).sum() + (dy * u).sum() + (dz * u.mul_scalar(2.0)).sum();
        let [hx, hy, hz] = s.grad(m, [xv, yv, zv]).unwrap();
        assert_eq!(hx.value().unwrap(), &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
        assert_eq!(hy.value().unwrap(), &[2.0, 4.0, 6.0, 8.0, 10.0, 12.0]);
        assert_eq!(hz.value().unwrap(), &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        // A sum's derivative handed out directly has the input's shape.
        let [ones] = s.grad(xv.sum(), [xv]).unwrap();
        assert_eq!((ones.shape().to_vec(), ones.value().unwrap()), (vec![2, 3], &[1.0; 6][..]));
    });
}

#[test]
fn grad_semantics_and_errors() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
    let c = Tensor::from_vec(vec![3.0f64], &[1]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (xv, cv, unused) = (s.leaf(&x), s.input(&c), s.leaf(&c));
        let y = (xv * xv).sum() * 3.0;
        // Unreached and no-gradient inputs get zeros of their shape.
        let [dx, dc, du] = s.grad(y, [xv, cv, unused]).unwrap();
        assert_eq!(dx.value().unwrap(), &[6.0, 12.0]);
        assert_eq!((dc.value().unwrap(), du.value().unwrap()), (&[0.0][..], &[0.0][..]));
        assert!(!du.requires_grad());
        // Under no_grad the gradient is a value that requires none.
        let [frozen] = s.no_grad(|| s.grad(y, [xv])).unwrap();
        assert_eq!(frozen.value().unwrap(), &[6.0, 12.0]);
        assert!(!frozen.requires_grad() && dx.requires_grad());
        // Not consumed: backward still works afterwards, and so does grad.
        let line = line!() + 1;
        let e = s.grad(xv * 2.0, [xv]).unwrap_err();
        assert!(matches!(e, Error::NotScalar { op: "grad", .. }), "{e}");
        assert_eq!(e.location().map(|l| (l.file(), l.line())), Some((file!(), line)));
        let mut out = [dx; 1];
        let e = s.grad_into(y, &[xv, xv], &mut out).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { op: "grad_into", .. }), "{e}");
        let e = s.vjp(xv * 2.0, s.zeros(&[3]), [xv]).unwrap_err();
        assert!(matches!(e, Error::ShapeMismatch { op: "vjp", .. }), "{e}");
        s.backward(y).unwrap();
        assert_eq!(xv.grad().unwrap(), &[6.0, 12.0]);
        let e = s.grad(y, [xv]).unwrap_err();
        assert!(matches!(e, Error::BackwardTwice { .. }), "{e}");
    });
}

#[test]
fn custom_op_without_a_recorded_derivative_is_a_typed_error() {
    let x = Tensor::from_vec(vec![1.0f64, 2.0], &[2]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let xv = s.leaf(&x);
        let y = s.custom(&Double { hook: false }, &[xv]).square().sum();
        let line = line!() + 1;
        let e = s.grad(y, [xv]).unwrap_err();
        match &e {
            Error::SecondOrderUnsupported { op: "grad", custom: "double", inputs, location } => {
                assert_eq!(inputs, &[x.shape()]);
                assert_eq!((location.file(), location.line()), (file!(), line));
            }
            _ => panic!("{e}"),
        }
        // The fast backward is unaffected.
        s.backward(y).unwrap();
        assert_eq!(xv.grad().unwrap(), &[8.0, 16.0]); // y = Σ (2x)², dy/dx = 8x
    });
}
