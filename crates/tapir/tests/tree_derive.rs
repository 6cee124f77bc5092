//! `#[derive(Tree)]` (feature `derive`, which this crate's dev-dependency on itself turns
//! on): a struct generic over its leaf goes in as tensors, reaches the function as
//! handles and comes back as gradients, checked against central differences; nested
//! derived structs, tuple structs, and the position a mismatched field is named by.

use tapir::func::tree::{self, Frozen, Tree};
use tapir::{Error, Graph, Tensor, Var};

use crate::tree::{close, fd, mix, t};

#[derive(Tree, Debug)]
struct Layer<L> {
    w: L,
    b: L,
}

#[derive(Tree, Debug)]
struct Mlp<L> {
    scale: L,
    layers: Vec<Layer<L>>,
    extra: [L; 1],
}

#[derive(Tree)]
struct Pair<L>(L, L);

fn net() -> Mlp<Tensor<f64>> {
    Mlp {
        scale: t(&[0.5, -1.2, 2.0], &[3]),
        layers: vec![
            Layer { w: t(&[0.3, 0.7, -0.4, 1.1], &[2, 2]), b: t(&[1.5], &[1]) },
            Layer { w: t(&[-0.6, 0.9], &[2]), b: t(&[0.25, -0.75], &[2]) },
        ],
        extra: [t(&[0.8], &[1])],
    }
}

/// The leaves in declaration order.
fn flat(m: &Mlp<Tensor<f64>>) -> Vec<Tensor<f64>> {
    let mut v = vec![m.scale.clone()];
    for l in &m.layers {
        v.extend([l.w.clone(), l.b.clone()]);
    }
    v.push(m.extra[0].clone());
    v
}

/// The handles in the same order.
fn handles<'s>(m: &Mlp<Var<'s, f64>>) -> [Var<'s, f64>; 6] {
    [m.scale, m.layers[0].w, m.layers[0].b, m.layers[1].w, m.layers[1].b, m.extra[0]]
}

#[test]
fn a_derived_struct_gets_gradients_of_its_own_type() {
    let m = net();
    let want = fd(&flat(&m));
    let mut g = Graph::new();
    let d: Mlp<Tensor<f64>> = tree::grad(&mut g, &m, |s, m| mix(s, &handles(&m))).unwrap();
    let got = flat(&d);
    assert_eq!(got.len(), want.len());
    for (gt, w) in got.iter().zip(&want) {
        close(gt.data(), w);
    }
    assert_eq!(d.layers[0].w.shape(), m.layers[0].w.shape());
}

#[test]
fn a_tuple_struct_and_a_frozen_derived_struct() {
    let p = Pair(t(&[1.0, 2.0], &[2]), t(&[3.0], &[1]));
    let mut g = Graph::new();
    // f = Σ p.0² · Σ p.1: ∂/∂p.0 = 2 p.0 Σ p.1 = [6, 12], ∂/∂p.1 = Σ p.0² = 5.
    let d = tree::grad(&mut g, &p, |_, p| p.0.square().sum() * p.1.sum()).unwrap();
    assert_eq!((d.0.data(), d.1.data()), (&[6.0, 12.0][..], &[5.0][..]));
    let x = t(&[2.0], &[1]);
    let (dx, ()) = tree::grad(&mut g, &(&x, Frozen(&p)), |_, (x, p)| (x * p.1).sum()).unwrap();
    assert_eq!(dx.data(), &[3.0]);
}

#[test]
fn a_mismatched_field_is_named_by_its_path() {
    let m = net();
    let mut v = net();
    v.layers[1].b = t(&[0.0; 3], &[3]);
    let mut g = Graph::new();
    let e = tree::jvp(&mut g, &m, &v, |s, m| mix(s, &[m.scale, m.layers[1].b])).unwrap_err();
    let Error::Structure { position, location, .. } = &e else { panic!("{e}") };
    assert_eq!((position.as_str(), location.file()), ("input.layers[1].b", file!()), "{e}");
    assert!(e.to_string().contains("[3]") && e.to_string().contains("[2]"), "{e}");
    v.layers.pop();
    let e = tree::hvp(&mut g, &m, &v, |s, m| mix(s, &[m.scale])).unwrap_err();
    assert!(matches!(&e, Error::Structure { position, .. } if position == "input.layers"), "{e}");
    // A matching tangent: jvp along the first layer's bias only.
    let mut v = net();
    let zero = |x: &Tensor<f64>| Tensor::from_vec(vec![0.0; x.shape().numel()], &x.shape().to_vec()).unwrap();
    v.scale = zero(&m.scale);
    v.layers[0].w = zero(&m.layers[0].w);
    v.layers[1] = Layer { w: zero(&m.layers[1].w), b: zero(&m.layers[1].b) };
    v.extra = [zero(&m.extra[0])];
    v.layers[0].b = t(&[1.0], &[1]);
    let (_, jt) = tree::jvp(&mut g, &m, &v, |s, m| mix(s, &handles(&m))).unwrap();
    close(jt.data(), &fd(&flat(&m))[2]);
}
