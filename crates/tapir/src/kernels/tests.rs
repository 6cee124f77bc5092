//! Tests of the element loops, reductions and layout kernels.

use super::layout::*;
use super::reduce::*;
use super::*;

/// Against `ln Σ eˣ` summed in f64 from the unshifted values (a different order
/// and no shift), for lengths around the 8-lane chunks, and the special values.
#[test]
fn row_lse_matches_a_direct_sum_and_keeps_nan_and_infinities() {
    for len in [1usize, 7, 8, 9, 23, 96, 100] {
        let row: Vec<f64> = (0..len).map(|i| ((i * 37 % 11) as f64 - 5.0) * 1.3).collect();
        let direct = row.iter().map(|v| v.exp()).sum::<f64>().ln();
        let got = row_lse(&row);
        assert!((got - direct).abs() < 1e-13, "len {len}: {got} vs {direct}");
        let row32: Vec<f32> = row.iter().map(|&v| v as f32).collect();
        assert!((row_lse(&row32) as f64 - direct).abs() < 1e-5, "f32 len {len}");
        for at in [0, len / 2, len - 1] {
            let mut bad = row.clone();
            bad[at] = f64::NAN;
            assert!(row_lse(&bad).is_nan(), "NaN at {at} of {len}");
            bad[at] = f64::INFINITY;
            assert_eq!(row_lse(&bad), f64::INFINITY, "+inf at {at} of {len}");
            bad[(at + 1) % len] = f64::NAN;
            assert!(len == 1 || row_lse(&bad).is_nan(), "+inf and NaN in {len}");
        }
        assert_eq!(row_lse(&vec![f64::NEG_INFINITY; len]), f64::NEG_INFINITY);
        assert!(row_lse(&vec![f64::NAN; len]).is_nan());
    }
}

#[test]
fn tiled_transpose_matches_the_strided_walk() {
    for dims in [vec![2, 3], vec![33, 70], vec![2, 40, 33], vec![3, 1, 5], vec![0, 4]] {
        let sx = shape(&dims);
        let r = dims.len();
        let mut axes: Vec<usize> = (0..r).collect();
        axes.swap(r - 2, r - 1);
        let mut od = dims.clone();
        od.swap(r - 2, r - 1);
        let so = shape(&od);
        let x: Vec<f64> = (0..sx.numel()).map(|i| i as f64).collect();
        let mut fast = vec![0.0; so.numel()];
        permute(&x, &sx, &axes, &so, &mut fast);
        let mut st = [0; MAX_RANK];
        for (i, &a) in axes.iter().enumerate() {
            st[i] = sx.strides()[a];
        }
        let mut slow = vec![0.0; so.numel()];
        for_each2(&so, &st, &[0; MAX_RANK], |o, ix, _| slow[o] = x[ix]);
        assert_eq!(fast, slow, "{dims:?}");
        let mut back = vec![1.0; sx.numel()];
        permute_grad(&fast, &sx, &axes, &so, &mut back);
        assert_eq!(back, x.iter().map(|v| v + 1.0).collect::<Vec<_>>(), "{dims:?}");
    }
}

fn shape(d: &[usize]) -> Shape {
    Shape::new(d).unwrap()
}

#[test]
fn broadcast_add_matches_hand_result() {
    // [[1], [2]] + [10, 20, 30] = [[11, 21, 31], [12, 22, 32]]
    let (a, b) = ([1.0f64, 2.0], [10.0, 20.0, 30.0]);
    let mut out = [0.0; 6];
    binary((&a, &shape(&[2, 1])), (&b, &shape(&[3])), (&mut out, &shape(&[2, 3])), |x, y| x + y);
    assert_eq!(out, [11.0, 21.0, 31.0, 12.0, 22.0, 32.0]);
}

