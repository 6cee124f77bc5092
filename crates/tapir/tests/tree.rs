//! The transforms over structures of tensors (`func::tree`, issue #35 item 3): tuples,
//! arrays, `Vec`s, nested structures and a `ParamStore`, each against central finite
//! differences of the engine's forward values (f64), `Frozen` parts, the position named by
//! each structure error, and compositions. The derived struct is in `tree_derive.rs`.

use tapir::func::tree::{self, Frozen};
use tapir::{Error, Graph, ParamStore, Scope, Tensor, Var};

pub(crate) fn t(v: &[f64], dims: &[usize]) -> Tensor<f64> {
    Tensor::from_vec(v.to_vec(), dims).unwrap()
}

/// A loss that couples every input with a different weight per element, so a gradient
/// sent to the wrong input, transposed or dropped shows.
pub(crate) fn mix<'s>(s: &'s Scope<'s, '_, f64>, vs: &[Var<'s, f64>]) -> Var<'s, f64> {
    let mut l = vs[0].sum() * vs[vs.len() - 1].square().sum();
    for (k, v) in vs.iter().enumerate() {
        let w: Vec<f64> = (0..v.shape().numel()).map(|i| 0.3 + 0.7 * (i + k) as f64).collect();
        l = l + (v.sin() * s.tensor(&w, &v.shape().to_vec())).sum();
    }
    l
}

/// `mix`'s value at `xs` through the engine's forward pass only.
pub(crate) fn value(xs: &[Tensor<f64>]) -> f64 {
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let vs: Vec<Var<'_, f64>> = xs.iter().map(|x| s.input(x)).collect();
        mix(s, &vs).item()
    })
    .unwrap()
}

/// Central differences of `mix` with respect to every element of every tensor.
pub(crate) fn fd(xs: &[Tensor<f64>]) -> Vec<Vec<f64>> {
    (0..xs.len())
        .map(|k| {
            (0..xs[k].shape().numel())
                .map(|i| {
                    let h = 1e-6 * xs[k].data()[i].abs().max(1.0);
                    let at = |d: f64| {
                        let mut ys = xs.to_vec();
                        let mut data = ys[k].data().to_vec();
                        data[i] += d;
                        ys[k] = Tensor::from_vec(data, &ys[k].shape().to_vec()).unwrap();
                        value(&ys)
                    };
                    (at(h) - at(-h)) / (2.0 * h)
                })
                .collect()
        })
        .collect()
}

#[track_caller]
pub(crate) fn close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (a, n) in got.iter().zip(want) {
        assert!((a - n).abs() <= 1e-6 + 1e-4 * a.abs().max(n.abs()), "analytic {got:?} vs numeric {want:?}");
    }
}

fn three() -> [Tensor<f64>; 3] {
    [t(&[0.5, -1.2, 2.0], &[3]), t(&[0.3, 0.7, -0.4, 1.1], &[2, 2]), t(&[1.5], &[1])]
}

#[test]
fn a_tuple_gets_a_tuple_of_gradients() {
    let [a, b, c] = three();
    let want = fd(&[a.clone(), b.clone(), c.clone()]);
    let mut g = Graph::new();
    let (y, (da, db, dc)) = tree::value_and_grad(&mut g, &(&a, &b, &c), |s, (a, b, c)| mix(s, &[a, b, c])).unwrap();
    assert!((y - value(&[a.clone(), b.clone(), c.clone()])).abs() < 1e-12);
    assert_eq!((da.shape(), db.shape(), dc.shape()), (a.shape(), b.shape(), c.shape()));
    close(da.data(), &want[0]);
    close(db.data(), &want[1]);
    close(dc.data(), &want[2]);
    // Owned tuples and the four-element tuple take the same path.
    let d = t(&[-0.8, 0.2], &[2]);
    let want = fd(&[a.clone(), b.clone(), c.clone(), d.clone()]);
    let x = (a, b, c, d);
    let (_, _, _, dd) = tree::grad(&mut g, &x, |s, (a, b, c, d)| mix(s, &[a, b, c, d])).unwrap();
    close(dd.data(), &want[3]);
}

