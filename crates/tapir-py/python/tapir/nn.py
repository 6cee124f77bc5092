"""Layers over a ``ParamStore``. A layer holds parameter names, never values or handles:
``layer(s, x)`` reads its parameters into the scope ``s`` and records its ops there.

    store = tapir.ParamStore()
    mlp = tapir.nn.MLP(store, [784, 128, 10], rng=np.random.default_rng(0))
    with g.scope() as s:
        loss = mlp(s, s.input(x)).cross_entropy(labels)
"""

import math

import numpy as np

__all__ = ["Linear", "MLP"]


class Linear:
    """``y = x @ w + b`` with ``w`` of shape ``[fan_in, fan_out]``, initialised as
    ``torch.nn.Linear`` does (uniform in ``±1/sqrt(fan_in)``)."""

    def __init__(self, store, name, fan_in, fan_out, rng=None, bias=True):
        rng = rng if rng is not None else np.random.default_rng()
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        dtype = np.dtype(store.dtype)
        self.w = f"{name}.weight"
        self.b = f"{name}.bias" if bias else None
        store.add(self.w, rng.uniform(-bound, bound, (fan_in, fan_out)).astype(dtype))
        if bias:
            store.add(self.b, rng.uniform(-bound, bound, (fan_out,)).astype(dtype))
        self.store = store

    def __call__(self, s, x):
        w = s.param(self.store, self.w)
        if self.b is None:
            return x @ w
        return x.linear(w, s.param(self.store, self.b))


class MLP:
    """Linear layers of sizes ``sizes`` with ``activation`` (a ``Var`` method name)
    between them, none after the last."""

    def __init__(self, store, sizes, rng=None, activation="relu", name="mlp"):
        rng = rng if rng is not None else np.random.default_rng()
        self.layers = [
            Linear(store, f"{name}.{i}", a, b, rng) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))
        ]
        self.activation = activation

    def __call__(self, s, x):
        for i, layer in enumerate(self.layers):
            x = layer(s, x)
            if i + 1 < len(self.layers):
                x = getattr(x, self.activation)()
        return x
