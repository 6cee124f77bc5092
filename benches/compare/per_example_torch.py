"""PyTorch twin of `benches/examples/per_example.rs`: the W2 MLP (784-1024-1024-10, ReLU,
cross-entropy) at batch 256, its ordinary step, the same step as DP-SGD without noise with
per-example gradients from `torch.func.vmap(grad)` (norms, clipping to 1.0, the clipped
sum, SGD), and the materialised per-example gradients at batch 32.

    python benches/compare/per_example_torch.py THREADS REPS

Same timing rule as the Rust side: each repetition times 8 calls of each after 2 warm-up
calls and keeps the median; printed are the medians over repetitions, in ms.
"""

import sys
import time

import torch
from torch.func import functional_call, grad, vmap

DIMS = [784, 1024, 1024, 10]
BATCH = 256
LR = 0.01


def median(v):
    v = sorted(v)
    return v[len(v) // 2]


def timed(calls, f):
    for _ in range(2):
        f()
    t = []
    for _ in range(calls):
        s = time.perf_counter()
        f()
        t.append((time.perf_counter() - s) * 1e3)
    return median(t)


def main():
    threads = int(sys.argv[1]) if len(sys.argv) > 1 else 1
    reps = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    torch.set_num_threads(threads)
    torch.manual_seed(2)
    layers = []
    for a, b in zip(DIMS, DIMS[1:]):
        lin = torch.nn.Linear(a, b)
        torch.nn.init.normal_(lin.weight, 0.0, (2.0 / a) ** 0.5)
        torch.nn.init.zeros_(lin.bias)
        layers += [lin, torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers[:-1])
    x = torch.randn(BATCH, DIMS[0])
    y = torch.arange(BATCH) % DIMS[-1]
    params = {k: v.detach() for k, v in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=LR)

    def step():
        opt.zero_grad(set_to_none=False)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()

    def one_loss(p, xe, ye):
        out = functional_call(model, p, (xe.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, ye.unsqueeze(0))

    per_example = vmap(grad(one_loss), in_dims=(None, 0, 0))

    def dp_step(max_norm=1.0):
        g = per_example(params, x, y)
        norms = torch.sqrt(sum((v.reshape(BATCH, -1) ** 2).sum(1) for v in g.values()))
        scale = (max_norm / norms).clamp(max=1.0)
        with torch.no_grad():
            for k, p in model.named_parameters():
                clipped = torch.einsum("b,b...->...", scale, g[k]) / BATCH
                p.sub_(LR * clipped)

    def grads32():
        return per_example(params, x[:32], y[:32])

    r = [[], [], []]
    for rep in range(reps):
        order = [0, 1, 2] if rep % 2 == 0 else [2, 1, 0]
        for i in order:
            f = [step, dp_step, grads32][i]
            r[i].append(timed(8, f))
    a, b, c = (median(v) for v in r)
    print(f"threads {threads}, {reps} repetitions, torch {torch.__version__}")
    print(f"torch step {a:.2f} ms, dp-sgd step (vmap(grad)) {b:.2f} ms, dp/step {b / a:.3f}, "
          f"per-example grads at batch 32 (vmap(grad)) {c:.2f} ms")


if __name__ == "__main__":
    main()