#[test]
fn arrays_vecs_and_nesting_keep_their_structure() {
    let [a, b, c] = three();
    let want = fd(&[a.clone(), b.clone(), c.clone()]);
    let mut g = Graph::new();
    let [da, db, dc] = tree::grad(&mut g, &[&a, &b, &c], |s, [a, b, c]| mix(s, &[a, b, c])).unwrap();
    close(da.data(), &want[0]);
    close(db.data(), &want[1]);
    close(dc.data(), &want[2]);
    let v = vec![a.clone(), b.clone(), c.clone()];
    let dv = tree::grad(&mut g, &v, |s, v| mix(s, &v)).unwrap();
    assert_eq!(dv.len(), 3);
    for (d, w) in dv.iter().zip(&want) {
        close(d.data(), w);
    }
    // (Tensor, Vec<[Tensor; 1]>): the nested positions come back nested.
    let x = (a.clone(), vec![[b.clone()], [c.clone()]]);
    let (da, rest) = tree::grad(&mut g, &x, |s, (a, rest)| mix(s, &[a, rest[0][0], rest[1][0]])).unwrap();
    close(da.data(), &want[0]);
    close(rest[0][0].data(), &want[1]);
    close(rest[1][0].data(), &want[2]);
    // An empty Vec is a structure with no leaves.
    let empty: Vec<Tensor<f64>> = Vec::new();
    let (da, de) = tree::grad(&mut g, &(&a, &empty), |_, (a, _)| a.square().sum()).unwrap();
    assert!(de.is_empty());
    close(da.data(), &[1.0, -2.4, 4.0]); // 2a
}

#[test]
fn a_param_store_gets_a_grad_buffer_equal_to_backward_into_and_differences() {
    let [a, b, c] = three();
    let want = fd(&[a.clone(), b.clone(), c.clone()]);
    let mut store = ParamStore::<f64>::new();
    let ids = [store.add("a", a).unwrap(), store.add("b", b).unwrap(), store.add("c", c).unwrap()];
    let mut g = Graph::new();
    let grads = tree::grad(&mut g, &store, |s, p| mix(s, &[p.get(ids[0]), p.get(ids[1]), p.get(ids[2])])).unwrap();
    assert_eq!(grads.store(), store.id());
    let mut into = store.zeros_like().unwrap();
    g.scope(|s| {
        let vs: Vec<Var<'_, f64>> = ids.iter().map(|&id| s.param(&store, id)).collect();
        s.backward_into(mix(s, &vs), &mut into)
    })
    .unwrap();
    for (k, &id) in ids.iter().enumerate() {
        close(grads.get(id).unwrap().data(), &want[k]);
        assert_eq!(grads.get(id).unwrap().data(), into.get(id).unwrap().data());
    }
    // The view in store order, and an id of another store poisons the scope.
    let other = {
        let mut o = ParamStore::<f64>::new();
        o.add("x", t(&[1.0], &[1])).unwrap()
    };
    let e = tree::grad(&mut g, &store, |_, p| {
        assert_eq!((p.len(), p.store()), (3, store.id()));
        p.as_slice()[0].sum() + p.get(other).sum()
    })
    .unwrap_err();
    assert!(matches!(e, Error::WrongStore { op: "ParamVars::get", .. }), "{e}");
}

