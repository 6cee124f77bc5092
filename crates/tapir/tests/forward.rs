//! Forward mode (`Scope::forward`, `dual`, `tangent`, `jvp`): every op kind's tangent
//! against finite differences and reverse mode, the compositions with reverse mode and
//! with itself against closed forms, and what carries no tangent.

use tapir::testing::{jvpcheck, GradcheckOptions};
use tapir::{func, BinaryFn, CustomError, CustomInputs, CustomOp, Error, Graph, OpKind, Shape, Tensor, UnaryFn, Var};

use crate::second_order::{example, inputs, is_leaf};

#[test]
fn every_kind_has_a_forward_rule_that_matches_differences_and_reverse_mode() {
    let mut kinds = 0;
    for kind in OpKind::all().filter(|&k| !is_leaf(k)) {
        kinds += 1;
        for seed in [7, 8] {
            let opts = GradcheckOptions { seed, ..GradcheckOptions::default() };
            jvpcheck(&inputs(), opts, |s, v| example(s, v, kind)).unwrap_or_else(|e| panic!("{kind:?}: {e}"));
        }
    }
    assert_eq!(kinds, UnaryFn::ALL.len() + BinaryFn::ALL.len() + 30);
}

fn t(v: &[f64], dims: &[usize]) -> Tensor<f64> {
    Tensor::from_vec(v.to_vec(), dims).unwrap()
}

#[test]
fn forward_over_forward_is_the_second_directional_derivative() {
    // f = Σ x³: ∂²f[u, v] = Σ 6x·u·v.
    let (x, u, v) = (t(&[0.5, -1.5, 2.0], &[3]), t(&[1.0, 2.0, -1.0], &[3]), t(&[0.5, 1.0, 3.0], &[3]));
    let mut g = Graph::<f64>::new();
    let got = g.scope(|s| {
        let (_, outer) = s.jvp([s.leaf(&x)], [s.input(&u)], |[x]| {
            let (_, inner) = s.jvp([x], [s.input(&v)], |[x]| x.powf(3.0).sum());
            inner
        });
        outer.item()
    });
    let want: f64 = (0..3).map(|i| 6.0 * x.data()[i] * u.data()[i] * v.data()[i]).sum();
    let got = got.unwrap();
    assert!((got - want).abs() < 1e-12, "{got} vs {want}");
}

#[test]
fn forward_over_reverse_and_reverse_over_forward_are_the_hessian_vector_product() {
    let (x, v) = (t(&[0.3, -0.7, 1.1, 0.4], &[4]), t(&[1.0, -2.0, 0.5, 0.25], &[4]));
    fn f<'s>(x: Var<'s, f64>) -> Var<'s, f64> {
        (x.sin() * x.square()).sum() + x.exp().sum().log()
    }
    let mut g = Graph::<f64>::new();
    let want = func::hvp(&mut g, &x, &v, |_, x| f(x)).unwrap();
    let (fwd_rev, rev_fwd) = g
        .scope(|s| {
            // jvp ∘ grad: the gradient recorded inside the level carries tangents.
            let (_, hv) = s.jvp([s.leaf(&x)], [s.input(&v)], |[x]| {
                let [g] = s.grad(f(x), [x]).unwrap();
                g
            });
            // grad ∘ jvp: the tangent ⟨∇f, v⟩ differentiated in reverse.
            let xl = s.leaf(&x);
            let (_, jv) = s.jvp([xl], [s.input(&v)], |[x]| f(x));
            let [hv2] = s.grad(jv, [xl])?;
            Ok::<_, Error>((hv.value()?.to_vec(), hv2.value()?.to_vec()))
        })
        .unwrap();
    for i in 0..4 {
        assert!((fwd_rev[i] - want.data()[i]).abs() < 1e-12, "{i}: {} vs {}", fwd_rev[i], want.data()[i]);
        assert!((rev_fwd[i] - want.data()[i]).abs() < 1e-12, "{i}: {} vs {}", rev_fwd[i], want.data()[i]);
    }
}

