//! One name per op kind: for every kind in the op table ([`OpKind::all`], the table
//! backward dispatches on), the name in a forward error, in a backward anomaly and in the
//! DOT label is the kind's name. Composite methods report errors raised while recording
//! under their own name, at the caller's line.

use tapir::{
    BinaryFn, Conv2dOptions, CustomError, CustomInputs, CustomOp, Error, Graph, OpKind, ParamStore, Scope, Shape,
    Tensor, UnaryFn, Var,
};

/// The example of [`OpKind::Custom`]: `y = 2x`. A custom node is named by its own
/// [`CustomOp::name`], not by the kind's `"custom"` (see [`name_of`]).
struct Double;

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
}

/// The example block of [`OpKind::Checkpoint`].
fn identity<'c>(_: &'c Scope<'c, '_, f64>, x: &[Var<'c, f64>]) -> Var<'c, f64> {
    x[0]
}

/// The name a node of `kind` reports: the kind's, or for a custom op the op's own.
fn name_of(kind: OpKind) -> &'static str {
    match kind {
        OpKind::Custom => CustomOp::<f64>::name(&Double),
        _ => kind.name(),
    }
}

/// The leaves every example reads: `x`, `y: [2, 3]` (values in (0.1, 0.9), inside every
/// function's domain), `w: [3, 2]`, `img: [1, 1, 4, 4]`, `mask: [2, 3]` (no gradient).
struct Inputs {
    x: Tensor<f64>,
    y: Tensor<f64>,
    w: Tensor<f64>,
    img: Tensor<f64>,
    mask: Tensor<f64>,
    bias: Tensor<f64>,
    /// `[3]`: a row's scale or shift.
    row: Tensor<f64>,
    /// `[1, 1, 2, 2]`: attention weights over `x` seen as `qkv: [1, 2, 3]`.
    weights: Tensor<f64>,
}

impl Inputs {
    fn new() -> Inputs {
        let x = Tensor::from_vec(vec![0.2, 0.3, 0.4, 0.5, 0.6, 0.9], &[2, 3]).unwrap();
        let y = Tensor::from_vec(vec![0.7, 0.3, 0.1, 0.8, 0.6, 0.5], &[2, 3]).unwrap();
        let w = Tensor::from_vec(vec![0.5, -0.5, 0.25, 0.75, -0.25, 1.0], &[3, 2]).unwrap();
        let img = Tensor::from_vec((0..16).map(|i| f64::from(i) / 16.0).collect(), &[1, 1, 4, 4]).unwrap();
        let mask = Tensor::from_vec(vec![1.0, 0.0, 1.0, 0.0, 1.0, 0.0], &[2, 3]).unwrap();
        let bias = Tensor::from_vec(vec![0.5, -0.5], &[2]).unwrap();
        let row = Tensor::from_vec(vec![0.5, -1.0, 2.0], &[3]).unwrap();
        let weights = Tensor::from_vec(vec![1.0, 0.0, 0.25, 0.75], &[1, 1, 2, 2]).unwrap();
        Inputs { x, y, w, img, mask, bias, row, weights }
    }
}