#[test]
fn frozen_parts_are_constants_with_no_gradient() {
    let [a, b, c] = three();
    let want = fd(&[a.clone(), b.clone(), c.clone()]);
    let mut g = Graph::new();
    let (da, (), dc) = tree::grad(&mut g, &(&a, Frozen(&b), &c), |s, (a, b, c)| mix(s, &[a, b, c])).unwrap();
    close(da.data(), &want[0]);
    close(dc.data(), &want[2]);
    // Inside a Vec, and everything frozen: a function of constants has a `()` gradient.
    let v = vec![Frozen(a.clone()), Frozen(b.clone())];
    let dv = tree::grad(&mut g, &v, |_, v| v[0].sum() * v[1].sum()).unwrap();
    assert_eq!(dv, vec![(), ()]);
    // jvp with a frozen part takes `()` as its tangent: only `a` moves.
    let ta = t(&[1.0, 0.0, -1.0], &[3]);
    let (_, jt) =
        tree::jvp(&mut g, &(&a, Frozen(&b), &c), &(ta.clone(), (), t(&[0.0], &[1])), |s, (a, b, c)| mix(s, &[a, b, c]))
            .unwrap();
    let dir: f64 = want[0].iter().zip(ta.data()).map(|(g, t)| g * t).sum();
    close(jt.data(), &[dir]);
}

#[test]
fn vjp_and_jvp_over_a_tuple_match_the_gradient_directions() {
    let [a, b, c] = three();
    let want = fd(&[a.clone(), b.clone(), c.clone()]);
    let mut g = Graph::new();
    // vjp of a one-element output with v = 2 is twice the gradient.
    let v = t(&[2.0], &[]);
    let (y, (va, vb, vc)) = tree::vjp(&mut g, &(&a, &b, &c), &v, |s, (a, b, c)| mix(s, &[a, b, c])).unwrap();
    assert_eq!(y.shape().rank(), 0);
    let twice = |w: &[f64]| w.iter().map(|x| 2.0 * x).collect::<Vec<_>>();
    close(va.data(), &twice(&want[0]));
    close(vb.data(), &twice(&want[1]));
    close(vc.data(), &twice(&want[2]));
    // jvp: Σₖ ⟨∇ₖ f, tₖ⟩.
    let ts = (t(&[0.1, 0.2, 0.3], &[3]), t(&[-1.0, 0.5, 0.0, 2.0], &[2, 2]), t(&[0.7], &[1]));
    let (_, jt) = tree::jvp(&mut g, &(&a, &b, &c), &ts, |s, (a, b, c)| mix(s, &[a, b, c])).unwrap();
    let dot = |w: &[f64], t: &Tensor<f64>| w.iter().zip(t.data()).map(|(a, b)| a * b).sum::<f64>();
    close(jt.data(), &[dot(&want[0], &ts.0) + dot(&want[1], &ts.1) + dot(&want[2], &ts.2)]);
}

/// `f(a, b) = Σ a² · Σ b³`: its gradient in closed form, for the second-order tests.
fn grad_closed(a: &[f64], b: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let (sa, sb): (f64, f64) = (a.iter().map(|x| x * x).sum(), b.iter().map(|x| x.powi(3)).sum());
    (a.iter().map(|x| 2.0 * x * sb).collect(), b.iter().map(|x| 3.0 * x * x * sa).collect())
}

fn cubic<'s>(a: Var<'s, f64>, b: Var<'s, f64>) -> Var<'s, f64> {
    a.square().sum() * b.powf(3.0).sum()
}

/// Central differences of the closed-form gradient along `(va, vb)`: the Hessian times it.
fn hv_by_differences(a: &[f64], b: &[f64], va: &[f64], vb: &[f64]) -> (Vec<f64>, Vec<f64>) {
    let h = 1e-5;
    let shift = |x: &[f64], v: &[f64], d: f64| x.iter().zip(v).map(|(x, v)| x + d * v).collect::<Vec<_>>();
    let (pa, pb) = grad_closed(&shift(a, va, h), &shift(b, vb, h));
    let (ma, mb) = grad_closed(&shift(a, va, -h), &shift(b, vb, -h));
    let diff = |p: Vec<f64>, m: Vec<f64>| p.iter().zip(&m).map(|(p, m)| (p - m) / (2.0 * h)).collect();
    (diff(pa, ma), diff(pb, mb))
}