#[test]
fn tiled_broadcasts_match_the_general_path() {
    // Bias-style broadcasts take the chunked path; compare with index arithmetic.
    for (sa, sb) in
        [(vec![3, 4], vec![4]), (vec![3, 4], vec![1, 4]), (vec![2, 3, 4], vec![3, 4]), (vec![4], vec![3, 4])]
    {
        let (sa, sb) = (shape(&sa), shape(&sb));
        let so = sa.broadcast(&sb).unwrap();
        let a: Vec<f64> = (0..sa.numel()).map(|i| i as f64 * 0.5 - 1.0).collect();
        let b: Vec<f64> = (0..sb.numel()).map(|i| 2.0 - i as f64).collect();
        let dout: Vec<f64> = (0..so.numel()).map(|i| (i % 5) as f64).collect();
        let mut fast = vec![0.0; so.numel()];
        binary((&a, &sa), (&b, &sb), (&mut fast, &so), |x, y| x * y + 1.0);
        let mut slow = vec![0.0; so.numel()];
        for_each_broadcast(&so, &sa, &sb, |i, ia, ib| slow[i] = a[ia] * b[ib] + 1.0);
        assert_eq!(fast, slow);
        for (x, sx, y, sy) in [(&a, &sa, &b, &sb), (&b, &sb, &a, &sa)] {
            let mut fast = vec![0.0; sx.numel()];
            binary_grad((&dout, &so), (x, sx), (y, sy), &mut fast, |d, u, v| d * v + u);
            let mut slow = vec![0.0; sx.numel()];
            for_each_broadcast(&so, sx, sy, |i, ix, iy| slow[ix] += dout[i] * y[iy] + x[ix]);
            assert_eq!(fast, slow);
        }
    }
}

#[test]
fn permute_transposes() {
    let x = [1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
    let mut out = [0.0; 6];
    permute(&x, &shape(&[2, 3]), &[1, 0], &shape(&[3, 2]), &mut out);
    assert_eq!(out, [1.0, 4.0, 2.0, 5.0, 3.0, 6.0]);
}

#[test]
fn gemm_matches_naive() {
    // [[1, 2], [3, 4]] · [[5, 6], [7, 8]] = [[19, 22], [43, 50]]
    let (a, b) = ([1.0f64, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]);
    let mut c = [0.0; 4];
    f64::gemm(&mut c, &a, false, &b, false, (2, 2, 2), false, faer::Par::Seq);
    assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
    // aᵀ · b = [[26, 30], [38, 44]], accumulated onto the previous result.
    f64::gemm(&mut c, &a, true, &b, false, (2, 2, 2), true, faer::Par::Seq);
    assert_eq!(c, [45.0, 52.0, 81.0, 94.0]);
}

/// Integer-valued `a` (stored `[k, m]`) and `b` (`[k, n]`), and `1 + aᵀ·b` summed
/// naively: every partial sum is exact, so any order of summation gives these bits.
fn at_b_problem(m: usize, k: usize, n: usize) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let a: Vec<f64> = (0..k * m).map(|i| ((i * 7) % 11) as f64 - 5.0).collect();
    let b: Vec<f64> = (0..k * n).map(|i| ((i * 5) % 13) as f64 - 6.0).collect();
    let mut want = vec![1.0; m * n];
    for i in 0..m {
        for j in 0..n {
            want[i * n + j] += (0..k).map(|r| a[r * m + i] * b[r * n + j]).sum::<f64>();
        }
    }
    (a, b, want)
}

#[test]
fn narrow_products_match_the_naive_sum() {
    // `a` used transposed, 2 <= n <= 16, m >= 64: the blocked column-major path, with a
    // last block of 88 rows. Integer-valued entries make every sum exact.
    let (m, k) = (600, 50);
    for n in [2, 10, 16, 17] {
        let (a, b, want) = at_b_problem(m, k, n);
        for par in [faer::Par::Seq, faer::Par::rayon(2)] {
            let mut c = vec![1.0; m * n];
            f64::gemm(&mut c, &a, true, &b, false, (m, k, n), true, par);
            assert_eq!(c, want, "n = {n}, accumulated");
            let mut c = vec![f64::NAN; m * n];
            f64::gemm(&mut c, &a, true, &b, false, (m, k, n), false, par);
            assert!(c.iter().zip(&want).all(|(x, w)| *x == w - 1.0), "n = {n}, replaced");
        }
    }
}