/// Records exactly one node of `kind` as the last node (leaves aside), from leaves of `t`.
fn example<'s, 'g>(s: &'s Scope<'s, 'g, f64>, t: &'g Inputs, kind: OpKind) -> Var<'s, f64> {
    let (x, w, img) = (s.leaf(&t.x), s.leaf(&t.w), s.leaf(&t.img));
    match kind {
        OpKind::Unary(f) => match f {
            UnaryFn::Neg => -x,
            UnaryFn::AddScalar => x + 1.0,
            UnaryFn::MulScalar => x * 2.0,
            UnaryFn::Powf => x.powf(1.5),
            UnaryFn::Exp => x.exp(),
            UnaryFn::Log => x.log(),
            UnaryFn::Log1p => x.log1p(),
            UnaryFn::Expm1 => x.expm1(),
            UnaryFn::Sqrt => x.sqrt(),
            UnaryFn::Rsqrt => x.rsqrt(),
            UnaryFn::Square => x.square(),
            UnaryFn::Recip => x.recip(),
            UnaryFn::Abs => x.abs(),
            UnaryFn::Sin => x.sin(),
            UnaryFn::Cos => x.cos(),
            UnaryFn::Tanh => x.tanh(),
            UnaryFn::Atan => x.atan(),
            UnaryFn::Erf => x.erf(),
            UnaryFn::Sigmoid => x.sigmoid(),
            UnaryFn::Relu => x.relu(),
            UnaryFn::LeakyRelu => x.leaky_relu(0.1),
            UnaryFn::Gelu => x.gelu(),
            UnaryFn::GeluTanh => x.gelu_tanh(),
            UnaryFn::Softplus => x.softplus(),
            UnaryFn::Silu => x.silu(),
            UnaryFn::Clamp => x.clamp(0.0, 0.5),
            other => panic!("no example for {other:?}: add one"),
        },
        OpKind::Binary(f) => {
            let y = s.leaf(&t.y);
            match f {
                BinaryFn::Add => x + y,
                BinaryFn::Sub => x - y,
                BinaryFn::Mul => x * y,
                BinaryFn::Div => x / y,
                BinaryFn::Pow => x.pow(y),
                BinaryFn::Maximum => x.maximum(y),
                BinaryFn::Minimum => x.minimum(y),
                other => panic!("no example for {other:?}: add one"),
            }
        }
        OpKind::MatMul => x.matmul(w),
        OpKind::Linear => x.linear(w, s.leaf(&t.bias)),
        OpKind::LayerNorm => x.layer_norm(s.leaf(&t.row), s.leaf(&t.row), 1e-5),
        OpKind::AttentionWeights => x.reshape(&[1, 2, 3]).attention_weights(1, true),
        OpKind::Attend => s.leaf(&t.weights).attend(x.reshape(&[1, 2, 3])),
        OpKind::Reshape => x.reshape(&[3, 2]),
        OpKind::Permute => x.permute(&[1, 0]),
        OpKind::BroadcastTo => x.broadcast_to(&[4, 2, 3]),
        OpKind::Narrow => x.narrow(1, 1, 2),
        OpKind::Concat => s.concat(&[x, x], 0),
        OpKind::IndexSelect => x.index_select(0, &[1, 0, 1]),
        OpKind::Where => s.where_(s.input(&t.mask), x, s.leaf(&t.y)),
        OpKind::Sum => x.sum(),
        OpKind::SumAxis => x.sum_axes(&[1], true),
        OpKind::MaxAxis => x.max_axes(&[1], true),
        OpKind::MinAxis => x.min_axes(&[1], true),
        OpKind::LogSumExp => x.logsumexp(1, true),
        OpKind::Softmax => x.softmax(1),
        OpKind::LogSoftmax => x.log_softmax(1),
        OpKind::CrossEntropy => x.cross_entropy(&[0, 2]),
        OpKind::NllLoss => x.nll_loss(&[0, 2]),
        OpKind::BceWithLogits => x.bce_with_logits(s.input(&t.mask)),
        OpKind::Im2Col => img.im2col([2, 2], [1, 1], [0, 0]),
        OpKind::MaxPool2d => img.max_pool2d([2, 2], [2, 2], [0, 0]),
        OpKind::AvgPool2d => img.avg_pool2d([2, 2], [2, 2], [0, 0]),
        OpKind::Pad => x.pad_axis(1, 1, 2),
        OpKind::ScatterAdd => x.scatter_add(0, &[1, 0], 3),
        OpKind::Col2Im => img.reshape(&[1, 4, 4]).col2im([4, 4], [2, 2], [2, 2], [0, 0]),
        OpKind::Custom => s.custom(&Double, &[x]),
        // The identity, so that the only allocation is the checkpoint's own output.
        OpKind::Checkpoint => s.checkpoint(&identity, &[x]),
        OpKind::Leaf | OpKind::Variable | OpKind::Param => unreachable!("leaves have examples of their own"),
        other => panic!("no example for {other:?}: add one"),
    }
}

fn is_leaf(kind: OpKind) -> bool {
    matches!(kind, OpKind::Leaf | OpKind::Variable | OpKind::Param)
}

