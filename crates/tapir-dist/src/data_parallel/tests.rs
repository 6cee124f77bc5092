use super::*;
use crate::comm::Local;
use tapir::{Graph, Tensor};

fn store(width: usize) -> ParamStore<f64> {
    let mut s = ParamStore::new();
    s.add("w", Tensor::from_vec((0..width).map(|i| i as f64).collect(), &[width]).unwrap()).unwrap();
    s.add("b", Tensor::scalar(0.5)).unwrap();
    s
}

/// Fills `grads` with the gradient of `L = mean_i Σ_j (w_j − x_i)²` over `xs`:
/// `dL/dw_j = 2·(w_j − mean(x))`, `dL/db = 0`.
fn grad_of(store: &ParamStore<f64>, grads: &mut GradBuffer<f64>, xs: &[f64]) {
    let w = store.find("w").unwrap();
    let width = store.get(w).unwrap().numel();
    let mut g = Graph::new();
    let x = Tensor::from_vec(xs.iter().flat_map(|&x| vec![x; width]).collect(), &[xs.len(), width]).unwrap();
    g.scope(|s| {
        let l = (s.param(store, w) - s.input(&x)).square().sum() / xs.len() as f64;
        s.backward_into(l, grads).unwrap();
    });
}

#[test]
fn local_accumulation_is_the_mean_over_every_sample() {
    let mut s = store(3);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    let mut grads = s.zeros_like().unwrap();
    // Micro-batches of 1 and 3 samples: the mean of x over all 4 is (1 + 2 + 3 + 6)/4 = 3.
    grad_of(&s, &mut grads, &[1.0]);
    dp.accumulate(&mut grads, 1).unwrap();
    assert!(grads.iter().all(|(_, g)| g.data().iter().all(|&v| v == 0.0)), "accumulate zeroes grads");
    grad_of(&s, &mut grads, &[2.0, 3.0, 6.0]);
    dp.accumulate(&mut grads, 3).unwrap();
    assert_eq!(dp.all_reduce(&mut grads).unwrap(), Reduced { samples: 4 });
    let w = s.find("w").unwrap();
    let want: Vec<f64> = (0..3).map(|j| 2.0 * (j as f64 - 3.0)).collect();
    let got = grads.get(w).unwrap().data();
    assert!(got.iter().zip(&want).all(|(a, b)| (a - b).abs() < 1e-12), "{got:?} vs {want:?}");
}

#[test]
fn step_reports_errors_and_panics_as_rank_failures() {
    let mut s = store(2);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    let mut grads = s.zeros_like().unwrap();
    let e = dp.step(&mut grads, |_| Err::<usize, _>("out of data")).unwrap_err();
    assert!(matches!(&e, Error::RankFailed { rank: 0, size: 1, .. }), "{e}");
    assert!(e.to_string().contains("rank 0 of 1 failed") && e.to_string().contains("out of data"), "{e}");
    let e = dp.step(&mut grads, |_| -> std::result::Result<usize, String> { panic!("index 9 out of range") });
    let e = e.unwrap_err().to_string();
    assert!(e.contains("panicked: index 9 out of range"), "{e}");
    // After a failure the next step works again.
    let r = dp.step(&mut grads, |g| {
        grad_of(&s, g, &[1.0]);
        Ok::<_, String>(1)
    });
    assert_eq!(r.unwrap().samples, 1);
}

#[test]
fn zero_samples_everywhere_is_an_error() {
    let mut s = store(2);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    let mut grads = s.zeros_like().unwrap();
    let e = dp.all_reduce(&mut grads).unwrap_err().to_string();
    assert!(e.contains("no rank had a sample"), "{e}");
    let other = store(3).zeros_like().unwrap();
    let e = dp.accumulate(&mut other.clone(), 1).unwrap_err().to_string();
    assert!(e.contains("parameter \"w\" has shape [2] but its gradient [3]"), "{e}");
    assert!(dp.accumulate(&mut s.zeros_like().unwrap(), 1 << 60).is_err());
}

