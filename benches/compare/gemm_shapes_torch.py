"""W10's fifteen GEMM shapes with PyTorch's addmm_, one thread: the peer of
`cargo run --release -p benches --example gemm_shapes` (same shapes, order and timing)."""
import time

import torch

torch.set_num_threads(1)
SHAPES = [
    ("fwd qkv", 2048, 128, 384, 0, 0), ("fwd proj", 2048, 128, 128, 0, 0), ("fwd fc", 2048, 128, 512, 0, 0),
    ("fwd down", 2048, 512, 128, 0, 0), ("fwd head", 2048, 128, 96, 0, 1),
    ("dA qkv", 2048, 384, 128, 0, 1), ("dA proj", 2048, 128, 128, 0, 1), ("dA fc", 2048, 512, 128, 0, 1),
    ("dA down", 2048, 128, 512, 0, 1), ("dA head", 2048, 96, 128, 0, 0),
    ("dB qkv", 128, 2048, 384, 1, 0), ("dB proj", 128, 2048, 128, 1, 0), ("dB fc", 128, 2048, 512, 1, 0),
    ("dB down", 512, 2048, 128, 1, 0), ("dB head", 96, 2048, 128, 1, 0),
]
total = 0.0
for name, m, k, n, at, bt in SHAPES:
    a = torch.rand(k, m).t() if at else torch.rand(m, k)
    b = torch.rand(n, k).t() if bt else torch.rand(k, n)
    c = torch.zeros(m, n)
    best = float("inf")
    for _ in range(3):
        t = time.perf_counter()
        for _ in range(40):
            c.addmm_(a, b)
        best = min(best, (time.perf_counter() - t) / 40)
    total += best * (1 if name.endswith("head") else 4)
    print(f"{name:10} m {m:5} k {k:5} n {n:5}  {best * 1e3:8.3f} ms  {2 * m * k * n / best / 1e9:6.1f} GFLOP/s")
print(f"total per step (x4 layers): {total * 1e3:.1f} ms")
