"""Memory stays flat with the collector off, for the three loops that leak in an eager
Python engine (a result pointing at the op that made it, the op's backward closure pointing
back at its inputs):

1. the seed loop: `x @ x` of a 1024×1024 float32 leaf, `.tanh().mean()`, backward, `x.grad`;
2. a loop that keeps every loss handle in a list;
3. a closure defined in the loop that captures a value and calls itself recursively,
   recording ops at each level.

RSS (resident pages × page size, from /proc/self/statm) is read after a warm-up and at
the end: growth must be ≤ 1 MiB. Each loop has a positive control, the same loop plus a
deliberate leak of 16 KiB per iteration (1.6 MiB per 100 iterations), that the same
measurement must flag, so a measurement that cannot see a leak cannot pass.
"""

import ctypes
import ctypes.util
import gc
import os
import time

import numpy as np
import pytest

import tapir

N = 2000  # measured iterations, after the warm-up
WARMUP = 50
LIMIT = 1 << 20  # 1 MiB
LEAK = 16 * 1024  # bytes per iteration in the positive controls
SIZE = 1024
PAGE = os.sysconf("SC_PAGE_SIZE")


try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    _malloc_trim = _libc.malloc_trim
except (OSError, AttributeError):  # not glibc
    _malloc_trim = None


def rss():
    """Resident bytes. glibc first hands back the free memory it holds (`malloc_trim`), so
    that its free lists (4 MiB gradients come and go each iteration) are not counted:
    only live memory is, and a leak is live memory."""
    if _malloc_trim is not None:
        _malloc_trim(0)
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE


def measure(name, loop, leak):
    """Runs `loop(iterations, hoard)` for WARMUP then N iterations with the collector off;
    returns the RSS growth (bytes) over the N, printing it with the time per iteration.
    Each loop writes its body inline, as a user would, so that a closure defined in the
    body is rebound (and the previous one freed) each iteration rather than left in a
    frame's reference cycle."""
    hoard = [] if leak else None
    was = gc.isenabled()
    gc.collect()
    gc.disable()
    try:
        loop(range(WARMUP), None)
        before = rss()
        t0 = time.perf_counter()
        trace = []
        for k in range(0, N, N // 4):
            loop(range(WARMUP + k, WARMUP + k + N // 4), hoard)
            trace.append(rss())
        elapsed = time.perf_counter() - t0
        after = trace[-1]
    finally:
        if was:
            gc.enable()
    growth = after - before
    print(
        f"\n{name}{' + leak (control)' if leak else ''}: {N} iterations, {elapsed:.1f} s "
        f"({1000 * elapsed / N:.1f} ms/iteration); RSS {before / 2**20:.1f} -> {after / 2**20:.1f} MiB, "
        f"growth {growth / 2**20:+.3f} MiB (per quarter: "
        + ", ".join(f"{(t - before) / 2**20:+.2f}" for t in trace)
        + ")"
    )
    return growth


def leak_into(hoard, i):
    if hoard is not None:
        hoard.append(bytes([i % 251 + 1]) * LEAK)  # written, so resident


def seed_loop():
    """Pattern 1: the seed loop, the real `x @ x`."""
    g = tapir.Graph(threads=2)
    x_data = np.random.default_rng(0).standard_normal((SIZE, SIZE), dtype=np.float32)
    checks = []

    def loop(iterations, hoard):
        for i in iterations:
            with g.scope() as s:
                x = s.leaf(x_data)
                y = (x @ x).tanh().mean()
                s.backward(y)
                dx = x.grad
                if i in (0, WARMUP + N - 1):
                    checks.append((y.item(), float(dx[0, 0])))
            leak_into(hoard, i)

    return loop, checks


def kept_handles_loop():
    """Pattern 2: every loss handle kept in a list (elementwise ops, 1024×1024)."""
    g = tapir.Graph(threads=2)
    x_data = np.random.default_rng(1).standard_normal((SIZE, SIZE), dtype=np.float32)
    kept = []

    def loop(iterations, hoard):
        for i in iterations:
            with g.scope() as s:
                x = s.leaf(x_data)
                loss = (x * x).tanh().mean()
                s.backward(loss)
                x.grad
                kept.append(loss)
            leak_into(hoard, i)

    return loop, kept


def recursive_closure_loop():
    """Pattern 3: a closure defined in the loop, capturing `x` (a handle), calling itself a
    few levels deep and recording ops at each level (1024×1024 elementwise)."""
    g = tapir.Graph(threads=2)
    x_data = np.random.default_rng(2).standard_normal((SIZE, SIZE), dtype=np.float32) * 0.5
    results = []

    def loop(iterations, hoard):
        for i in iterations:
            with g.scope() as s:
                x = s.leaf(x_data)

                def step(k, acc):
                    if k == 0:
                        return acc
                    return step(k - 1, (acc * x).tanh() + x)  # captures x, and itself

                loss = step(3, x).mean()
                s.backward(loss)
                results.append(float(x.grad[0, 0]))
                del results[:-1]
            leak_into(hoard, i)

    return loop, results


@pytest.mark.parametrize("leak", [False, True], ids=["flat", "control"])
def test_seed_loop_memory_is_flat(leak):
    step, checks = seed_loop()
    growth = measure("seed loop (x @ x, 1024x1024)", step, leak)
    # The loop computed something real, the same in the first and last iteration.
    assert len(checks) == 2 and checks[0] == checks[1] and np.isfinite(checks[0][0])
    if leak:
        assert growth > LIMIT, f"the control's leak of {N * LEAK} bytes was not seen: growth {growth} bytes"
    else:
        assert growth <= LIMIT, f"RSS grew by {growth / 2**20:.3f} MiB over {N} iterations"


@pytest.mark.parametrize("leak", [False, True], ids=["flat", "control"])
def test_kept_handles_memory_is_flat(leak):
    step, kept = kept_handles_loop()
    growth = measure("every loss handle kept", step, leak)
    assert len(kept) == WARMUP + N
    with pytest.raises(tapir.ScopeError):
        kept[0].item()
    if leak:
        assert growth > LIMIT, f"the control's leak of {N * LEAK} bytes was not seen: growth {growth} bytes"
    else:
        assert growth <= LIMIT, f"RSS grew by {growth / 2**20:.3f} MiB over {N} iterations"


@pytest.mark.parametrize("leak", [False, True], ids=["flat", "control"])
def test_recursive_closure_memory_is_flat(leak):
    step, results = recursive_closure_loop()
    growth = measure("recursive closure capturing x", step, leak)
    assert len(results) == 1 and np.isfinite(results[0])
    if leak:
        assert growth > LIMIT, f"the control's leak of {N * LEAK} bytes was not seen: growth {growth} bytes"
    else:
        assert growth <= LIMIT, f"RSS grew by {growth / 2**20:.3f} MiB over {N} iterations"
