"""Training steps of a small GPT (GPT-2's block: pre-LayerNorm, causal multi-head attention,
a GELU MLP, residuals, tied embeddings) on the bytes of this file, with AdamW and gradient
clipping. Each step is one `with graph.scope()` block; parameters live in a ParamStore.

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


class GPT:
    """Parameter names and the forward pass; values live in `store`."""

    def __init__(self, store, layers=2, width=64, heads=4, context=32, rng=None):
        rng = rng if rng is not None else np.random.default_rng(0)
        self.store, self.layers, self.width, self.heads, self.context = store, layers, width, heads, context
        c = width

        def add(name, shape, std=0.02, value=None):
            a = np.full(shape, value, np.float32) if value is not None else rng.normal(0.0, std, shape)
            store.add(name, a.astype(np.float32))

        add("wte", (VOCAB, c))
        add("wpe", (context, c), std=0.01)
        proj_std = 0.02 / math.sqrt(2 * layers)  # GPT-2's scaled residual projections
        for i in range(layers):
            add(f"h{i}.ln1.w", (c,), value=1.0)
            add(f"h{i}.ln1.b", (c,), value=0.0)
            add(f"h{i}.attn.qkv.w", (c, 3 * c))
            add(f"h{i}.attn.qkv.b", (3 * c,), value=0.0)
            add(f"h{i}.attn.proj.w", (c, c), std=proj_std)
            add(f"h{i}.attn.proj.b", (c,), value=0.0)
            add(f"h{i}.ln2.w", (c,), value=1.0)
            add(f"h{i}.ln2.b", (c,), value=0.0)
            add(f"h{i}.mlp.fc.w", (c, 4 * c))
            add(f"h{i}.mlp.fc.b", (4 * c,), value=0.0)
            add(f"h{i}.mlp.proj.w", (4 * c, c), std=proj_std)
            add(f"h{i}.mlp.proj.b", (c,), value=0.0)
        add("lnf.w", (c,), value=1.0)
        add("lnf.b", (c,), value=0.0)

    def __call__(self, s, tokens):
        """Logits `[B·T, VOCAB]` for int tokens `[B, T]`, recorded in scope `s`."""
        b, t = tokens.shape
        p = lambda name: s.param(self.store, name)  # noqa: E731
        wte = p("wte")
        x = wte.index_select(0, tokens.reshape(-1)).reshape(b, t, self.width)  # embedding lookup
        x = x + p("wpe").narrow(0, 0, t)  # [T, C] broadcast over the batch
        for i in range(self.layers):
            h = x.layer_norm(p(f"h{i}.ln1.w"), p(f"h{i}.ln1.b"))
            qkv = h.linear(p(f"h{i}.attn.qkv.w"), p(f"h{i}.attn.qkv.b"))  # [B, T, 3C]
            att = qkv.attention_weights(self.heads, causal=True)  # [B, H, T, T]
            x = x + att.attend(qkv).linear(p(f"h{i}.attn.proj.w"), p(f"h{i}.attn.proj.b"))
            h = x.layer_norm(p(f"h{i}.ln2.w"), p(f"h{i}.ln2.b"))
            h = h.linear(p(f"h{i}.mlp.fc.w"), p(f"h{i}.mlp.fc.b")).gelu_tanh()
            x = x + h.linear(p(f"h{i}.mlp.proj.w"), p(f"h{i}.mlp.proj.b"))
        x = x.layer_norm(p("lnf.w"), p("lnf.b"))
        return (x @ wte.T).reshape(b * t, VOCAB)  # tied output embedding


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
    model = GPT(store, layers, width, heads, context, rng)
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
            loss = model(s, x).cross_entropy(y.reshape(-1))
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
