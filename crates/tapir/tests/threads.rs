//! `init_threads`: the calling thread becomes one of rayon's global pool, graphs split
//! over it give the bits of one thread, a second call is a typed error, and work sent from
//! other threads still runs, with the pool's idle threads spin-waiting or not. One test, because the global pool is the process's: the
//! harness must not have started it from another test first. No libtest harness
//! (`harness = false` in Cargo.toml): `main` calls `init_threads`, as a program does. Under
//! libtest the test ran on a spawned thread that exited while it was still the pool's
//! thread 0, so rayon's record of it (384 bytes, kept for the pool's life) became
//! unreachable and `just asan`'s LeakSanitizer reported it.

use tapir::{Error, Graph, Tensor};

/// `Σ tanh(x·x)` and its gradient, at `threads` threads: large enough that the matrix
/// product and the elementwise ops split.
fn run(threads: usize, x: &Tensor<f64>) -> (f64, Vec<f64>) {
    let mut g = Graph::new();
    assert_eq!(g.set_threads(threads), threads);
    g.scope(|s| {
        let v = s.leaf(x);
        let y = v.matmul(v).tanh().sum();
        s.backward(y).unwrap();
        (y.item().unwrap(), v.grad().unwrap().to_vec())
    })
}

fn main() {
    the_calling_thread_joins_the_pool_and_results_keep_their_bits();
    println!("test the_calling_thread_joins_the_pool_and_results_keep_their_bits ... ok");
}

fn the_calling_thread_joins_the_pool_and_results_keep_their_bits() {
    let data: Vec<f64> = (0..256 * 256).map(|i| ((i * 7919) % 1000) as f64 / 1000.0 - 0.5).collect();
    let x = Tensor::from_vec(data, &[256, 256]).unwrap();
    let serial = run(1, &x);

    assert_eq!(tapir::init_threads(1).unwrap(), 1, "one thread builds no pool");
    assert_eq!(rayon::current_thread_index(), None, "one thread leaves the caller outside any pool");

    assert_eq!(tapir::init_threads(2).unwrap(), 2);
    assert_eq!(rayon::current_thread_index(), Some(0), "the caller is the pool's thread 0");
    assert_eq!(rayon::current_num_threads(), 2);
    assert_eq!(run(2, &x), serial, "two threads, the caller one of them, give the bits of one");

    let line = line!() + 1;
    let err = tapir::init_threads(3).unwrap_err();
    assert!(matches!(err, Error::InvalidArgument { op: "init_threads", .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("3 threads") && text.contains(&format!("threads.rs:{line}")), "{text}");
    assert_eq!(rayon::current_num_threads(), 2, "a refused call changes nothing");

    // Spin-waiting is on where the pool has no more threads than the machine has cores;
    // a graph on a pool thread leaves the other thread lingering after it, which must
    // neither change a result nor keep a graph run on that thread from finishing.
    let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
    assert_eq!(tapir::set_spin_wait(true), 2 <= cores, "init_threads decides from the core count");
    for _ in 0..20 {
        assert_eq!(run(2, &x), serial, "spin-waiting");
        let (a, b) = rayon::join(|| run(2, &x), || run(2, &x));
        assert_eq!((a, b), (serial.clone(), serial.clone()), "graphs on both pool threads at once");
    }
    assert!(tapir::set_spin_wait(false));
    assert_eq!(run(2, &x), serial, "without spin-waiting");

    // Another thread's parallel work runs on the pool's other thread.
    let other = std::thread::spawn(move || run(2, &x)).join().unwrap();
    assert_eq!(other, serial);
}
