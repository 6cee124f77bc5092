"""JAX side of `just compare`: W1 and W2 as `jax.jit`-compiled steps, the same child
protocol as `tapir-compare child`.

Usage: python3 jax_peer.py WORKLOAD THREADS STEPS
Prints `INFO threads N`, `INFO version V` and one `RESULT metric value` line per figure.
Step times are taken after compilation and end with `block_until_ready()`; the compile
time (tracing, lowering and XLA compilation of the step) is reported as its own figure.
"""

import os
import sys

WORKLOAD, THREADS = sys.argv[1], int(sys.argv[2])

# XLA's CPU runtime sizes its thread pool from the CPUs this process may run on: pin the
# process to THREADS of them before jax is imported, and keep Eigen to as many.
try:
    cpus = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, cpus[: max(1, THREADS)])
except (AttributeError, OSError):
    pass
os.environ.setdefault(
    "XLA_FLAGS",
    f"--xla_cpu_multi_thread_eigen={'true' if THREADS > 1 else 'false'} intra_op_parallelism_threads={THREADS}",
)
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

DIMS = [784, 1024, 1024, 10]
BATCH = 256
LR = 0.01


def emit(metric, value):
    print(f"RESULT {metric} {value}", flush=True)


def timed(step, args, iters, warm=3):
    """Median ms of `iters` calls after `warm` untimed ones; `step` returns new args."""
    for _ in range(warm):
        args = step(*args)
        jax.block_until_ready(args)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        args = step(*args)
        jax.block_until_ready(args)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def compile_s(fn, *args):
    t = time.perf_counter()
    compiled = jax.jit(fn).lower(*args).compile()
    return compiled, time.perf_counter() - t


def w1():
    x = jax.random.normal(jax.random.PRNGKey(1), (1024, 1024), jnp.float32)

    def step(x):
        y, dx = jax.value_and_grad(lambda x: (x @ x).sum())(x)
        return x, y, dx[0, 0]

    compiled, secs = compile_s(step, x)
    emit("w1_compile_s", secs)
    emit("w1_ms", timed(lambda x, y, d: compiled(x), (x, 0.0, 0.0), 17))


def w2():
    key = jax.random.PRNGKey(2)
    params = []
    for a, b in zip(DIMS, DIMS[1:]):
        key, k = jax.random.split(key)
        params += [jax.random.normal(k, (a, b), jnp.float32) * (2.0 / a) ** 0.5, jnp.zeros((b,), jnp.float32)]
    key, k = jax.random.split(key)
    x = jax.random.normal(k, (BATCH, DIMS[0]), jnp.float32)
    labels = jnp.arange(BATCH) % DIMS[3]

    def loss_fn(params):
        h = x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            if i + 2 < len(params):
                h = jax.nn.relu(h)
        logp = jax.nn.log_softmax(h, axis=-1)
        return -jnp.take_along_axis(logp, labels[:, None], axis=1).mean()

    def step(params):
        loss, grads = jax.value_and_grad(loss_fn)(params)
        return [p - LR * g for p, g in zip(params, grads)], loss

    compiled, secs = compile_s(step, params)
    emit("w2_compile_s", secs)
    emit("w2_ms", timed(lambda p, loss: compiled(p), (params, 0.0), 12))


def main():
    print(f"INFO threads {THREADS}", flush=True)
    print(f"INFO version jax {jax.__version__}", flush=True)
    {"W1": w1, "W2": w2}.get(WORKLOAD, lambda: None)()


if __name__ == "__main__":
    main()
