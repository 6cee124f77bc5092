"""The binding's cost, side by side in one run (issue 32's benchmark; `just compare-py`).

W3 from Python: a leaf of 1 (or 1,024) float32 elements, a chain of 10,000 `tanh`, sum,
backward; ns per op for recording and for backward, against the same chain from Rust
(`benches` example `w3_profile`, run as a subprocess in the same repetition) and PyTorch
eager. W2 from Python: the MLP 784-1024-1024-10 step (ReLU, batch 256, cross-entropy,
backward, SGD), against Rust's (`w2_time`) and PyTorch's. Repetitions alternate the
systems; medians are printed. Each system runs in a child process of its own (tapir-py
without torch imported, torch without tapir), with OpenBLAS at one thread: the OpenMP
workers of torch and NumPy's OpenBLAS threads spin after use, and in one process they
took a core from tapir-py's next measurement.

    python bench/compare_py.py THREADS REPS   # from crates/tapir-py, with the release build
"""

import os
import re
import statistics
import subprocess
import sys
import time

CHILD = sys.argv[1] == "--child" if len(sys.argv) > 1 else False
ARGS = sys.argv[2:] if CHILD else sys.argv[1:]
THREADS = int(ARGS[0]) if len(ARGS) > 0 else 1
REPS = int(ARGS[1]) if len(ARGS) > 1 else 7
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))
os.environ.setdefault("MKL_NUM_THREADS", str(THREADS))
os.environ["OPENBLAS_NUM_THREADS"] = "1"

import numpy as np  # noqa: E402

SYSTEM = ARGS[2] if CHILD else None
if SYSTEM == "tapir-py":
    import tapir
elif SYSTEM == "torch":
    import torch

    torch.set_num_threads(THREADS)

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
BIN = os.path.join(ROOT, "target", "release", "examples")
CHAIN = 10_000
if SYSTEM == "tapir-py":
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
    out = subprocess.run([os.path.join(BIN, "w3_profile"), "tanh", "both", "5", str(numel)], capture_output=True, text=True, check=True).stdout
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


def child():
    """One system's measurements, printed as `w3 NUMEL RECORD BACKWARD` and `w2 MS`."""
    if SYSTEM == "tapir-py":
        g = tapir.Graph(threads=1)
        w3, w2 = (lambda n: tapir_w3(g, n)), tapir_w2
    else:
        w3, w2 = torch_w3, torch_w2
    for numel in (1, 1024):
        # Warm-up: Tapir's arena grows to the chain's size in the first scope and merges its
        # chunks into one in the second; PyTorch's caching allocator fills.
        w3(numel)
        w3(numel)
        print("w3", numel, *w3(numel))
    print("w2", w2())


def run_child(system):
    env = dict(os.environ, OMP_NUM_THREADS=str(THREADS), MKL_NUM_THREADS=str(THREADS))
    out = subprocess.run([sys.executable, __file__, "--child", str(THREADS), "1", system], capture_output=True, text=True, env=env)
    if out.returncode != 0:
        if system == "torch":
            return None  # no PyTorch in this environment
        raise RuntimeError(out.stderr)
    w3, w2 = {}, None
    for line in out.stdout.splitlines():
        f = line.split()
        if f[0] == "w3":
            w3[int(f[1])] = (float(f[2]), float(f[3]))
        elif f[0] == "w2":
            w2 = float(f[1])
    return w3, w2


def main():
    rows, w2 = {}, {"tapir-py": [], "rust": [], "torch": []}
    for rep in range(REPS):
        # Rotate the order every repetition, so that no system always runs first.
        order = ["tapir-py", "rust", "torch"][rep % 3 :] + ["tapir-py", "rust", "torch"][: rep % 3]
        for name in order:
            if name == "rust":
                r = ({n: rust_w3(n) for n in (1, 1024)}, rust_w2())
            else:
                r = run_child(name)
            if r is None:
                continue
            for numel, v in r[0].items():
                rows.setdefault((numel, name), []).append(v)
            w2[name].append(r[1])
    torch_version = subprocess.run(
        [sys.executable, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    print(f"# {time.strftime('%Y-%m-%d %H:%M')} threads {THREADS} reps {REPS} python {sys.version.split()[0]} torch {torch_version or '-'}")
    print("W3 tanh, ns/op (median)   record   backward   total")
    for (numel, name), v in sorted(rows.items()):
        rec, bwd = statistics.median(a for a, _ in v), statistics.median(b for _, b in v)
        print(f"  [{numel:>4}] {name:<9} {rec:>10.1f} {bwd:>10.1f} {rec + bwd:>8.1f}")
    for numel in (1, 1024):
        tot = {n: statistics.median(a + b for a, b in rows[(numel, n)]) for (k, n) in rows if k == numel}
        line = f"  [{numel:>4}] binding cost (py - rust) {tot['tapir-py'] - tot['rust']:.1f} ns/op"
        if "torch" in tot:
            line += f", tapir-py / torch {tot['tapir-py'] / tot['torch']:.3f}"
        print(line)
    med = {k: statistics.median(v) for k, v in w2.items() if v}
    print("W2 ms/step (median): " + ", ".join(f"{k} {v:.2f}" for k, v in med.items()) + f"; py/rust {med['tapir-py'] / med['rust']:.3f}")


if __name__ == "__main__":
    child() if CHILD else main()
