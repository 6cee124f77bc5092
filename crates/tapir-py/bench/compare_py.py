"""The binding's cost, side by side in one run (issue 32's benchmark; `just compare-py`).

W3 from Python: a leaf of 1 (or 1,024) float32 elements, a chain of 10,000 `tanh`, sum,
backward; ns per op for recording and for backward, against the same chain from Rust
(`benches` example `w3_profile`, run as a subprocess in the same repetition) and PyTorch
eager. W2 from Python: the MLP 784-1024-1024-10 step (ReLU, batch 256, cross-entropy,
backward, SGD), against Rust's (`w2_time`) and PyTorch's. One process per thread count.
Repetitions alternate the systems; medians are printed.

    python bench/compare_py.py THREADS REPS   # from crates/tapir-py, with the release build
"""

import os
import re
import statistics
import subprocess
import sys
import time

THREADS = int(sys.argv[1]) if len(sys.argv) > 1 else 1
REPS = int(sys.argv[2]) if len(sys.argv) > 2 else 7
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(THREADS))

import numpy as np  # noqa: E402

import tapir  # noqa: E402

try:
    import torch  # noqa: E402

    torch.set_num_threads(THREADS)
except ImportError:
    torch = None

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.join(ROOT, "target", "release", "examples")
CHAIN = 10_000
tapir.init_threads(THREADS)


def tapir_w3(g, numel):
    x0 = np.full(numel, 0.5, np.float32)
    t0 = time.perf_counter()
    with g.scope() as s:
        y = x = s.leaf(x0)
        for _ in range(CHAIN):
            y = y.tanh()
        loss = y.sum()
        t1 = time.perf_counter()
        s.backward(loss)
        t2 = time.perf_counter()
    return (t1 - t0) * 1e9 / CHAIN, (t2 - t1) * 1e9 / CHAIN


def torch_w3(numel):
    x = torch.full((numel,), 0.5, requires_grad=True)
    t0 = time.perf_counter()
    y = x
    for _ in range(CHAIN):
        y = y.tanh()
    loss = y.sum()
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    return (t1 - t0) * 1e9 / CHAIN, (t2 - t1) * 1e9 / CHAIN


def rust_w3(numel):
    out = subprocess.run([os.path.join(BIN, "w3_profile"), "tanh", "both", "3", str(numel)], capture_output=True, text=True, check=True).stdout
    m = re.search(r"record ([\d.]+) ns/op, backward ([\d.]+) ns/op", out)
    return float(m.group(1)), float(m.group(2))


def w2_data():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((256, 784), dtype=np.float32)
    labels = rng.integers(0, 10, 256)
    return x, labels


def tapir_w2(steps=12):
    x, labels = w2_data()
    store = tapir.ParamStore()
    mlp = tapir.nn.MLP(store, [784, 1024, 1024, 10], rng=np.random.default_rng(1))
    opt = tapir.optim.SGD(store, 0.01)
    grads = store.zeros_like()
    g = tapir.Graph(threads=THREADS)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        grads.zero()
        with g.scope() as s:
            loss = mlp(s, s.input(x)).cross_entropy(labels)
            s.backward_into(loss, grads)
        opt.step(store, grads)
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def torch_w2(steps=12):
    x, labels = w2_data()
    x, labels = torch.from_numpy(x), torch.from_numpy(labels)
    model = torch.nn.Sequential(
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)
    )
    opt = torch.optim.SGD(model.parameters(), 0.01)
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), labels).backward()
        opt.step()
        if i >= 3:
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def rust_w2():
    out = subprocess.run([os.path.join(BIN, "w2_time"), str(THREADS), "1"], capture_output=True, text=True, check=True).stdout
    return float(re.search(r"W2 tapir ([\d.]+) ms", out).group(1))


def main():
    rows = {}
    g = tapir.Graph(threads=1)
    for numel in (1, 1024):
        for rep in range(REPS):
            for name, f in (("tapir-py", lambda: tapir_w3(g, numel)), ("rust", lambda: rust_w3(numel)), ("torch", lambda: torch_w3(numel) if torch else None)):
                r = f()
                if r:
                    rows.setdefault((numel, name), []).append(r)
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} threads {THREADS} reps {REPS} python {sys.version.split()[0]} torch {torch.__version__ if torch else '-'}")
    print("W3 tanh, ns/op (median)   record   backward   total")
    for (numel, name), v in rows.items():
        rec, bwd = statistics.median(a for a, _ in v), statistics.median(b for _, b in v)
        print(f"  [{numel:>4}] {name:<9} {rec:>10.1f} {bwd:>10.1f} {rec + bwd:>8.1f}")
    for numel in (1, 1024):
        tot = {n: statistics.median(a + b for a, b in rows[(numel, n)]) for (k, n) in rows if k == numel}
        line = f"  [{numel:>4}] binding cost (py - rust) {tot['tapir-py'] - tot['rust']:.1f} ns/op"
        if "torch" in tot:
            line += f", tapir-py / torch {tot['tapir-py'] / tot['torch']:.3f}"
        print(line)
    w2 = {"tapir-py": [], "rust": [], "torch": []}
    for rep in range(REPS):
        w2["tapir-py"].append(tapir_w2())
        w2["rust"].append(rust_w2())
        if torch:
            w2["torch"].append(torch_w2())
    med = {k: statistics.median(v) for k, v in w2.items() if v}
    print("W2 ms/step (median): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + f"; py/rust {med['tapir-py'] / med['rust']:.3f}")


if __name__ == "__main__":
    main()
