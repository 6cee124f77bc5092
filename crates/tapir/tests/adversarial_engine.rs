//! Regression tests for the engine-side classes of the hardening issue: each asserts the
//! error variant, the op name and the caller's line, or the correct value.

use std::time::Instant;

use tapir::{Error, Graph, ParamStore, Tensor};

#[test]
fn powf_zero_has_gradient_zero_at_zero() {
    // d/dx x^0 = 0 everywhere (PyTorch), not 0·0^(−1) = NaN.
    let x = Tensor::from_vec(vec![0.0f64, 2.0], &[2]).unwrap();
    let mut g = Graph::<f64>::new();
    let (value, grad) = g.scope(|s| {
        let v = s.leaf(&x);
        let y = v.powf(0.0);
        s.backward(y.sum()).unwrap();
        (y.value().unwrap().to_vec(), v.grad().unwrap().to_vec())
    });
    assert_eq!(value, [1.0, 1.0]);
    assert_eq!(grad, [0.0, 0.0]);
}

#[test]
fn a_pooling_window_far_larger_than_the_input_costs_nothing() {
    // Kernel 2^31 with padding 2^30 on a 1x1 input: (1 + 2^31 − 2^31) + 1 = 2 windows a
    // side, each clipped to the one input element.
    let x = Tensor::from_vec(vec![3.0f32], &[1, 1, 1, 1]).unwrap();
    let mut g = Graph::<f32>::new();
    let t0 = Instant::now();
    let (mx, avg) = g.scope(|s| {
        let v = s.leaf(&x);
        let (k, p) = (1usize << 31, 1usize << 30);
        let mx = v.max_pool2d([k, k], [1, 1], [p, p]);
        let avg = v.avg_pool2d([k, k], [1, 1], [p, p]);
        s.backward((mx + avg).sum()).unwrap();
        (mx.value().unwrap().to_vec(), avg.value().unwrap()[0])
    });
    assert_eq!(mx, [3.0; 4]);
    assert_eq!(avg, 3.0 / (2f32.powi(31) * 2f32.powi(31)));
    // Not a timing assertion on performance: a hang here used to take minutes per window.
    assert!(t0.elapsed().as_secs() < 60);
}

#[test]
fn window_arguments_beyond_u32_and_oversized_products_name_the_problem() {
    let x = Tensor::<f32>::zeros(&[1, 1, 4, 4]).unwrap();
    let mut g = Graph::<f32>::new();
    let (line, e) = g.scope(|s| (line!(), s.input(&x).im2col([1, 1], [1 << 32, 1], [0, 0]).value().unwrap_err()));
    match &e {
        Error::InvalidArgument { op: "im2col", detail, location } => {
            assert!(detail.contains("below 2^32"), "{e}");
            assert_eq!(location.line(), line);
        }
        e => panic!("{e}"),
    }
    // [2^31, 0] · [0, 2^31] has 2^62 elements: a shape error, not "needs rank >= 2".
    let a = Tensor::<f32>::zeros(&[1 << 31, 0]).unwrap();
    let b = Tensor::<f32>::zeros(&[0, 1 << 31]).unwrap();
    let (line, e) = g.scope(|s| (line!(), s.input(&a).matmul(s.input(&b)).value().unwrap_err()));
    match &e {
        Error::InvalidShape { op: "matmul", location, .. } => assert_eq!(location.line(), line),
        e => panic!("{e}"),
    }
}

#[test]
fn backward_of_a_loss_no_leaf_reaches_is_an_error() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0], &[2]).unwrap();
    let mut g = Graph::<f32>::new();
    let (line, e) = g.scope(|s| (line!(), s.backward(s.input(&x).sum()).unwrap_err()));
    match e {
        Error::NoGradient { op: "backward", location, .. } => assert_eq!(location.line(), line),
        e => panic!("{e}"),
    }
    // Under no_grad too, even with a gradient-requesting leaf.
    let e = g.scope(|s| {
        let v = s.leaf(&x);
        let loss = s.no_grad(|| v.square().sum());
        s.backward(loss).unwrap_err()
    });
    assert!(matches!(e, Error::NoGradient { .. }), "{e}");
}

#[test]
fn a_mismatched_gradient_buffer_leaves_the_tape_unconsumed() {
    let mut a = ParamStore::<f32>::new();
    let w = a.add("w", Tensor::ones(&[2]).unwrap()).unwrap();
    let mut other = ParamStore::<f32>::new();
    other.add("w", Tensor::ones(&[3]).unwrap()).unwrap();
    let mut wrong = other.zeros_like().unwrap();
    let mut right = a.zeros_like().unwrap();
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let loss = s.param(&a, w).square().sum();
        let e = s.backward_into(loss, &mut wrong).unwrap_err();
        assert!(matches!(e, Error::WrongStore { op: "backward_into", .. }), "{e}");
        // The tape was not consumed: the right buffer still gets its gradient.
        s.backward_into(loss, &mut right).unwrap();
    });
    assert_eq!(right.get(w).unwrap().data(), [2.0, 2.0]);
    assert!(wrong.iter().all(|(_, t)| t.data().iter().all(|&v| v == 0.0)));
}

#[test]
fn earlier_handles_stay_truthful_after_an_error() {
    let x = Tensor::from_vec(vec![1.0f32, 2.0, 3.0], &[3]).unwrap();
    let mut g = Graph::<f32>::new();
    g.scope(|s| {
        let v = s.leaf(&x);
        let y = v.square();
        s.backward_retain(y.sum()).unwrap();
        let _ = v.reshape(&[2]); // fails: 3 elements cannot be [2]
        assert!(s.check().is_err());
        assert_eq!(y.shape().dims(), [3]);
        assert!(y.requires_grad());
        assert_eq!(v.grad().unwrap(), [2.0, 4.0, 6.0]);
        // Values report the scope's first error, as documented.
        assert!(matches!(y.value(), Err(Error::InvalidShape { op: "reshape", .. })));
    });
}

/// A mean over axes whose sizes multiply past `usize`, beside a zero-sized axis: an empty
/// result and an empty gradient, not an arithmetic overflow (found by the random-program
/// property test, `tapir-testing/tests/programs.proptest-regressions`).
#[test]
fn mean_over_axes_whose_sizes_overflow_is_empty() {
    let huge = u32::MAX as usize;
    let x = Tensor::<f64>::zeros(&[0, huge, huge, huge]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let x = s.leaf(&x);
        let m = x.mean_axes(&[1, 2, 3], false);
        assert_eq!(m.shape().dims(), &[0]);
        assert!(m.value().unwrap().is_empty());
        s.backward(m.sum()).unwrap();
        assert!(x.grad().unwrap().is_empty());
    });
}