/// A forward error raised while recording `kind`: the op's output does not fit a zero-byte
/// arena (reshape allocates nothing, so a bad shape instead; leaves, a NaN under anomaly
/// detection).
fn forward_error(kind: OpKind) -> Error {
    let t = Inputs::new();
    let mut g = Graph::<f64>::new();
    if is_leaf(kind) {
        g.set_anomaly_detection(true);
        let nan = Tensor::from_vec(vec![f64::NAN], &[1]).unwrap();
        let mut store = ParamStore::new();
        let p = store.add("p", nan.clone()).unwrap();
        return g.scope(|s| {
            let _ = match kind {
                OpKind::Leaf => s.input(&nan),
                OpKind::Variable => s.leaf(&nan),
                _ => s.param(&store, p),
            };
            s.check().expect_err("a NaN leaf under anomaly detection")
        });
    }
    g.set_arena_limit(Some(0));
    g.scope(|s| {
        let v = if kind == OpKind::Reshape { s.leaf(&t.x).reshape(&[7]) } else { example(s, &t, kind) };
        v.value().expect_err("nothing fits in a zero-byte arena")
    })
}

/// The backward anomaly of `kind`'s node: backward seeded with `∞` at its output gives
/// its inputs non-finite gradients, and the node's own backward is the first to run.
fn backward_anomaly(kind: OpKind) -> Error {
    let t = Inputs::new();
    let mut g = Graph::<f64>::new();
    g.set_anomaly_detection(true);
    g.scope(|s| {
        let y = example(s, &t, kind);
        let seed = vec![f64::INFINITY; y.shape().numel()];
        s.backward_with(y, &seed).expect_err("an infinite seed")
    })
}

/// The label of `kind`'s node in the DOT export.
fn dot_has_label(kind: OpKind) -> bool {
    let t = Inputs::new();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let y = example(s, &t, kind);
        let i = y.id().index();
        s.to_dot().contains(&format!("n{i} [label=\"%{i} {}\\n", name_of(kind)))
    })
}

#[test]
fn every_kind_has_one_name_in_errors_anomalies_and_dumps() {
    let mut kinds = 0;
    for kind in OpKind::all() {
        kinds += 1;
        let e = forward_error(kind);
        assert_eq!(e.op(), name_of(kind), "forward error of {kind:?}: {e}");
        assert_eq!(e.location().map(|l| l.file()), Some(file!()), "{kind:?}: {e}");
        if is_leaf(kind) {
            continue; // no inputs, so no backward of their own
        }
        match backward_anomaly(kind) {
            Error::NonFinite { op, phase: "backward", .. } => assert_eq!(op, name_of(kind), "anomaly of {kind:?}"),
            e => panic!("{kind:?}: expected a backward anomaly, got {e}"),
        }
        assert!(dot_has_label(kind), "DOT label of {kind:?}");
    }
    // Every unary and binary function, and the structural kinds, were visited.
    assert_eq!(kinds, UnaryFn::ALL.len() + BinaryFn::ALL.len() + 33);
}

#[test]
fn names_are_distinct() {
    let names: Vec<&str> = OpKind::all().map(OpKind::name).collect();
    for (i, a) in names.iter().enumerate() {
        assert!(!names[i + 1..].contains(a), "{a} names two kinds");
    }
}

/// Runs `f` on fresh leaves; returns the line `f` reported for its call, and the scope's
/// first error.
fn first_error(f: impl for<'s, 'g> Fn(&'s Scope<'s, 'g, f64>, &'g Inputs) -> (u32, Var<'s, f64>)) -> (u32, Error) {
    let t = Inputs::new();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let (line, _) = f(s, &t);
        (line, s.check().expect_err("the composite fails"))
    })
}

