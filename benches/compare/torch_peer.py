"""PyTorch side of `just compare`: the same child protocol as `tapir-compare child`.

Usage: python3 torch_peer.py WORKLOAD THREADS STEPS
Prints `INFO threads N`, `INFO version V` and one `RESULT metric value` line per figure.
With TORCH_PEER_COMPILE=1 it runs W1, W2 and W10 only, with the forward (and loss)
under `torch.compile`; the first calls, which compile, are timed on their own and
reported as `*_compile_s`, never mixed into the step time.
"""

import os
import resource
import statistics
import sys
import time


def _rss_now_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


import torch  # noqa: E402  (the RSS of the import itself is measured around it)

IMPORT_MIB = _rss_now_mib()
COMPILE = os.environ.get("TORCH_PEER_COMPILE") == "1"

CHAIN_OPS = 10_000
DIMS = [784, 1024, 1024, 10]
BATCH = 256
LR = 0.01


def emit(metric, value):
    print(f"RESULT {metric} {value}", flush=True)


def rss_mib():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def peak_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def w1():
    x = torch.randn(1024, 1024, requires_grad=True)
    forward = (lambda x: (x @ x).sum())
    if COMPILE:
        forward = torch.compile(forward)
        t = time.perf_counter()
        forward(x).backward()
        x.grad = None
        emit("w1_compile_s", time.perf_counter() - t)
    times, rss10 = [], float("nan")
    for i in range(1, 21):
        t = time.perf_counter()
        x.grad = None
        y = forward(x)
        y.backward()
        float(x.grad[0, 0])
        if i > 3:
            times.append((time.perf_counter() - t) * 1e3)
        if i == 10:
            rss10 = rss_mib()
    emit("w1_ms", statistics.median(times))
    emit("w1_peak_mib", peak_mib())
    emit("w1_growth_mib", rss_mib() - rss10)


class Mlp:
    def __init__(self):
        self.params = []
        for a, b in zip(DIMS, DIMS[1:]):
            w = (torch.randn(a, b) * (2.0 / a) ** 0.5).requires_grad_()
            self.params += [w, torch.zeros(b, requires_grad=True)]
        self.x = torch.randn(BATCH, DIMS[0])
        self.labels = torch.arange(BATCH) % DIMS[3]

    def loss(self, *params):
        h = self.x
        for i in range(0, len(params), 2):
            h = h @ params[i] + params[i + 1]
            if i + 2 < len(params):
                h = torch.relu(h)
        return torch.nn.functional.cross_entropy(h, self.labels)

    def step(self, loss_fn=None):
        loss = (loss_fn or self.loss)(*self.params)
        loss.backward()
        with torch.no_grad():
            for p in self.params:
                p -= LR * p.grad
                p.grad = None
        return loss.item()


def w2():
    m, times = Mlp(), []
    loss_fn = None
    if COMPILE:
        loss_fn = torch.compile(m.loss)
        t = time.perf_counter()
        m.step(loss_fn)
        emit("w2_compile_s", time.perf_counter() - t)
    for i in range(1, 16):
        t = time.perf_counter()
        m.step(loss_fn)
        if i > 3:
            times.append((time.perf_counter() - t) * 1e3)
    emit("w2_ms", statistics.median(times))
    emit("w2_peak_mib", peak_mib())


