//! A whole warmed-up training step (forward, `backward_into`, gradient clipping, the
//! schedule and the optimizer's update) makes no heap allocation: the arena, the tape's
//! vectors, the gradient buffer and the optimizer's state are all reused.
//!
//! Its own test binary, because the counting allocator is global: one atomic counter for
//! the calls of every thread the engine runs on, the test's own thread and every rayon
//! worker (matrix products split by output blocks, large elementwise ops split by chunks).
//! Only the test harness's threads are left out: its main thread prints and polls while
//! the test runs, at moments that have nothing to do with the engine. The harness runs
//! tests in parallel, so each test holds [`SERIAL`] for its whole body: otherwise one
//! test's counted threads would allocate inside the other's measured steps. The
//! models run at 1 thread, and the MLP (64-256-128-10, batch 128, Adam) at 1, 2
//! and 4 threads.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::sync::{Mutex, MutexGuard, Once};

use rand::SeedableRng;
use tapir::{Graph, ParamStore, Tensor};
use tapir_nn::optim::{clip_grad_norm, Adam, AdamW, CosineWarmup, Optimizer, Schedule, Sgd};
use tapir_nn::{
    Activation, AvgPool2d, Conv2d, Ctx, Dropout, Flatten, LayerNorm, Linear, MaxPool2d, Mlp, Module, Sequential,
};

/// Forwards to the system allocator and counts allocation calls (alloc, alloc_zeroed,
/// realloc) on every thread.
struct Counting;

static CALLS: AtomicUsize = AtomicUsize::new(0);

/// Held by each test for its whole body, so that no two tests count at the same time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A test's hold on [`SERIAL`]. Dropped last in the test, it stops the test's thread
/// counting before letting the next test in: the thread goes on to hand its result to the
/// harness (which allocates), and that must not land in the next test's measured steps.
struct Serial(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Drop for Serial {
    fn drop(&mut self) {
        COUNTED.with(|c| c.set(false));
    }
}

/// Takes [`SERIAL`]; a test that failed while holding it does not fail the others.
/// Also sets up rayon's global pool, once, whichever test comes first: any rayon call
/// (even asking for the thread count) starts the global pool with its defaults, after
/// which it can no longer be configured.
fn serial() -> Serial {
    let guard = SERIAL.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    GLOBAL_POOL.call_once(|| {
        // The global pool, which split ops use unless called inside another pool, with 4
        // workers whatever the machine, each counted.
        rayon::ThreadPoolBuilder::new().num_threads(4).start_handler(|_| mark_counted()).build_global().unwrap();
        rayon::broadcast(|_| {
            Tensor::<f32>::ones(&[64, 64]).unwrap().matmul(&Tensor::ones(&[64, 64]).unwrap(), 1).map(drop).unwrap()
        });
    });
    Serial(guard)
}

static GLOBAL_POOL: Once = Once::new();

thread_local! {
    // Whether this thread's calls count: set on the test thread and, by the pools' start
    // handlers, on every rayon worker. `const`: reading it never allocates.
    static COUNTED: Cell<bool> = const { Cell::new(false) };
}

fn count() {
    if COUNTED.try_with(Cell::get).unwrap_or(false) {
        CALLS.fetch_add(1, Relaxed);
    }
}

fn mark_counted() {
    COUNTED.with(|c| c.set(true));
}

/// Workers of a test's own pool that have run their exit handler.
static EXITED: AtomicUsize = AtomicUsize::new(0);

/// A pool worker's last call: its thread stops counting (what it frees on the way out is
/// not an allocation, and nothing after this belongs to a test).
fn worker_exited() {
    COUNTED.with(|c| c.set(false));
    EXITED.fetch_add(1, Relaxed);
}

/// Brings every worker of `pool` up and gives each its GEMM packing buffer (faer keeps one
/// per thread, made on the thread's first product), so that which worker happens to run
/// its first product during the measured steps does not matter.
fn warm(pool: &rayon::ThreadPool) {
    let a = Tensor::<f32>::ones(&[64, 64]).unwrap();
    pool.broadcast(|_| a.matmul(&a, 1).map(drop).unwrap());
}

// A global allocator cannot be written in safe code; this one serves this test only.
// SAFETY: every method forwards to `System` with the caller's arguments unchanged, so
// `System`'s guarantees carry over; the counter is a plain atomic.
unsafe impl GlobalAlloc for Counting {
    // SAFETY: the trait's contract passes through to `System::alloc` unchanged (see
    // `# Safety` in `GlobalAlloc::alloc`'s docs); the counter is a plain atomic.
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: the caller upholds `GlobalAlloc::alloc`'s contract, which we pass on.
        unsafe { System.alloc(layout) }
    }

    // SAFETY: as for `alloc`.
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        count();
        // SAFETY: as for `alloc`.
        unsafe { System.alloc_zeroed(layout) }
    }

    // SAFETY: as for `alloc`; `ptr` and `layout` go to `System` unchanged.
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from this allocator (hence from `System`) with `layout`.
        unsafe { System.dealloc(ptr, layout) }
    }

    // SAFETY: as for `dealloc`.
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        // SAFETY: `ptr` came from `System` with `layout`; the caller upholds the rest.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocation calls so far, on the test thread and every rayon worker.
fn allocations() -> usize {
    CALLS.load(Relaxed)
}