#[test]
fn metrics_are_weighted_means() {
    let mut s = store(1);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    let mut m = [2.0, 0.25];
    dp.mean_metrics(&mut m, 8.0).unwrap();
    assert_eq!(m, [2.0, 0.25]);
    assert!(dp.mean_metrics(&mut m, 0.0).is_err());
    dp.check_in_sync(&s).unwrap();
    assert_eq!(dp.agree(Ok::<_, String>(3)).unwrap(), 3);
    assert!(dp.agree(Err::<(), _>("no file")).unwrap_err().to_string().contains("no file"));
}

use crate::comm::threads;

#[test]
fn three_ranks_weight_uneven_shards_and_agree_bitwise() {
    let out = threads::run(3, |comm| {
        // Every rank starts elsewhere; rank 0's values win.
        let mut s = store(2);
        let w = s.find("w").unwrap();
        s.get_mut(w).unwrap().data_mut().fill(comm.rank() as f64 * 10.0);
        let mut dp = DataParallel::new(comm, &mut s).unwrap();
        let mut grads = s.zeros_like().unwrap();
        // Ranks hold 2, 1 and 0 samples of {1, 2, 6}: the global mean of x is 3.
        let xs: &[f64] = [&[1.0, 2.0][..], &[6.0][..], &[][..]][dp.rank()];
        let r = dp
            .step(&mut grads, |g| {
                if !xs.is_empty() {
                    grad_of(&s, g, xs);
                }
                Ok::<_, String>(xs.len())
            })
            .unwrap();
        assert_eq!(r.samples, 3);
        let mut m = [dp.rank() as f64];
        dp.mean_metrics(&mut m, (dp.rank() + 1) as f64).unwrap();
        dp.check_in_sync(&s).unwrap();
        (s.get(w).unwrap().data().to_vec(), grads.get(w).unwrap().data().to_vec(), m[0])
    });
    for (w, g, m) in &out {
        assert_eq!(w, &[0.0, 0.0], "rank 0's parameters were broadcast");
        // dL/dw_j = 2·(w_j − mean x) = 2·(0 − 3).
        assert_eq!(g, &[-6.0, -6.0]);
        // Σ r·(r + 1) / Σ (r + 1) = (0 + 2 + 6)/6.
        assert!((m - 8.0 / 6.0).abs() < 1e-15, "{m}");
    }
}

#[test]
fn a_failed_rank_is_named_on_every_rank() {
    let out = threads::run(3, |comm| {
        let mut s = store(2);
        let mut dp = DataParallel::new(comm, &mut s).unwrap();
        let mut grads = s.zeros_like().unwrap();
        let rank = dp.rank();
        let e = dp
            .step(&mut grads, |g| {
                if rank == 1 {
                    return Err("no more data".to_string());
                }
                grad_of(&s, g, &[1.0]);
                Ok(1)
            })
            .unwrap_err();
        let agreed = dp.agree(if rank == 2 { Err("bad shard") } else { Ok(()) }).unwrap_err();
        (e.to_string(), agreed.to_string())
    });
    for (step, agreed) in &out {
        assert!(step.contains("rank 1 of 3 failed") && step.contains("no more data"), "{step}");
        assert!(agreed.contains("rank 2 of 3 failed") && agreed.contains("bad shard"), "{agreed}");
    }
}

#[test]
fn a_different_model_is_refused_on_every_rank() {
    let out = threads::run(3, |comm| {
        let mut s = store(if comm.rank() == 2 { 3 } else { 2 });
        DataParallel::new(comm, &mut s).unwrap_err().to_string()
    });
    for e in &out {
        assert!(e.contains("rank 2's parameter 0 is \"w\" f64 [3] but rank 0's is \"w\" f64 [2]"), "{e}");
    }
}