#[test]
fn hvp_over_a_tuple_includes_the_cross_blocks() {
    let (a, b) = (t(&[0.5, -1.5], &[2]), t(&[1.2, 0.4, -0.3], &[3]));
    let (va, vb) = (t(&[1.0, 2.0], &[2]), t(&[-0.5, 0.0, 1.0], &[3]));
    let mut g = Graph::new();
    let (ha, hb) = tree::hvp(&mut g, &(&a, &b), &(va.clone(), vb.clone()), |_, (a, b)| cubic(a, b)).unwrap();
    let (wa, wb) = hv_by_differences(a.data(), b.data(), va.data(), vb.data());
    close(ha.data(), &wa);
    close(hb.data(), &wb);
    // Freezing b leaves the a-block only: H_aa · va.
    let (ha, ()) = tree::hvp(&mut g, &(&a, Frozen(&b)), &(va.clone(), ()), |_, (a, b)| cubic(a, b)).unwrap();
    let (wa, _) = hv_by_differences(a.data(), b.data(), va.data(), &[0.0; 3]);
    close(ha.data(), &wa);
}

#[test]
fn jvp_of_a_gradient_over_a_tuple_is_forward_over_reverse() {
    // g(a, b) = ⟨∇f(a, b), (ca, cb)⟩ recorded in the function; its jvp along (va, vb) is
    // (ca, cb)ᵀ H (va, vb), i.e. ⟨(ca, cb), H v⟩.
    let (a, b) = (t(&[0.5, -1.5], &[2]), t(&[1.2, 0.4, -0.3], &[3]));
    let (va, vb) = (t(&[1.0, 2.0], &[2]), t(&[-0.5, 0.0, 1.0], &[3]));
    let (ca, cb) = (t(&[0.3, -0.2], &[2]), t(&[1.0, 0.5, 2.0], &[3]));
    let mut g = Graph::new();
    let (_, jt) = tree::jvp(&mut g, &(&a, &b), &(va.clone(), vb.clone()), |s: &Scope<'_, '_, f64>, (a, b)| {
        let [ga, gb] = s.grad(cubic(a, b), [a, b]).unwrap_or([s.scalar(f64::NAN); 2]);
        (ga * s.input(&ca)).sum() + (gb * s.input(&cb)).sum()
    })
    .unwrap();
    let (wa, wb) = hv_by_differences(a.data(), b.data(), va.data(), vb.data());
    let want: f64 = wa.iter().zip(ca.data()).chain(wb.iter().zip(cb.data())).map(|(h, c)| h * c).sum();
    close(jt.data(), &[want]);
}

/// The message names the transform, the position, both sides and this file.
#[track_caller]
fn names(e: &Error, op: &str, position: &str, parts: &[&str]) {
    let Error::Structure { op: o, position: p, location, .. } = e else { panic!("not a structure error: {e}") };
    assert_eq!((*o, p.as_str()), (op, position), "{e}");
    assert_eq!(location.file(), file!(), "{e}");
    let msg = e.to_string();
    assert!(msg.starts_with(&format!("{op}: at {position}, ")), "{msg}");
    for part in parts {
        assert!(msg.contains(part), "{msg} lacks {part}");
    }
}