#[test]
fn long_reductions_in_k_blocks_match_the_naive_sum() {
    // k = 1100 takes the blocked path (four blocks of 256 and one of 76); integer-valued
    // entries make every partial sum exact, so any order of summation gives these bits.
    let (m, k, n) = (37, 1100, 29);
    let (a, b, want) = at_b_problem(m, k, n);
    for (accumulate, par) in [(true, faer::Par::Seq), (true, faer::Par::rayon(2))] {
        let mut c = vec![1.0; m * n];
        f64::gemm(&mut c, &a, true, &b, false, (m, k, n), accumulate, par);
        assert_eq!(c, want);
    }
    let mut c = vec![f64::NAN; m * n];
    f64::gemm(&mut c, &a, true, &b, false, (m, k, n), false, faer::Par::Seq);
    assert!(c.iter().zip(&want).all(|(x, w)| *x == w - 1.0), "replace ignores the old values");
}

#[test]
fn tiled_products_give_the_bits_of_one_call_at_any_thread_count() {
    // Non-integer entries, so a different order of summation would show in the bits. A
    // square weight gradient `aᵀ·b` with a long (k-blocked) reduction is cut into a grid at
    // 4 and more threads; 96×64 leaves a 32-wide tile that must not be cut again; the
    // plain product is cut along its rows.
    let data = |n: usize, seed: usize| -> Vec<f64> {
        (0..n).map(|i| (((i * 7919 + seed * 104729) % 2003) as f64 / 997.0).sin()).collect()
    };
    for (m, k, n, a_t) in [(192, 1100, 160, true), (96, 700, 64, true), (256, 300, 96, false)] {
        let (a, b) = (data(m * k, 1), data(k * n, 2));
        let run = |par: faer::Par| {
            let mut c = vec![0.0; m * n];
            f64::gemm(&mut c, &a, a_t, &b, false, (m, k, n), false, par);
            c.iter().map(|v| v.to_bits()).collect::<Vec<u64>>()
        };
        let one = run(faer::Par::Seq);
        for t in [2, 3, 4, 7, 16] {
            assert_eq!(one, run(faer::Par::rayon(t)), "{m}x{k}x{n} at {t} threads");
        }
    }
}

/// The split kernels of `par.rs`: chunking, bits at any thread count, sums.
mod par_splits {
    use crate::kernels::par::*;
    use crate::shape::Shape;
    use faer::Par;

    fn data(n: usize, seed: u64) -> Vec<f64> {
        // A fixed pseudo-random sequence (an LCG), spread over several magnitudes, so that
        // summation order shows in the last bits.
        let mut s = seed;
        (0..n)
            .map(|_| {
                s = s.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                ((s >> 11) as f64 / (1u64 << 53) as f64 - 0.5) * 10f64.powi((s % 7) as i32 - 3)
            })
            .collect()
    }

    fn bits(v: &[f64]) -> Vec<u64> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn chunks_cover_every_element_once_at_any_thread_count() {
        for threads in [1, 2, 3, 4, 7] {
            for len in [0, 1, 5, 64, 65, 1000] {
                let mut seen = vec![0u32; len];
                for_chunks(threads, &mut seen, 7, &|s, piece: &mut [u32]| {
                    for (i, v) in piece.iter_mut().enumerate() {
                        *v += 1 + (s + i) as u32;
                    }
                });
                let want: Vec<u32> = (0..len as u32).map(|i| i + 1).collect();
                assert_eq!(seen, want, "{threads} threads, {len} elements");
            }
        }
    }