#[test]
fn hash_sees_one_bit() {
    let a = store(4);
    let mut b = a.clone();
    let w = b.find("w").unwrap();
    let v = &mut b.get_mut(w).unwrap().data_mut()[2];
    *v = f64::from_bits(v.to_bits() ^ 1);
    assert_ne!(params_hash(&a), params_hash(&b));
    assert_eq!(params_hash(&a), params_hash(&a.clone()));
}

#[test]
fn a_huge_sample_count_is_refused_without_wrapping_the_pending_count() {
    let mut s = store(2);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    let mut grads = s.zeros_like().unwrap();
    grad_of(&s, &mut grads, &[1.0]);
    dp.accumulate(&mut grads, 3).unwrap();
    for samples in [usize::MAX, usize::MAX - 2, (1 << 53) - 2] {
        let line = line!() + 1;
        let e = dp.accumulate(&mut s.zeros_like().unwrap(), samples).unwrap_err();
        let Error::InvalidArgument { op: "DataParallel::accumulate", location, .. } = &e else { panic!("{e}") };
        assert_eq!((location.file(), location.line()), (file!(), line));
        assert_eq!(
            e.to_string(),
            format!(
                "DataParallel::accumulate: 3 pending + {samples} new samples on each of 1 ranks exceed \
                 9007199254740992, the largest count f64 holds exactly (at {location})"
            )
        );
    }
    // The refused calls changed nothing: the 3 samples reduce as before.
    assert_eq!(dp.all_reduce(&mut grads).unwrap(), Reduced { samples: 3 });
}

#[test]
fn a_non_finite_or_negative_weight_is_an_error_and_leaves_the_values() {
    let mut s = store(1);
    let mut dp = DataParallel::new(Local, &mut s).unwrap();
    for weight in [f64::NAN, f64::INFINITY, f64::NEG_INFINITY, -1.0] {
        let mut m = [2.0, 0.25];
        let line = line!() + 1;
        let e = dp.mean_metrics(&mut m, weight).unwrap_err();
        let Error::InvalidArgument { op: "DataParallel::mean_metrics", location, .. } = &e else { panic!("{e}") };
        assert_eq!((location.file(), location.line()), (file!(), line));
        assert_eq!(
            e.to_string(),
            format!(
                "DataParallel::mean_metrics: rank 0 of 1 passed the weight {weight}; weights must be finite and \
                 non-negative (at {location})"
            )
        );
        assert_eq!(m, [2.0, 0.25], "values unchanged");
    }
    let mut m = [1.0];
    let e = dp.mean_metrics(&mut m, 0.0).unwrap_err().to_string();
    assert!(e.starts_with("DataParallel::mean_metrics: the weights of all 1 ranks sum to 0; the sum must be"), "{e}");
    dp.mean_metrics(&mut m, 2.0).unwrap();
    assert_eq!(m, [1.0]);
}

#[test]
fn one_rank_with_a_nan_weight_fails_every_rank_alike() {
    let out = threads::run(3, |comm| {
        let mut s = store(1);
        let mut dp = DataParallel::new(comm, &mut s).unwrap();
        let weight = if dp.rank() == 1 { f64::NAN } else { 2.0 };
        let mut m = [dp.rank() as f64];
        let e = dp.mean_metrics(&mut m, weight).unwrap_err();
        assert!(matches!(e, Error::InvalidArgument { op: "DataParallel::mean_metrics", .. }), "{e}");
        // A later call works: nothing is left pending.
        let mut ok = [1.0];
        dp.mean_metrics(&mut ok, 1.0).unwrap();
        (e.to_string().split(" (at ").next().unwrap().to_string(), m[0])
    });
    for (rank, (e, m)) in out.iter().enumerate() {
        assert_eq!(
            e,
            "DataParallel::mean_metrics: rank 1 of 3 passed the weight NaN; weights must be finite and non-negative"
        );
        assert_eq!(*m, rank as f64);
    }
}