#[test]
fn each_mismatched_tangent_is_an_error_naming_its_position() {
    let [a, b, c] = three();
    let mut g = Graph::new();
    // A shape inside a tuple.
    let ts = (t(&[0.0; 3], &[3]), t(&[0.0; 4], &[4]), t(&[0.0], &[1]));
    let e = tree::jvp(&mut g, &(&a, &b, &c), &ts, |s, (a, b, c)| mix(s, &[a, b, c])).unwrap_err();
    names(&e, "jvp", "input.1", &["[4]", "[2, 2]"]);
    assert_eq!(e.location().unwrap().line(), line!() - 2);
    // A Vec's length, then a shape inside it.
    let v = (a.clone(), vec![b.clone(), c.clone()]);
    let short = (t(&[0.0; 3], &[3]), vec![t(&[0.0; 4], &[2, 2])]);
    let e = tree::hvp(&mut g, &v, &short, |s, (a, v)| mix(s, &[a, v[0], v[1]])).unwrap_err();
    names(&e, "hvp", "input.1", &["1 elements", "has 2"]);
    let bad = (t(&[0.0; 3], &[3]), vec![t(&[0.0; 4], &[2, 2]), t(&[0.0; 2], &[2])]);
    let e = tree::hvp(&mut g, &v, &bad, |s, (a, v)| mix(s, &[a, v[0], v[1]])).unwrap_err();
    names(&e, "hvp", "input.1[1]", &["[2]", "[1]"]);
    // An array inside a Frozen-free tuple.
    let arr = [a.clone(), c.clone()];
    let e =
        tree::jvp(&mut g, &arr, &[t(&[0.0; 3], &[3]), t(&[0.0; 3], &[3])], |s, [a, c]| mix(s, &[a, c])).unwrap_err();
    names(&e, "jvp", "input[1]", &["[3]", "[1]"]);
}

#[test]
fn a_grad_buffer_of_another_store_or_shape_is_an_error_naming_its_position() {
    let [a, b, _] = three();
    let mut store = ParamStore::<f64>::new();
    let ia = store.add("layer1.w", a.clone()).unwrap();
    store.add("layer1.b", b.clone()).unwrap();
    fn f<'s>(s: &'s Scope<'s, '_, f64>, p: tree::ParamVars<Var<'s, f64>>) -> Var<'s, f64> {
        mix(s, p.as_slice())
    }
    let mut g = Graph::new();
    let mut other = ParamStore::<f64>::new();
    other.add("layer1.w", a.clone()).unwrap();
    other.add("layer1.b", b.clone()).unwrap();
    let foreign = other.zeros_like().unwrap();
    let e = tree::hvp(&mut g, &store, &foreign, f).unwrap_err();
    names(&e, "hvp", "input", &[&format!("store #{}", other.id()), &format!("store #{}", store.id())]);
    // The same store with a parameter added since the buffer was made.
    let stale = store.zeros_like().unwrap();
    store.add("layer2.w", t(&[1.0], &[1])).unwrap();
    let e = tree::jvp(&mut g, &store, &stale, f).unwrap_err();
    names(&e, "jvp", "input", &["2 parameters", "store 3"]);
    // Inside a tuple, the parameter's name is the position; the right buffer works.
    let (v, grads) = (store.zeros_like().unwrap(), store.zeros_like().unwrap());
    let (_, jt) = tree::jvp(&mut g, &(&a, &store), &(a.clone(), v), |s, (x, p)| mix(s, &[x, p.get(ia)])).unwrap();
    assert_eq!(jt.shape().rank(), 0);
    let _ = grads;
    let e = tree::jvp(&mut g, &(&a, &store), &(a.clone(), other.zeros_like().unwrap()), |s, (x, p)| {
        mix(s, &[x, p.get(ia)])
    })
    .unwrap_err();
    names(&e, "jvp", "input.1", &["gradient buffer"]);
}

#[test]
fn a_scope_error_in_the_function_comes_out_and_nothing_panics() {
    let [a, b, _] = three();
    let mut g = Graph::new();
    // Mismatched shapes inside f: the op's error, with this line.
    let e = tree::grad(&mut g, &(&a, &b), |_, (a, b)| (a + b).sum()).unwrap_err();
    assert!(matches!(e, Error::Broadcast { .. }), "{e}");
    // A non-scalar f.
    let e = tree::value_and_grad(&mut g, &(&a, &b), |_, (a, _)| a * 2.0).unwrap_err();
    assert!(matches!(e, Error::NotScalar { op: "value_and_grad", .. }), "{e}");
    let e = tree::vjp(&mut g, &(&a, &b), &t(&[1.0], &[1]), |_, (a, _)| a * 2.0).unwrap_err();
    assert!(matches!(e, Error::ShapeMismatch { op: "vjp", .. }), "{e}");
}