#[test]
fn composites_report_their_own_name_at_the_callers_line() {
    let groups = |g| Conv2dOptions::new().groups(g);
    let dilated = |d| Conv2dOptions::new().dilation([d, d]);
    let cases: Vec<(&str, (u32, Error))> = vec![
        ("mean_axes", first_error(|s, t| (line!(), s.leaf(&t.x).mean_axes(&[0, -2], false)))),
        ("var", first_error(|s, t| (line!(), s.leaf(&t.x).var(&[5], false, 1)))),
        ("stack", first_error(|s, t| (line!(), s.stack(&[s.leaf(&t.x), s.leaf(&t.w)], 0)))),
        ("mse_loss", first_error(|s, t| (line!(), s.leaf(&t.x).mse_loss(s.leaf(&t.w))))),
        ("conv2d", first_error(|s, t| (line!(), s.leaf(&t.img).conv2d(s.zeros(&[1, 1, 0, 0]), [1, 1], [0, 0])))),
        ("conv2d_with", first_error(|s, t| (line!(), s.leaf(&t.img).conv2d_with(s.zeros(&[1, 1, 1, 1]), groups(0))))),
        ("conv2d_with", first_error(|s, t| (line!(), s.leaf(&t.img).conv2d_with(s.zeros(&[1, 1, 2, 2]), dilated(4))))),
        (
            "im2col_dilated",
            first_error(|s, t| (line!(), s.leaf(&t.img).im2col_dilated([2, 2], [1, 1], [0, 0], [0, 1]))),
        ),
        (
            "max_pool2d_dilated",
            first_error(|s, t| (line!(), s.leaf(&t.img).max_pool2d_dilated([2, 2], [1, 1], [0, 0], [4, 4]))),
        ),
        (
            "col2im_dilated",
            first_error(|s, t| {
                (line!(), s.leaf(&t.img).reshape(&[1, 4, 4]).col2im_dilated([3, 3], [2, 2], [1, 1], [0, 0], [2, 2]))
            }),
        ),
        ("squeeze", first_error(|s, t| (line!(), s.leaf(&t.x).squeeze(0)))),
        ("unsqueeze", first_error(|s, t| (line!(), s.leaf(&t.img).reshape(&[1, 1, 1, 1, 4, 4]).unsqueeze(0)))),
        ("transpose", first_error(|s, t| (line!(), s.leaf(&t.x).transpose(0, 2)))),
        ("t", first_error(|s, _| (line!(), s.scalar(1.0).t()))),
        ("max", first_error(|s, _| (line!(), s.zeros(&[0]).max()))),
        ("min", first_error(|s, _| (line!(), s.zeros(&[2, 0]).min()))),
        ("bce_with_logits", first_error(|s, t| (line!(), s.leaf(&t.x).bce_with_logits(s.leaf(&t.w))))),
    ];
    for (name, (line, e)) in cases {
        assert_eq!(e.op(), name, "{e}");
        let at = e.location().expect("a caller's location");
        assert_eq!((at.file(), at.line()), (file!(), line), "{name}: {e}");
    }
    // A composite whose inner primitive fails for lack of memory names itself too.
    let t = Inputs::new();
    let mut g = Graph::<f64>::new();
    g.set_arena_limit(Some(0));
    let (line, e) = g.scope(|s| (line!(), s.leaf(&t.x).mean().value().expect_err("no room for the sum")));
    assert_eq!((e.op(), e.location().map(|l| l.line())), ("mean", Some(line)), "{e}");
}

/// The NaN sweep over the whole op table: with every input element NaN, every kind's
/// output holds a NaN (nothing swallows it, see the NaN table in `docs/robustness.md`),
/// and backward through it runs to the end without panicking.
#[test]
fn every_kind_propagates_nan() {
    let mut t = Inputs::new();
    for v in [&mut t.x, &mut t.y, &mut t.w, &mut t.img] {
        v.data_mut().fill(f64::NAN);
    }
    let mut g = Graph::<f64>::new();
    for kind in OpKind::all().filter(|&k| !is_leaf(k)) {
        g.scope(|s| {
            let y = example(s, &t, kind);
            let value = y.value().unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert!(value.iter().any(|v| v.is_nan()), "{kind:?} swallowed NaN: {value:?}");
            let seed = vec![1.0; value.len()];
            s.backward_with(y, &seed).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        });
    }
}

/// The same sweep with `±∞` inputs: every kind records and differentiates without a panic
/// or an error (values may be finite: `tanh(∞) = 1`), and anomaly detection, when on,
/// reports the first kind that makes a non-finite value instead.
#[test]
fn every_kind_takes_infinities() {
    for inf in [f64::INFINITY, f64::NEG_INFINITY] {
        let mut t = Inputs::new();
        for v in [&mut t.x, &mut t.y, &mut t.w, &mut t.img] {
            v.data_mut().fill(inf);
        }
        let mut g = Graph::<f64>::new();
        for kind in OpKind::all().filter(|&k| !is_leaf(k)) {
            g.scope(|s| {
                let y = example(s, &t, kind);
                let n = y.value().unwrap_or_else(|e| panic!("{kind:?}: {e}")).len();
                s.backward_with(y, &vec![1.0; n]).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            });
        }
        g.set_anomaly_detection(true);
        let e = g.scope(|s| {
            let _ = s.leaf(&t.x);
            s.check().err()
        });
        assert!(matches!(e, Some(Error::NonFinite { op: "variable", .. })), "{e:?}");
    }
}
