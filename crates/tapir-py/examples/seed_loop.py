"""The seed loop: `x @ x` of a 1024×1024 float32 leaf, `.tanh().mean()`, backward, and
`x.grad`, 500 times with the garbage collector off, printing the process's resident memory
every 50 iterations. In an eager Python engine this loop leaks (each result points at the
op that made it, whose backward closure points back at its inputs); here the RSS stays flat:
each `with` block's arena is reused by the next, and a handle holds no graph memory.

    python crates/tapir-py/examples/seed_loop.py [--iterations N] [--threads N]
"""

import argparse
import gc
import os
import time

import numpy as np

import tapir

PAGE = os.sysconf("SC_PAGE_SIZE")


def rss_mib():
    """Resident memory of this process (resident pages × page size), in MiB."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE / 2**20


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=500)
    p.add_argument("--size", type=int, default=1024)
    p.add_argument("--threads", type=int, default=None, help="matrix-product threads (default: all)")
    args = p.parse_args()

    gc.disable()  # nothing to collect: the point of the exercise
    g = tapir.Graph(threads=args.threads)  # float32; one dtype per graph
    x_data = np.random.default_rng(0).standard_normal((args.size, args.size), dtype=np.float32)
    start = time.perf_counter()
    first = None
    for step in range(args.iterations):
        with g.scope() as s:  # one iteration
            x = s.leaf(x_data)  # copied into the arena once
            y = (x @ x).tanh().mean()
            s.backward(y)
            dx = x.grad  # a new NumPy array
            loss = y.item()
        if step % 50 == 0 or step == args.iterations - 1:
            rss = rss_mib()
            first = first if first is not None else rss
            print(
                f"step {step:4d}  loss {loss:.6f}  |dx| {float(np.abs(dx).sum()):.4f}  RSS {rss:7.1f} MiB "
                f"({rss - first:+.1f})  {time.perf_counter() - start:6.1f} s"
            )
    st = g.stats()
    print(f"arena: {st['arena_capacity'] / 2**20:.1f} MiB kept between scopes, high-water {st['arena_high_water'] / 2**20:.1f} MiB")


if __name__ == "__main__":
    main()