    #[test]
    fn large_ops_give_the_same_bits_at_1_2_and_4_threads() {
        let (rows_, cols) = (300, 257); // 77,100 elements: above MIN_PARALLEL, ragged chunks
        let n = rows_ * cols;
        let (x, y, bias) = (data(n, 1), data(n, 2), data(cols, 3));
        let (so, sb) = (Shape::new(&[rows_, cols]).unwrap(), Shape::new(&[cols]).unwrap());
        let run = |par: Par| {
            let mut got = Vec::new();
            let mut out = vec![0.0; n];
            map(par, &x, &mut out, |v| v.tanh());
            got.extend(bits(&out));
            let mut dx = y.clone();
            map_grad(par, &y, &x, &out, &mut dx, |a, b| a * b);
            got.extend(bits(&dx));
            let mut out = vec![0.0; n];
            binary(par, (&x, &so), (&bias, &sb), (&mut out, &so), |a, b| a * b + 1.0);
            got.extend(bits(&out));
            let mut db = vec![0.0; cols];
            binary_grad(par, (&y, &so), (&bias, &sb), (&x, &so), &mut db, |d, _, v| d * v);
            got.extend(bits(&db));
            got.push(sum(par, &x).to_bits());
            let mut s0 = vec![0.0; cols];
            sum_axis(par, &x, (1, rows_, cols), &mut s0);
            got.extend(bits(&s0));
            let mut s1 = vec![0.0; rows_];
            sum_axis(par, &x, (rows_, cols, 1), &mut s1);
            got.extend(bits(&s1));
            let mut sm = vec![0.0; n];
            softmax_axis(par, &x, (rows_, cols, 1), &mut sm, false);
            got.extend(bits(&sm));
            let mut dsm = vec![0.0; n];
            softmax_axis_grad(par, &y, &sm, (rows_, cols, 1), &mut dsm, false);
            got.extend(bits(&dsm));
            got
        };
        let one = run(Par::Seq);
        assert_eq!(one, run(Par::rayon(2)));
        assert_eq!(one, run(Par::rayon(4)));
    }

    #[test]
    fn parallel_sums_match_an_f64_reference_closely() {
        // Chunked summation changes the rounding, not the value: compare with a sum of the
        // same numbers in 128-bit-ish compensated (Neumaier) summation.
        let x = data(100_003, 9);
        let (mut s, mut c) = (0.0f64, 0.0f64);
        for &v in &x {
            let t = s + v;
            c += if s.abs() >= v.abs() { (s - t) + v } else { (v - t) + s };
            s = t;
        }
        let exact = s + c;
        let got = sum(Par::rayon(2), &x);
        assert!((got - exact).abs() <= 1e-12 * x.iter().map(|v| v.abs()).sum::<f64>(), "{got} vs {exact}");
        // Column sums: each column summed in order, so equal to a plain loop.
        let (r, cols) = (400, 250);
        let mut out = vec![0.0; cols];
        sum_axis(Par::rayon(2), &x[..r * cols], (1, r, cols), &mut out);
        for (j, &o) in out.iter().enumerate() {
            let mut want = 0.0;
            for i in 0..r {
                want += x[i * cols + j];
            }
            assert_eq!(o.to_bits(), want.to_bits(), "column {j}");
        }
    }

    #[test]
    fn first_gradients_written_over_stale_memory_match_those_added_to_zeros() {
        // 77,100 elements: several chunks; `dx` holds NaN where the written path must not read.
        let n = 300 * 257;
        let (dout, x, y) = (data(n, 4), data(n, 5), data(n, 6));
        let d = |a: f64, b: f64| a * b - 0.5 * a;
        let mut want = vec![0.0; n];
        map_grad(Par::Seq, &dout, &x, &y, &mut want, d);
        for par in [Par::Seq, Par::rayon(2), Par::rayon(3)] {
            let mut got = vec![f64::NAN; n];
            map_grad_write(par, &dout, &x, &y, &mut got, d);
            assert_eq!(bits(&got), bits(&want), "{par:?}");
        }
        // `0 + (−0) = +0`, as on the accumulating path.
        let mut z = vec![f64::NAN; MIN_PARALLEL];
        map_grad_write(Par::rayon(2), &vec![-0.0; MIN_PARALLEL], &x[..MIN_PARALLEL], &y[..MIN_PARALLEL], &mut z, d);
        assert!(z.iter().all(|v| v.to_bits() == 0));
    }
}
