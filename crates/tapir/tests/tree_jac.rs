//! `func::tree::{jacobian, jacfwd, hessian}` on a tuple of two tensors of different
//! shapes: against closed forms, against the one-tensor `func::jacobian`, `func::jacfwd`
//! and `func::hessian` of the same function on the concatenated input (a different code
//! path: one leaf, narrowed), reverse against forward, a `Frozen` part and the errors.

use tapir::func::{self, tree, tree::Frozen};
use tapir::{Error, Graph, Tensor, Var};

use super::tree::{close, t};

/// `a ⊗ b`, of shape `[a, b]`.
fn outer<'s>(a: Var<'s, f64>, b: Var<'s, f64>) -> Var<'s, f64> {
    let (m, n) = (a.shape().numel(), b.shape().numel());
    a.reshape(&[m, 1]) * b.reshape(&[1, n])
}

/// A nonlinear function of shape `[2, 3]` coupling both inputs.
fn wavy<'s>(a: Var<'s, f64>, b: Var<'s, f64>) -> Var<'s, f64> {
    outer(a, b).sin() * b.square().sum() + outer(a.exp(), b)
}

/// A nonlinear one-element function coupling both inputs.
fn bowl<'s>(a: Var<'s, f64>, b: Var<'s, f64>) -> Var<'s, f64> {
    a.powf(3.0).sum() * b.sum() + (outer(a, b).sin() * b.sum()).sum()
}

/// The columns `[from, from + len)` of the last axis of `j`, whose rows are `rows`.
fn columns(j: &Tensor<f64>, from: usize, len: usize) -> Vec<f64> {
    let n = *j.shape().dims().last().unwrap() as usize;
    j.data().chunks(n).flat_map(|row| row[from..from + len].to_vec()).collect()
}

/// `wavy` of the concatenation `z = (a, b)`.
fn on_z(z: Var<'_, f64>) -> Var<'_, f64> {
    wavy(z.narrow(0, 0, 2), z.narrow(0, 2, 3))
}

/// `wavy(a ⊙ c, b)`.
fn scaled<'s>(a: Var<'s, f64>, b: Var<'s, f64>, c: Var<'s, f64>) -> Var<'s, f64> {
    wavy(a * c, b)
}

fn inputs() -> (Tensor<f64>, Tensor<f64>, Tensor<f64>) {
    let (a, b) = (vec![0.3, -1.2], vec![0.7, 1.5, -0.4]);
    let z = t(&[a.clone(), b.clone()].concat(), &[5]);
    (t(&a, &[2]), t(&b, &[3]), z)
}

#[test]
fn the_jacobians_of_an_outer_product_are_its_closed_forms() {
    let (a, b, _) = inputs();
    let (av, bv) = (a.data(), b.data());
    // ∂(a⊗b)ᵢⱼ/∂aₖ = δᵢₖ bⱼ, ∂(a⊗b)ᵢⱼ/∂bₗ = aᵢ δⱼₗ
    let mut ja = vec![];
    let mut jb = vec![];
    for (i, &ai) in av.iter().enumerate() {
        for (j, &bj) in bv.iter().enumerate() {
            ja.extend((0..2).map(|k| if k == i { bj } else { 0.0 }));
            jb.extend((0..3).map(|l| if l == j { ai } else { 0.0 }));
        }
    }
    let mut g = Graph::new();
    for jac in [
        tree::jacobian(&mut g, &(&a, &b), |_, (a, b)| outer(a, b)).unwrap(),
        tree::jacfwd(&mut g, &(&a, &b), |_, (a, b)| outer(a, b)).unwrap(),
    ] {
        assert_eq!(jac.len(), 2);
        assert_eq!((jac[0].shape().dims(), jac[1].shape().dims()), (&[2, 3, 2][..], &[2, 3, 3][..]));
        assert_eq!((jac[0].data(), jac[1].data()), (&ja[..], &jb[..]));
    }
}

#[test]
fn the_jacobians_match_the_one_tensor_transforms_on_the_concatenation() {
    let (a, b, z) = inputs();
    let mut g = Graph::new();
    let rev = func::jacobian(&mut g, &z, |_, z| on_z(z)).unwrap();
    let fwd = func::jacfwd(&mut g, &z, |_, z| on_z(z)).unwrap();
    assert_eq!(rev.shape().dims(), &[2, 3, 5]);
    let by_rev = tree::jacobian(&mut g, &(&a, &b), |_, (a, b)| wavy(a, b)).unwrap();
    let by_fwd = tree::jacfwd(&mut g, &(&a, &b), |_, (a, b)| wavy(a, b)).unwrap();
    for (jac, one) in [(&by_rev, &rev), (&by_fwd, &fwd)] {
        assert_eq!((jac[0].shape().dims(), jac[1].shape().dims()), (&[2, 3, 2][..], &[2, 3, 3][..]));
        close(jac[0].data(), &columns(one, 0, 2));
        close(jac[1].data(), &columns(one, 2, 3));
    }
    // Reverse against forward: two methods, one answer.
    close(by_rev[0].data(), by_fwd[0].data());
    close(by_rev[1].data(), by_fwd[1].data());
}

