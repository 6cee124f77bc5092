"""Training steps of a small GPT (`tapir.nn.GPT`, GPT-2's block: pre-LayerNorm, causal
multi-head attention, a GELU MLP, residuals, tied embeddings) on the bytes of this file, with
AdamW and gradient clipping. Each step is one `with graph.scope()` block; parameters live in
a ParamStore.

    python crates/tapir-py/examples/gpt_step.py [--steps N] [--layers N] [--width C]

The loss starts near ln(vocab) (uniform guesses) and falls as the model learns the text.
"""

import argparse
import math
import time
from pathlib import Path

import numpy as np

import tapir

VOCAB = 128  # ASCII


def text_tokens():
    data = Path(__file__).read_bytes()
    return np.frombuffer(data, np.uint8).astype(np.int64) % VOCAB


def batches(tokens, batch, context, rng):
    while True:
        starts = rng.integers(0, len(tokens) - context - 1, batch)
        x = np.stack([tokens[i : i + context] for i in starts])
        y = np.stack([tokens[i + 1 : i + context + 1] for i in starts])
        yield x, y


def train(steps=30, layers=2, width=64, heads=4, context=32, batch=8, lr=3e-3, seed=0, threads=None, log=print):
    """Runs `steps` training steps; returns the losses."""
    rng = np.random.default_rng(seed)
    store = tapir.ParamStore()
    model = tapir.nn.GPT(store, VOCAB, context, width, heads, layers, rng=rng)
    opt = tapir.optim.AdamW(store, lr=lr, weight_decay=0.01)
    grads = store.zeros_like()
    g = tapir.Graph(threads=threads)
    data = batches(text_tokens(), batch, context, rng)
    losses = []
    log(f"GPT: {layers} layers, width {width}, {heads} heads, context {context}; {store.numel():,} parameters")
    for step in range(steps):
        x, y = next(data)
        t0 = time.perf_counter()
        grads.zero()
        with g.scope() as s:
            loss = model.loss(s, x, y)
            s.backward_into(loss, grads)
            losses.append(loss.item())
        norm = tapir.optim.clip_grad_norm(store, grads, 1.0)
        opt.step(store, grads)
        log(f"step {step:3d}  loss {losses[-1]:.4f}  grad norm {norm:7.3f}  {1000 * (time.perf_counter() - t0):6.1f} ms")
    return losses


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--context", type=int, default=32)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=None)
    args = p.parse_args()
    losses = train(args.steps, args.layers, args.width, args.heads, args.context, args.batch, threads=args.threads)
    print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f} (ln {VOCAB} = {math.log(VOCAB):.3f})")


if __name__ == "__main__":
    main()