#[test]
fn no_grad_detach_and_constants_carry_no_tangent() {
    let (x, v) = (t(&[0.3, -0.7], &[2]), t(&[1.0, 1.0], &[2]));
    let mut g = Graph::<f64>::new();
    let got = g.scope(|s| {
        s.forward(|level| {
            let x = s.dual(level, s.leaf(&x), s.input(&v));
            let in_no_grad = s.no_grad(|| x.exp());
            let detached = x.detach().exp();
            let mut rng = <rand::rngs::StdRng as rand::SeedableRng>::seed_from_u64(1);
            let drawn = s.randn(&[2], &mut rng) * x.detach();
            let kept = x.exp();
            let read = |y| s.tangent(level, y).value().map(|v| v.to_vec());
            Ok::<_, Error>((read(in_no_grad)?, read(detached)?, read(drawn)?, read(kept)?))
        })
    });
    let (a, b, c, d) = got.unwrap();
    assert_eq!((a, b, c), (vec![0.0; 2], vec![0.0; 2], vec![0.0; 2]));
    assert!((d[0] - 0.3f64.exp()).abs() < 1e-15 && (d[1] - (-0.7f64).exp()).abs() < 1e-15);
}

#[test]
fn a_closed_level_and_a_mismatched_tangent_are_errors_at_the_caller() {
    let (x, v) = (t(&[0.3, -0.7], &[2]), t(&[1.0, 1.0, 1.0], &[3]));
    let mut g = Graph::<f64>::new();
    let e = g.scope(|s| {
        let x = s.leaf(&x);
        s.forward(|level| s.dual(level, x, s.input(&v)));
        s.check()
    });
    let line = line!() - 3;
    let e = e.unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { op: "dual", .. }), "{e}");
    assert_eq!(e.to_string(), format!("dual: shapes [2] and [3] must be equal (at {}:{line}:29)", file!()));
    let one = t(&[1.0], &[1]);
    let e = g.scope(|s| {
        let x = s.leaf(&one);
        let level = s.forward(|level| level);
        s.tangent(level, x);
        s.check()
    });
    let line = line!() - 3;
    let e = e.unwrap_err();
    assert!(matches!(e, Error::InvalidArgument { op: "tangent", .. }), "{e}");
    assert_eq!(e.location().map(|l| (l.file(), l.line())), Some((file!(), line)));
}

/// `y = 3x`, whose forward rule (when `rule` is set) returns a tangent of `shape`.
struct Triple {
    rule: Option<&'static [usize]>,
}

impl CustomOp<f64> for Triple {
    fn name(&self) -> &'static str {
        "triple"
    }
    fn output_shape(&self, inputs: &[Shape]) -> Result<Shape, CustomError> {
        Ok(inputs[0])
    }
    fn forward(&self, x: CustomInputs<'_, f64>, out: &mut [f64], _: &mut [f64]) -> Result<(), CustomError> {
        out.iter_mut().zip(x.value(0)).for_each(|(y, &x)| *y = 3.0 * x);
        Ok(())
    }
    fn backward(
        &self,
        _: CustomInputs<'_, f64>,
        _: &[f64],
        _: &[f64],
        _: &[f64],
        _: &mut [Option<&mut [f64]>],
    ) -> Result<(), CustomError> {
        Ok(())
    }
    fn jvp<'s>(
        &self,
        _: &[Var<'s, f64>],
        out: Var<'s, f64>,
        tangents: &[Option<Var<'s, f64>>],
        tangent: &mut Option<Var<'s, f64>>,
    ) -> bool {
        let Some(shape) = self.rule else { return false };
        *tangent = tangents[0].map(|t| (t * 3.0).sum().broadcast_to(shape) + out.detach().sum() * 0.0);
        true
    }
}