#[test]
fn the_hessian_blocks_are_the_closed_forms_and_the_one_tensor_hessian() {
    let (a, b, z) = inputs();
    let (av, bv) = (a.data(), b.data());
    let mut g = Graph::new();
    // f = Σa³ + Σa · Σb²: H_aa = diag(6a), H_ab = [2bₗ]ₖₗ, H_ba its transpose, H_bb = 2Σa I
    let h = tree::hessian(&mut g, &(&a, &b), |_, (a, b)| a.powf(3.0).sum() + a.sum() * b.square().sum()).unwrap();
    let sa: f64 = av.iter().sum();
    let haa: Vec<f64> = (0..4).map(|i| if i % 3 == 0 { 6.0 * av[i / 2] } else { 0.0 }).collect();
    let hab: Vec<f64> = (0..6).map(|i| 2.0 * bv[i % 3]).collect();
    let hba: Vec<f64> = (0..6).map(|i| 2.0 * bv[i / 2]).collect();
    let hbb: Vec<f64> = (0..9).map(|i| if i % 4 == 0 { 2.0 * sa } else { 0.0 }).collect();
    let dims: Vec<Vec<Vec<u32>>> = h.iter().map(|r| r.iter().map(|h| h.shape().dims().to_vec()).collect()).collect();
    assert_eq!(dims, [[[2, 2], [2, 3]], [[3, 2], [3, 3]]]);
    close(h[0][0].data(), &haa);
    close(h[0][1].data(), &hab);
    close(h[1][0].data(), &hba);
    close(h[1][1].data(), &hbb);

    // A nonlinear f against the one-tensor Hessian of the concatenation, block by block.
    let one = func::hessian(&mut g, &z, |_, z| bowl(z.narrow(0, 0, 2), z.narrow(0, 2, 3))).unwrap();
    let h = tree::hessian(&mut g, &(&a, &b), |_, (a, b)| bowl(a, b)).unwrap();
    let rows = |from: usize, len: usize| -> Vec<f64> { one.data()[from * 5..(from + len) * 5].to_vec() };
    let block = |r: (usize, usize), c: (usize, usize)| columns(&t(&rows(r.0, r.1), &[r.1, 5]), c.0, c.1);
    close(h[0][0].data(), &block((0, 2), (0, 2)));
    close(h[0][1].data(), &block((0, 2), (2, 3)));
    close(h[1][0].data(), &block((2, 3), (0, 2)));
    close(h[1][1].data(), &block((2, 3), (2, 3)));
}

#[test]
fn a_frozen_part_has_no_block() {
    let (a, b, _) = inputs();
    let c = t(&[2.0, -0.5], &[2]);
    let mut g = Graph::new();
    // The reference closes over `c` as a constant instead of freezing it.
    let want = tree::jacobian(&mut g, &(&a, &b), |s, (a, b)| scaled(a, b, s.input(&c))).unwrap();
    let rev = tree::jacobian(&mut g, &(&a, Frozen(&c), &b), |_, (a, c, b)| scaled(a, b, c)).unwrap();
    let fwd = tree::jacfwd(&mut g, &(Frozen(&c), &a, &b), |_, (c, a, b)| scaled(a, b, c)).unwrap();
    for jac in [&rev, &fwd] {
        assert_eq!(jac.len(), 2);
        close(jac[0].data(), want[0].data());
        close(jac[1].data(), want[1].data());
    }
    let h = tree::hessian(&mut g, &(&a, Frozen(&c), &b), |_, (a, c, b)| bowl(a * c, b)).unwrap();
    let hw = tree::hessian(&mut g, &(&a, &b), |s, (a, b)| bowl(a * s.input(&c), b)).unwrap();
    assert_eq!((h.len(), h[0].len(), h[1].len()), (2, 2, 2));
    for (r, rw) in h.iter().zip(&hw) {
        for (x, w) in r.iter().zip(rw) {
            assert_eq!(x.shape(), w.shape());
            close(x.data(), w.data());
        }
    }
    // Everything frozen: no blocks.
    let none = tree::jacobian(&mut g, &(Frozen(&a),), |_, (a,)| a.square()).unwrap();
    assert!(none.is_empty());
}

#[test]
fn the_errors_name_the_transform_and_the_caller() {
    let (a, b, _) = inputs();
    let mut g = Graph::new();
    let e = tree::hessian(&mut g, &(&a, &b), |_, (a, b)| a * b.sum()).unwrap_err();
    assert!(matches!(e, Error::NotScalar { op: "hessian", .. }), "{e}");
    assert_eq!(e.location().unwrap().line(), line!() - 2);
    // A leaf of the largest rank and an output of rank one make a block of too many ranks.
    let deep = t(&[1.0], &[1; tapir::MAX_RANK]);
    let e = tree::jacobian(&mut g, &(&a, &deep), |_, (a, d)| a * d.sum()).unwrap_err();
    assert!(matches!(e, Error::InvalidShape { op: "jacobian", .. }), "{e}");
    assert_eq!(e.location().unwrap().line(), line!() - 2);
    let e = tree::jacfwd(&mut g, &(&a, &deep), |_, (a, d)| a * d.sum()).unwrap_err();
    assert!(matches!(e, Error::InvalidShape { op: "jacfwd", .. }), "{e}");
}