def w7():
    """The Hessian-vector product of W2's loss over all parameters by double backward
    (`create_graph=True`), beside the plain gradient; they alternate, 3 warm-up rounds."""
    m = Mlp()
    gen = torch.Generator().manual_seed(7)
    vs = [torch.randn(p.shape, generator=gen) for p in m.params]

    def loss():
        h = m.x
        for i in range(0, len(m.params), 2):
            h = h @ m.params[i] + m.params[i + 1]
            if i + 2 < len(m.params):
                h = torch.relu(h)
        return torch.nn.functional.cross_entropy(h, m.labels)

    def grad():
        gs = torch.autograd.grad(loss(), m.params)
        return float(gs[0][0, 0])

    def hvp():
        gs = torch.autograd.grad(loss(), m.params, create_graph=True)
        dot = sum((g * v).sum() for g, v in zip(gs, vs))
        hv = torch.autograd.grad(dot, m.params)
        return float(sum((h * v).sum() for h, v in zip(hv, vs)))

    gt, ht = [], []
    for i in range(1, 16):
        t = time.perf_counter()
        grad()
        t1 = time.perf_counter()
        hvp()
        t2 = time.perf_counter()
        if i > 3:
            gt.append((t1 - t) * 1e3)
            ht.append((t2 - t1) * 1e3)
    g, h = statistics.median(gt), statistics.median(ht)
    emit("w7_grad_ms", g)
    emit("w7_hvp_ms", h)
    emit("w7_hvp_over_grad", h / g)
    emit("w7_peak_mib", peak_mib())


def w5(steps):
    m, at = Mlp(), []
    for step in range(1, steps + 1):
        m.step()
        if step in (100, 1000, steps):
            at.append((step, rss_mib()))
    for step, rss in at:
        emit(f"w5_rss_{step}_mib", rss)
    emit("w5_growth_mib", at[-1][1] - at[0][1])


def chain(x, ops, op):
    y = x
    for i in range(ops):
        if op == "tanh":
            y = torch.tanh(y)
        elif i % 2 == 0:
            y = y * 0.999
        else:
            y = y + 0.001
    return y.sum()


def w3():
    for numel in (1, 1024):
        for op in ("tanh", "affine"):
            rec, bwd = [], []
            for i in range(7):
                x = torch.ones(numel, requires_grad=True)
                t0 = time.perf_counter()
                y = chain(x, CHAIN_OPS, op)
                t1 = time.perf_counter()
                y.backward()
                t2 = time.perf_counter()
                if i > 1:
                    rec.append((t1 - t0) * 1e9 / CHAIN_OPS)
                    bwd.append((t2 - t1) * 1e9 / CHAIN_OPS)
                del x, y
            emit(f"w3_{op}_{numel}_record_ns", statistics.median(rec))
            emit(f"w3_{op}_{numel}_backward_ns", statistics.median(bwd))


def w4():
    for nodes in (1_000, 10_000, 100_000, 1_000_000):
        down, total = [], []
        for _ in range(3 if nodes >= 1_000_000 else 5):
            x = torch.ones(1, requires_grad=True)
            t0 = time.perf_counter()
            y = chain(x, nodes - 2, "affine")
            y.backward()
            t1 = time.perf_counter()
            del y
            x.grad = None
            t2 = time.perf_counter()
            down.append((t2 - t1) * 1e6)
            total.append((t2 - t0) * 1e3)
        emit(f"w4_{nodes}_teardown_us", statistics.median(down))
        emit(f"w4_{nodes}_total_ms", statistics.median(total))


W8_WIDTH, W8_HIDDEN, W8_BATCH, W8_EVERY = 256, 32, 4096, 4


def w8(checkpoint):
    """W8: 32 hidden layers of 256 with ReLU, 256 classes, batch 4096, cross-entropy on
    labels i mod 256, one SGD step; with `torch.utils.checkpoint` (use_reentrant=False)
    around every 4 hidden layers when `checkpoint`."""
    from torch.utils.checkpoint import checkpoint as ckpt

    torch.manual_seed(8)
    params = []
    for _ in range(W8_HIDDEN + 1):
        w = (torch.randn(W8_WIDTH, W8_WIDTH) * (2.0 / W8_WIDTH) ** 0.5).requires_grad_()
        params.append((w, torch.zeros(W8_WIDTH, requires_grad=True)))
    x = torch.randn(W8_BATCH, W8_WIDTH)
    labels = torch.arange(W8_BATCH) % W8_WIDTH
    hidden, (wo, bo) = params[:-1], params[-1]

    def group(h, start):
        for w, b in hidden[start : start + W8_EVERY]:
            h = torch.relu(h @ w + b)
        return h

    def step():
        h = x
        for start in range(0, W8_HIDDEN, W8_EVERY):
            h = ckpt(group, h, start, use_reentrant=False) if checkpoint else group(h, start)
        loss = torch.nn.functional.cross_entropy(h @ wo + bo, labels)
        loss.backward()
        with torch.no_grad():
            for w, b in params:
                for p in (w, b):
                    p -= LR * p.grad
                    p.grad = None
        return loss.item()

    times = []
    for i in range(1, 7):
        t = time.perf_counter()
        step()
        if i > 2:
            times.append((time.perf_counter() - t) * 1e3)
    tag = "w8c" if checkpoint else "w8"
    emit(f"{tag}_ms", statistics.median(times))
    emit(f"{tag}_peak_mib", peak_mib())
    emit(f"{tag}_import_mib", IMPORT_MIB)


