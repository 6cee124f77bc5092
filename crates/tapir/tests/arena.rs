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
