//! [`Dropout`]: zeroes each element with probability `p` while training and scales the
//! survivors by `1/(1 − p)`, so the expected value is unchanged; the identity in evaluation.
//!
//! The mask is drawn in the arena without touching the heap: `z ~ N(0, 1)` from the
//! engine's `randn`, kept where `z > Φ⁻¹(p)`, which happens with probability `1 − p`.
//! The gradient is `dx = dout ⊙ mask/(1 − p)`, through the engine's `mul`.
//!
//! The random stream is counter-based: each call seeds a fresh generator from
//! `(seed, step, call)`, where [`Scope::next_draw`](tapir::Scope::next_draw) gives the
//! step (the graph's scope count) and the call's index within the scope. Nothing advances
//! between calls, so a checkpointed block that is recomputed in backward draws the very
//! masks its forward drew (the nested scope replays its draw keys), and every call of
//! every step still gets a mask of its own.

use rand::rngs::StdRng;
use rand::SeedableRng;
use tapir::{Float, Var};

use crate::layer::{Ctx, Module};

/// Inverted dropout with a counter-based random stream: the same seed on a graph with
/// the same history gives the same masks, and recomputation repeats them.
#[derive(Debug, Clone, Copy)]
pub struct Dropout {
    p: f64,
    threshold: f64,
    seed: u64,
}

impl Dropout {
    /// Dropout with probability `p`, masks drawn from a generator seeded with `seed`.
    ///
    /// # Errors
    /// [`tapir::Error::InvalidArgument`] unless `0 ≤ p < 1`.
    #[track_caller]
    pub fn new(p: f64, seed: u64) -> tapir::Result<Dropout> {
        if !(0.0..1.0).contains(&p) {
            return Err(crate::invalid("Dropout::new", format!("probability {p} must be in [0, 1)")));
        }
        Ok(Dropout { p, threshold: normal_quantile(p), seed })
    }

    /// The drop probability.
    pub fn p(&self) -> f64 {
        self.p
    }
}

impl<T: Float> Module<T> for Dropout {
    fn forward<'s, 'g>(&self, cx: Ctx<'s, 'g, T>, x: Var<'s, T>) -> Var<'s, T> {
        if !cx.is_train() || self.p == 0.0 {
            return x;
        }
        let s = cx.scope();
        let (dims, rank) = crate::dims(x.shape());
        let [step, call] = s.next_draw();
        let mut rng = StdRng::seed_from_u64(mix(mix(mix(self.seed) ^ step) ^ call));
        let z = s.randn(&dims[..rank], &mut rng);
        let mask = z.gt(s.scalar(T::from_f64(self.threshold)));
        x * mask.mul_scalar(T::from_f64(1.0 / (1.0 - self.p)))
    }
}

/// SplitMix64's finaliser: a bijection on `u64` that spreads each input bit over the
/// output, so that nearby keys give unrelated seeds.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// `Φ⁻¹(p)`, the standard normal quantile, by Acklam's rational approximation (relative
/// error below 1.2e-9); `−∞` at 0.
fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] =
        [7.784_695_709_041_462e-3, 3.224_671_290_700_398e-1, 2.445_134_137_142_996, 3.754_408_661_907_416];
    const LOW: f64 = 0.024_25;
    if p <= 0.0 {
        return f64::NEG_INFINITY;
    }
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < LOW {
        tail((-2.0 * p.ln()).sqrt())
    } else if p <= 1.0 - LOW {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    } else {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tapir::{Graph, ParamStore, Tensor};

    #[test]
    fn quantile_matches_known_values() {
        assert_eq!(normal_quantile(0.5), 0.0);
        assert!((normal_quantile(0.975) - 1.959_963_984_540_054).abs() < 1e-8);
        assert!((normal_quantile(0.01) + 2.326_347_874_040_841).abs() < 1e-8);
    }

    #[test]
    fn drops_about_p_and_keeps_the_mean_and_is_off_in_eval() {
        let d = Dropout::new(0.3, 1).unwrap();
        let x = Tensor::<f64>::ones(&[100, 100]).unwrap();
        let store = ParamStore::new();
        let mut g = Graph::new();
        let (zeros, mean, eval_same) = g.scope(|s| {
            let y = d.forward(Ctx::train(s, &store), s.input(&x)).value().unwrap();
            let zeros = y.iter().filter(|&&v| v == 0.0).count();
            let mean = y.iter().sum::<f64>() / y.len() as f64;
            let e = d.forward(Ctx::eval(s, &store), s.input(&x)).value().unwrap();
            (zeros, mean, e == x.data())
        });
        assert!((2800..3200).contains(&zeros), "{zeros}");
        assert!((mean - 1.0).abs() < 0.03, "{mean}");
        assert!(eval_same);
        assert!(Dropout::new(1.0, 0).is_err() && Dropout::new(-0.1, 0).is_err());
    }

    #[test]
    fn same_seed_same_mask_and_a_new_mask_per_call_and_step() {
        let x = Tensor::<f32>::ones(&[64]).unwrap();
        let store = ParamStore::new();
        // Two calls in each of two steps, on a fresh graph.
        let run = |seed| {
            let d = Dropout::new(0.5, seed).unwrap();
            let mut g = Graph::new();
            let mut masks = vec![];
            for _ in 0..2 {
                g.scope(|s| {
                    for _ in 0..2 {
                        masks.push(d.forward(Ctx::train(s, &store), s.input(&x)).to_tensor().unwrap());
                    }
                });
            }
            masks
        };
        let (a, b) = (run(3), run(3));
        assert_eq!(a, b);
        assert_ne!(a, run(4));
        for i in 0..4 {
            for j in 0..i {
                assert_ne!(a[i], a[j], "calls {i} and {j} drew the same mask");
            }
        }
    }
}