def w10(steps):
    """The `train_chars` model (crates/tapir-nn/examples/chars/gpt_torch.py): forward,
    cross-entropy, backward, clipping to norm 1, AdamW; batch 32 x 64 tokens."""
    here = os.path.dirname(os.path.abspath(__file__))
    sys.path.insert(0, os.path.join(here, "..", "..", "crates", "tapir-nn", "examples", "chars"))
    from gpt_torch import Gpt

    torch.manual_seed(0)
    model = Gpt()
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-3, betas=(0.9, 0.95), weight_decay=0.01)
    forward = torch.compile(model) if COMPILE else model
    x = torch.randint(0, 96, (32, 64))
    y = torch.randint(0, 96, (32, 64))

    def step():
        loss = torch.nn.functional.cross_entropy(forward(x).view(-1, 96), y.view(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        return loss.item()

    times, rss10 = [], float("nan")
    for i in range(1, steps + 1):
        t = time.perf_counter()
        step()
        if i > 3:
            times.append((time.perf_counter() - t) * 1e3)
        if i == 10:
            rss10 = rss_mib()
    ms = statistics.median(times)
    emit("w10_ms", ms)
    emit("w10_tokens_per_s", 32 * 64 / ms * 1e3)
    emit("w10_peak_mib", peak_mib())
    emit("w10_growth_mib", rss_mib() - rss10)
    emit("w10_import_mib", IMPORT_MIB)


W11_BATCH = 256


def w11():
    """W11: the `train_digits --cnn` model (conv 3x3 to 16, ReLU, max-pool 2, conv 3x3 to
    32, ReLU, max-pool 2, flatten, linear to 10) on a normal batch of 256 8x8 images,
    cross-entropy on labels `i mod 10`, one SGD step."""
    torch.manual_seed(11)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(1, 16, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(2),
        torch.nn.Flatten(),
        torch.nn.Linear(128, 10),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(W11_BATCH, 1, 8, 8)
    labels = torch.arange(W11_BATCH) % 10

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        return loss.item()

    times = []
    for i in range(1, 61):
        t = time.perf_counter()
        step()
        if i > 3:
            times.append((time.perf_counter() - t) * 1e3)
    emit("w11_ms", statistics.median(times))
    emit("w11_peak_mib", peak_mib())
    emit("w11_import_mib", IMPORT_MIB)


def main():
    workload, threads, w5_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(threads)
    sys.setrecursionlimit(10_000)
    print(f"INFO threads {torch.get_num_threads()}", flush=True)
    print(f"INFO version {torch.__version__}", flush=True)
    if COMPILE and workload not in ("W1", "W2", "W10"):
        return
    if COMPILE:
        try:
            torch.compile(lambda z: z + 1)(torch.ones(1))
        except Exception as e:  # no compiler toolchain: report and skip
            print(f"torch.compile unavailable: {e}", file=sys.stderr)
            return
    {
        "W1": w1,
        "W2": w2,
        "W3": w3,
        "W4": w4,
        "W5": lambda: w5(w5_steps),
        "W6": lambda: None,
        "W7": w7,
        "W10": lambda: w10(w5_steps),
        "W8": lambda: w8(False),
        "W8C": lambda: w8(True),
        "W11": w11,
    }[workload]()


if __name__ == "__main__":
    main()