#[test]
fn custom_ops_without_a_rule_or_with_a_wrong_tangent_are_named() {
    let (x, v) = (t(&[0.3, -0.7], &[2]), t(&[1.0, 1.0], &[2]));
    let mut g = Graph::<f64>::new();
    let run = |g: &mut Graph<f64>, op: &'static Triple| {
        g.scope(|s| {
            let (y, t) = s.jvp([s.leaf(&x)], [s.input(&v)], |[x]| s.custom(op, &[x]));
            y.value()?;
            t.value().map(|t| t.to_vec())
        })
    };
    let line = line!() - 5;
    let e = run(&mut g, &Triple { rule: None }).unwrap_err();
    assert_eq!(
        e.to_string(),
        format!(
            "jvp: a tangent (forward mode) through custom op `triple` (input shapes [2]) needs CustomOp::jvp, \
             which the op does not provide (op recorded at {}:{line}:69)",
            file!()
        )
    );
    assert!(matches!(e, Error::ForwardUnsupported { custom: "triple", .. }));
    let e = run(&mut g, &Triple { rule: Some(&[3]) }).unwrap_err();
    assert!(matches!(e, Error::CustomOp { op: "triple", phase: "jvp", .. }), "{e}");
    assert!(e.to_string().contains("returned a tangent of shape [3] for an output of shape [2]"), "{e}");
    assert_eq!(run(&mut g, &Triple { rule: Some(&[2]) }).unwrap(), [6.0, 6.0]); // 3·Σt broadcast
}

#[test]
fn a_scope_without_a_level_records_exactly_what_it_did() {
    // Forward mode costs nothing unless a level is open: the same program records the
    // same nodes with and without a closed level before it.
    let x = t(&[0.3, -0.7], &[2]);
    let mut g = Graph::<f64>::new();
    let count = |g: &mut Graph<f64>, open_first: bool| {
        g.scope(|s| {
            if open_first {
                s.forward(|_| ());
            }
            let before = s.dump().lines().count();
            let y = s.leaf(&x).tanh().exp().sum();
            y.value().unwrap();
            s.dump().lines().count() - before
        })
    };
    assert_eq!(count(&mut g, false), count(&mut g, true));
}

#[test]
fn grouped_dilated_convolution_and_dilated_pooling_have_exact_tangents() {
    use tapir::Conv2dOptions;
    let x: Vec<f64> = (0..2 * 4 * 5 * 6).map(|i| ((i * 37) % 23) as f64 / 23.0 - 0.4).collect();
    let w: Vec<f64> = (0..6 * 2 * 2 * 3).map(|i| ((i * 11) % 13) as f64 / 13.0 - 0.5).collect();
    let inputs = [t(&x, &[2, 4, 5, 6]), t(&w, &[6, 2, 2, 3])];
    let opts = GradcheckOptions { seed: 3, ..GradcheckOptions::default() };
    let conv = Conv2dOptions::new().stride([1, 2]).padding([1, 1]).dilation([2, 1]).groups(2);
    jvpcheck(&inputs, opts, |_, v| v[0].conv2d_with(v[1], conv).tanh()).unwrap();
    let depthwise = Conv2dOptions::new().dilation([1, 2]).groups(4);
    jvpcheck(&inputs[..1], opts, |s, v| v[0].conv2d_with(s.tensor(&w[..4 * 2 * 3], &[4, 1, 2, 3]), depthwise)).unwrap();
    jvpcheck(&inputs[..1], opts, |_, v| v[0].square().max_pool2d_dilated([2, 2], [1, 2], [1, 1], [2, 1])).unwrap();
}

#[test]
fn jacfwd_of_grad_is_the_hessian() {
    // Forward over reverse, one tangent per input element: column j of H is jvp(∇f, e_j).
    fn f<'s>(x: Var<'s, f64>) -> Var<'s, f64> {
        (x.sin() * x.square()).sum() + x.exp().sum().log()
    }
    let x = t(&[0.3, -0.7, 1.1], &[3]);
    let mut g = Graph::<f64>::new();
    let want = func::hessian(&mut g, &x, |_, x| f(x)).unwrap();
    let got = g
        .scope(|s| {
            let mut h = vec![0.0; 9];
            for j in 0..3 {
                let mut e = [0.0; 3];
                e[j] = 1.0;
                let (_, column) = s.jvp([s.leaf(&x)], [s.tensor(&e, &[3])], |[x]| {
                    let [g] = s.grad(f(x), [x]).unwrap();
                    g
                });
                for (i, v) in column.value()?.iter().enumerate() {
                    h[i * 3 + j] = *v;
                }
            }
            Ok::<_, Error>(h)
        })
        .unwrap();
    for (a, b) in got.iter().zip(want.data()) {
        assert!((a - b).abs() < 1e-12, "{a} vs {b}");
    }
}
