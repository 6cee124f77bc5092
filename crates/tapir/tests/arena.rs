//! The arena's release policy and limits on everything a scope holds.

use tapir::{Error, Graph, Tensor};

fn big_scope(g: &mut Graph<f32>, x: &Tensor<f32>) {
    g.scope(|s| {
        let v = s.leaf(x);
        s.backward(v.exp().square().sum()).unwrap();
    });
}

fn small_scope(g: &mut Graph<f32>) {
    g.scope(|s| {
        let _ = s.scalar(1.0).exp();
    });
}

#[test]
fn a_run_of_small_scopes_gives_a_large_arena_back() {
    let x = Tensor::<f32>::ones(&[1 << 20]).unwrap(); // values and gradients: 16 MiB
    let mut g = Graph::<f32>::new();
    big_scope(&mut g, &x);
    big_scope(&mut g, &x);
    let large = g.stats().arena.capacity;
    assert!(large >= 16 << 20, "capacity {large}");
    for _ in 0..63 {
        small_scope(&mut g);
    }
    assert_eq!(g.stats().arena.capacity, large, "63 small scopes are not yet a run");
    small_scope(&mut g);
    let stats = g.stats().arena;
    assert_eq!(stats.releases, 1);
    assert!(stats.capacity < 1 << 20, "capacity after the release: {}", stats.capacity);
    // One large scope in a run of small ones starts the count over.
    big_scope(&mut g, &x);
    for _ in 0..63 {
        small_scope(&mut g);
    }
    big_scope(&mut g, &x);
    for _ in 0..63 {
        small_scope(&mut g);
    }
    assert_eq!(g.stats().arena.releases, 1);
}

#[test]
fn shrink_to_fit_frees_everything_and_the_next_scope_still_works() {
    let x = Tensor::<f32>::ones(&[1 << 16]).unwrap();
    let mut g = Graph::<f32>::new();
    big_scope(&mut g, &x);
    assert!(g.stats().arena.capacity > 0);
    g.shrink_to_fit();
    assert_eq!(g.stats().arena.capacity, 0);
    big_scope(&mut g, &x);
}

#[test]
fn index_payloads_count_against_the_arena_limit() {
    let x = Tensor::<f32>::ones(&[4, 2]).unwrap();
    let indices = vec![1usize; 1 << 20];
    let mut g = Graph::<f32>::new();
    g.set_arena_limit(Some(1024));
    let (line, e) = g.scope(|s| {
        let v = s.input(&x);
        (line!(), v.index_select(0, &indices).value().unwrap_err())
    });
    match e {
        Error::ArenaLimit { op: "index_select", requested, location, .. } => {
            assert_eq!(requested, 4 << 20, "the payload's bytes");
            assert_eq!(location.line(), line);
        }
        e => panic!("expected the arena limit, got {e}"),
    }
    // Nothing of the 4 MiB payload was kept.
    assert!(g.stats().tape_bytes < 1024, "{:?}", g.stats());
}

/// Bits of the loss and of every leaf's gradient after one scope of a program whose ops
/// write their outputs and first gradients whole into buffers the arena does not clear
/// (`Arena::alloc_stale`): large unary and binary maps (broadcast too), `linear`,
/// `matmul`, a convolution and its pooling, layer norm, attention (causal and not) and
/// softmax, at sizes on both sides of the parallel threshold.
fn warm_program(g: &mut Graph<f32>, leaves: &[Tensor<f32>]) -> Vec<Vec<u32>> {
    g.scope(|s| {
        let l: Vec<_> = leaves.iter().map(|t| s.leaf(t)).collect();
        let (x, w, bias, col, img, k, small) = (l[0], l[1], l[2], l[3], l[4], l[5], l[6]);
        let (wn, bn) = (l[7], l[8]);
        let h = x.linear(w, bias);
        let a = h.gelu() * h.tanh() + bias;
        let b = (a * col).exp().sqrt() - h;
        let c = b.matmul(w).relu();
        let conv = img.conv2d(k, [1, 1], [1, 1]).relu().max_pool2d([2, 2], [2, 2], [0, 0]);
        let t = small.sigmoid() * small.tanh() + small.gelu();
        // Attention over `[8, 32, 3·16]` (4 heads), causal and not; softmax; layer norm.
        let qkv = x.reshape(&[8, 32, 160]).narrow(2, 0, 48).layer_norm(wn, bn, 1e-5);
        let att = qkv.attention_weights(4, true).attend(qkv) + qkv.attention_weights(4, false).attend(qkv);
        let loss = c.sum() + conv.square().sum() + t.sum() + (att * att.softmax(-1)).sum();
        s.backward(loss).unwrap();
        let mut bits = vec![vec![loss.item().unwrap().to_bits()]];
        bits.extend(l.iter().map(|v| v.grad().unwrap().iter().map(|e| e.to_bits()).collect()));
        bits
    })
}

fn warm_leaves(seed: u64) -> Vec<Tensor<f32>> {
    let dims: [&[usize]; 9] =
        [&[256, 160], &[160, 160], &[160], &[256, 1], &[8, 3, 10, 10], &[6, 3, 3, 3], &[16, 40], &[48], &[48]];
    dims.iter()
        .enumerate()
        .map(|(i, d)| {
            let n: usize = d.iter().product();
            let v = (0..n).map(|j| ((j as u64 * 7919 + seed * 104_729 + i as u64 * 31) % 1000) as f32 / 2000.0 - 0.2);
            Tensor::from_vec(v.collect(), d).unwrap()
        })
        .collect()
}

/// A scope in a warmed-up arena, whose buffers hold another scope's values (all-one bytes
/// in debug builds), gives the bits of the same scope in a fresh arena, whose buffers were
/// zeroed: every op that takes an unspecified buffer writes all of it.
#[test]
fn a_warmed_up_arena_gives_the_bits_of_a_fresh_one() {
    let (x, other) = (warm_leaves(1), warm_leaves(2));
    for threads in [1, 2] {
        let mut g = Graph::<f32>::new();
        g.set_threads(threads);
        let fresh = warm_program(&mut g, &x);
        let dirty = warm_program(&mut g, &other);
        assert_ne!(dirty, fresh, "the second scope leaves other values behind");
        let warm = warm_program(&mut g, &x);
        for (i, (a, b)) in fresh.iter().zip(&warm).enumerate() {
            assert!(a == b, "{threads} threads: output {i} differs in a warmed-up arena");
        }
    }
}