/// Runs `steps` training steps of `model` at `threads` threads and returns the heap
/// allocations made by the last `steps - warmup` of them, and the last loss.
fn train(
    threads: usize,
    model: &dyn Module<f32>,
    store: &mut ParamStore<f32>,
    opt: &mut dyn Optimizer<f32>,
    x: &Tensor<f32>,
    labels: &[usize],
    steps: usize,
) -> (usize, f32) {
    let warmup = 3;
    let schedule = CosineWarmup { base: 1e-2, min: 1e-4, warmup: 2, total: steps };
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(threads);
    let (mut before, mut loss) = (0, f32::NAN);
    for step in 0..steps {
        if step == warmup {
            before = allocations();
        }
        grads.zero();
        let store_ref = &*store;
        loss = graph
            .scope(|s| {
                let logits = model.forward(Ctx::train(s, store_ref), s.input(x));
                let loss = logits.cross_entropy(labels);
                s.backward_into(loss, &mut grads)?;
                loss.item()
            })
            .expect("the step succeeds");
        clip_grad_norm(store, &mut grads, 1.0).expect("grads match the store");
        opt.set_lr(schedule.lr(step));
        opt.step(store, &grads).expect("grads match the store");
    }
    (allocations() - before, loss)
}

#[test]
fn warmed_up_training_steps_allocate_nothing() {
    let _serial = serial();
    mark_counted();
    let mut rng = rand::rngs::StdRng::seed_from_u64(0);
    let labels: Vec<usize> = (0..32).map(|i| i % 10).collect();

    // An MLP with dropout, trained by Adam.
    let mut store = ParamStore::<f32>::new();
    let mlp = Mlp::builder(64).hidden(32).dropout(0.1, 7).output(10).build(&mut store, "mlp", &mut rng).unwrap();
    let x = Tensor::<f32>::normal(&[32, 64], 0.0, 1.0, &mut rng).unwrap();
    let mut adam = Adam::new(&store, 1e-2).unwrap();
    let (n, loss) = train(1, &mlp, &mut store, &mut adam, &x, &labels, 12);
    assert_eq!(n, 0, "an MLP step with Adam allocated {n} times");
    assert!(loss.is_finite());

    // Linear, LayerNorm, GELU: trained by SGD with Nesterov momentum and weight decay.
    let mut store = ParamStore::<f32>::new();
    let model = Sequential::new()
        .push(Linear::new(&mut store, "fc1", 64, 48, &mut rng).unwrap())
        .push(LayerNorm::new(&mut store, "ln", 48).unwrap())
        .push(Activation::Gelu)
        .push(Dropout::new(0.2, 3).unwrap())
        .push(Linear::new(&mut store, "fc2", 48, 10, &mut rng).unwrap());
    let mut sgd = Sgd::new(&store, 0.1).unwrap().momentum(0.9, true).unwrap().weight_decay(1e-4).unwrap();
    let (n, _) = train(1, &model, &mut store, &mut sgd, &x, &labels, 12);
    assert_eq!(n, 0, "a LayerNorm step with SGD allocated {n} times");

    // A small CNN, trained by AdamW.
    let mut store = ParamStore::<f32>::new();
    let cnn = Sequential::new()
        .push(Conv2d::new(&mut store, "c1", 1, 4, [3, 3], &mut rng).unwrap().padding([1, 1]))
        .push(Activation::Relu)
        .push(MaxPool2d::new(2))
        .push(Conv2d::new(&mut store, "c2", 4, 8, [3, 3], &mut rng).unwrap().padding([1, 1]).stride([2, 2]))
        .push(Activation::Relu)
        .push(AvgPool2d::new(2))
        .push(Flatten)
        .push(Linear::new(&mut store, "fc", 8, 10, &mut rng).unwrap());
    let images = Tensor::<f32>::normal(&[32, 1, 8, 8], 0.0, 1.0, &mut rng).unwrap();
    let mut adamw = AdamW::new(&store, 1e-2, 1e-2).unwrap();
    let (n, _) = train(1, &cnn, &mut store, &mut adamw, &images, &labels, 12);
    assert_eq!(n, 0, "a CNN step with AdamW allocated {n} times");

    // The MLP, whose products and activations are large enough to be split. Run
    // from a thread of the rayon pool, a step allocates nothing on any thread at any thread
    // count (the first steps warm up each pool thread's GEMM packing buffer).
    let labels: Vec<usize> = (0..128).map(|i| i % 10).collect();
    let x = Tensor::<f32>::normal(&[128, 64], 0.0, 1.0, &mut rng).unwrap();
    let mlp_run = |threads: usize, rng: &mut rand::rngs::StdRng| {
        let mut store = ParamStore::<f32>::new();
        let mlp = Mlp::builder(64).hidden(256).hidden(128).output(10).build(&mut store, "mlp", rng).unwrap();
        let mut adam = Adam::new(&store, 1e-3).unwrap();
        let (n, loss) = train(threads, &mlp, &mut store, &mut adam, &x, &labels, 12);
        assert!(loss.is_finite());
        n
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(4)
        .start_handler(|_| mark_counted())
        .exit_handler(|_| worker_exited())
        .build()
        .unwrap();
    warm(&pool);
    for threads in [1, 2, 4] {
        let n = pool.install(|| mlp_run(threads, &mut rng));
        assert_eq!(n, 0, "the 64-256-128-10 MLP at {threads} threads, inside the pool, allocated {n} times in 9 steps");
    }
    // From a thread outside the pool, each split op hands one job to rayon's shared queue,
    // which takes a new block of 63 job slots (one allocation) every 63 jobs: about 12
    // split ops per step here, so at most 2 allocations in 9 steps, never one per product.
    let n = mlp_run(2, &mut rng);
    assert!(n <= 2, "the 64-256-128-10 MLP at 2 threads, outside the pool, allocated {n} times in 9 steps");

    // A dropped pool's workers wind down on their own threads: wait until all four have
    // stopped counting, or their exit would land in the next test's measured steps.
    drop(pool);
    let start = std::time::Instant::now();
    while EXITED.load(Relaxed) < 4 {
        assert!(start.elapsed().as_secs() < 60, "the pool's workers did not exit");
        std::thread::yield_now();
    }
}

/// A `Sequential` checkpointed every 2 layers, dropout included: the view, the nested
/// scopes, the scratch arena and the recomputation reuse what the first steps set up.
#[test]
fn warmed_up_checkpointed_steps_allocate_nothing() {
    let _serial = serial();
    mark_counted();
    let mut rng = rand::rngs::StdRng::seed_from_u64(1);
    let labels: Vec<usize> = (0..16).map(|i| i % 10).collect();
    let mut store = ParamStore::<f32>::new();
    let mut model = Sequential::new();
    for i in 0..4 {
        model = model
            .push(Linear::new(&mut store, &format!("fc{i}"), 32, 32, &mut rng).unwrap())
            .push(Activation::Relu)
            .push(Dropout::new(0.1, i).unwrap());
    }
    let model = model.push(Linear::new(&mut store, "out", 32, 10, &mut rng).unwrap());
    let x = Tensor::<f32>::normal(&[16, 32], 0.0, 1.0, &mut rng).unwrap();
    let mut sgd = Sgd::new(&store, 0.05).unwrap();
    let mut grads = store.zeros_like().unwrap();
    let mut graph = Graph::<f32>::new();
    graph.set_threads(1);
    let mut counts = vec![];
    for _ in 0..10 {
        let before = allocations();
        grads.zero();
        let checkpointed = model.checkpointed(&store, 2).unwrap();
        graph
            .scope(|s| {
                let loss = checkpointed.forward(Ctx::train(s, &store), s.input(&x)).cross_entropy(&labels);
                s.backward_into(loss, &mut grads)
            })
            .expect("the step succeeds");
        sgd.step(&mut store, &grads).expect("grads match the store");
        counts.push(allocations() - before);
    }
    assert!(counts[3..].iter().all(|&c| c == 0), "allocations per step: {counts:?}");
    assert!(graph.stats().scratch.high_water > 0, "the groups ran on the scratch arena");
}
