//! Second and higher derivatives through [`Scope::grad`]: closed forms.

use tapir::{Graph, Tensor};

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
            Ok::<_, tapir::Error>((d1.value()?.to_vec(), d2.value()?.to_vec(), d3.value()?.to_vec()))
        })
        .unwrap();
    for (i, &v) in [0.5f64, -1.5, 2.0].iter().enumerate() {
        assert!((d1[i] - 4.0 * v.powi(3)).abs() < 1e-12);
        assert!((d2[i] - 12.0 * v * v).abs() < 1e-12);
        assert!((d3[i] - 24.0 * v).abs() < 1e-12);
    }
}
