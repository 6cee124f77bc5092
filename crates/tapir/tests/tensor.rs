//! The owned tensor and its eager ops (`src/tensor.rs`): constructors, agreement with the
//! graph, the faer round trip.

use tapir::{Error, Graph, Tensor};

#[test]
fn constructors_check_lengths() {
    let e = Tensor::<f32>::from_vec(vec![1.0; 5], &[2, 3]).unwrap_err();
    assert!(matches!(e, Error::DataLength { len: 5, .. }));
    let msg = e.to_string();
    assert!(msg.contains("from_vec") && msg.contains("[2, 3]") && msg.contains("tensor.rs"), "{msg}");
    assert!(Tensor::<f32>::zeros(&[1 << 40, 1 << 40]).is_err());
    assert_eq!(Tensor::<f64>::arange(0.0, 1.0, 0.25).unwrap().data(), &[0.0, 0.25, 0.5, 0.75]);
    assert_eq!(Tensor::<f64>::eye(2).unwrap().data(), &[1.0, 0.0, 0.0, 1.0]);
}

/// The NaN policy's row for the random and range constructors (docs/design.md): a NaN or
/// infinite parameter, or an empty range, is `InvalidArgument` naming the constructor,
/// never a tensor of NaN.
#[test]
fn constructors_refuse_non_finite_parameters() {
    use rand::SeedableRng;
    let (nan, inf) = (f64::NAN, f64::INFINITY);
    let rng = &mut rand::rngs::StdRng::seed_from_u64(0);
    let refused = [
        ("arange", Tensor::<f64>::arange(nan, 1.0, 0.5).map(|_| ())),
        ("arange", Tensor::<f64>::arange(0.0, inf, 0.5).map(|_| ())),
        ("arange", Tensor::<f64>::arange(0.0, 1.0, nan).map(|_| ())),
        ("normal", Tensor::<f64>::normal(&[2], nan, 1.0, rng).map(|_| ())),
        ("normal", Tensor::<f64>::normal(&[2], 0.0, inf, rng).map(|_| ())),
        ("normal", Tensor::<f64>::normal(&[2], 0.0, -1.0, rng).map(|_| ())),
        ("uniform", Tensor::<f64>::uniform(&[2], nan, 1.0, rng).map(|_| ())),
        ("uniform", Tensor::<f64>::uniform(&[2], 0.0, -inf, rng).map(|_| ())),
        ("uniform", Tensor::<f32>::uniform(&[2], 0.0, f32::INFINITY, rng).map(|_| ())),
    ];
    for (i, (name, r)) in refused.into_iter().enumerate() {
        let e = r.expect_err(name);
        assert!(matches!(e, Error::InvalidArgument { op, .. } if op == name), "case {i}: {e}");
    }
    // Data may hold NaN: `full` and `from_vec` store what they are given.
    assert!(Tensor::<f64>::full(&[2], nan).unwrap().data().iter().all(|v| v.is_nan()));
}

#[test]
fn eager_ops_agree_with_the_graph() {
    // The same kernels and scalar functions: results must be bitwise equal.
    let x = Tensor::<f64>::from_vec(vec![-1.5, -0.2, 0.0, 0.7, 2.5, 4.0], &[2, 3]).unwrap();
    let mut g = Graph::<f64>::new();
    g.scope(|s| {
        let v = s.input(&x);
        let pairs = [
            (v.sigmoid(), x.sigmoid().unwrap()),
            (v.softplus(), x.softplus().unwrap()),
            (v.gelu(), x.gelu().unwrap()),
            (v.gelu_tanh(), x.gelu_tanh().unwrap()),
            (v.exp(), x.exp().unwrap()),
            (v.relu(), x.relu().unwrap()),
            (v.log_softmax(1), x.log_softmax(1).unwrap()),
            (v.softmax(0), x.softmax(0).unwrap()),
            (v.sum_axes(&[-1], true), x.sum_axis(-1).unwrap()),
        ];
        for (graph, eager) in pairs {
            assert_eq!(graph.to_tensor().unwrap(), eager);
        }
    });
    let e = x.sum_axis(2).unwrap_err();
    assert!(matches!(e, Error::BadAxis { op: "sum_axis", .. }), "{e}");
}

#[test]
fn faer_round_trip_and_eager_matmul() {
    let a = Tensor::<f64>::from_vec(vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3]).unwrap();
    let m = a.to_mat().unwrap();
    assert_eq!(m[(1, 2)], 6.0);
    assert_eq!(Tensor::from_mat(m.as_ref()).unwrap(), a);
    // [[1,2,3],[4,5,6]] · [[1],[1],[1]] = [[6],[15]]
    let ones = Tensor::<f64>::ones(&[3, 1]).unwrap();
    assert_eq!(a.matmul(&ones, 1).unwrap().data(), &[6.0, 15.0]);
}
