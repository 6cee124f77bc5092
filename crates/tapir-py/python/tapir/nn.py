"""Layers over a ``ParamStore``. A layer holds parameter names, never values or handles:
``layer(s, x)`` reads its parameters into the scope ``s`` and records its ops there.

    store = tapir.ParamStore()
    mlp = tapir.nn.MLP(store, [784, 128, 10], rng=np.random.default_rng(0))
    with g.scope() as s:
        loss = mlp(s, s.input(x)).cross_entropy(labels)

Parameters are named ``"{name}.weight"``, ``"{name}.bias"`` as in PyTorch, and have
PyTorch's shapes, except that a linear map's weight is ``[in, out]`` (Tapir's ``linear``
takes it that way round, so no transpose is recorded): a ``torch.nn.Linear`` weight loads
as ``weight.T``. Initialisations are PyTorch's, as each class says. A constructor given a
bad size raises ``ArgumentError`` naming the layer and the sizes; a call with an input of
the wrong shape raises the engine's error (``ShapeError`` or ``ArgumentError``, both
``ValueError``s), which names the op and every shape.
"""

import math

import numpy as np

from . import _errors, _tapir

__all__ = [
    "Module",
    "Linear",
    "MLP",
    "Embedding",
    "LayerNorm",
    "Dropout",
    "Conv2d",
    "MaxPool2d",
    "AvgPool2d",
    "Flatten",
    "CausalSelfAttention",
    "TransformerBlock",
    "GPT",
]

_Rng = np.random.Generator | None


# ------------------------------------------------------------------------- helpers


def _is_int(v) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, bool)


def _positive(layer: str, **sizes) -> None:
    """Raises ``ArgumentError`` unless every size is a positive integer."""
    if all(_is_int(v) and v > 0 for v in sizes.values()):
        return
    listed = [f"{k} {v if _is_int(v) else repr(v)}" for k, v in sizes.items()]
    if len(listed) == 1:
        raise _errors.ArgumentError(f"{layer}: {listed[0]} must be a positive integer")
    raise _errors.ArgumentError(f"{layer}: {', '.join(listed[:-1])} and {listed[-1]} must be positive integers")


def _pair(layer: str, what: str, v, minimum: int = 1) -> tuple[int, int]:
    """``v`` or ``(v, v)`` as a pair of integers ``>= minimum``."""
    pair = (v, v) if _is_int(v) else tuple(v) if isinstance(v, (tuple, list)) else None
    if pair is None or len(pair) != 2 or not all(_is_int(p) and p >= minimum for p in pair):
        kind = "positive integer" if minimum == 1 else "non-negative integer"
        raise _errors.ArgumentError(f"{layer}: {what} {v!r} must be a {kind} or a pair of them")
    return (int(pair[0]), int(pair[1]))


def _rng(rng: _Rng) -> np.random.Generator:
    return rng if rng is not None else np.random.default_rng()


def _embed(table: _tapir.Var, indices) -> _tapir.Var:
    """Rows ``indices`` (integers of any shape) of ``table`` ``[count, dim]``:
    ``[*indices.shape, dim]``."""
    idx = np.asarray(indices)
    if idx.size == 0:
        idx = idx.astype(np.int64)  # np.asarray([]) is float64
    rows = table.index_select(0, idx.reshape(-1))
    return rows.reshape(*idx.shape, table.shape[1])


# ---------------------------------------------------------------------------- base


class Module:
    """The base of the layers: parameter names, sub-layers, and the training flag.

    ``param_names()`` lists the names a layer added to its store, its sub-layers' included,
    in the order they were made; ``train()`` and ``eval()`` set ``training`` on the layer
    and every sub-layer (it matters to ``Dropout`` only) and return the layer.
    """

    training: bool = True

    def __init__(self) -> None:
        self.training = True
        self._names: list[str] = []

    def _add(self, store: _tapir.ParamStore, name: str, value: np.ndarray) -> str:
        store.add(name, np.asarray(value).astype(store.dtype))
        self._names.append(name)
        return name

    def children(self) -> list["Module"]:
        """The sub-layers held in attributes (lists of layers included), in order."""
        out = []
        for v in vars(self).values():
            if isinstance(v, Module):
                out.append(v)
            elif isinstance(v, (list, tuple)):
                out.extend(m for m in v if isinstance(m, Module))
        return out

    def param_names(self) -> list[str]:
        """The parameter names of this layer and its sub-layers."""
        names = list(self._names)
        for child in self.children():
            names.extend(child.param_names())
        return names

    def train(self, mode: bool = True) -> "Module":
        """Sets the training flag here and below; returns ``self``."""
        self.training = bool(mode)
        for child in self.children():
            child.train(mode)
        return self

    def eval(self) -> "Module":
        """``train(False)``."""
        return self.train(False)


def _check_free(layer: str, store: _tapir.ParamStore, names: list[str]) -> None:
    """Raises before anything is added, so a clash leaves the store unchanged."""
    taken = [n for n in names if n in store]
    if taken:
        raise _errors.ArgumentError(f"{layer}: the store already holds {', '.join(map(repr, taken))}")


# ---------------------------------------------------------------------- the layers


class Linear(Module):
    """``y = x @ weight + bias``, for ``x`` of shape ``[..., fan_in]`` (rank ≥ 2).

    ``"{name}.weight"`` is ``[fan_in, fan_out]``, the transpose of ``torch.nn.Linear``'s;
    ``"{name}.bias"`` is ``[fan_out]``. Initialised as ``torch.nn.Linear`` (both uniform in
    ``±1/sqrt(fan_in)``), or, given ``std``, the weight from ``N(0, std²)`` and the bias 0
    (GPT-2's).
    """

    def __init__(self, store, name, fan_in, fan_out, rng=None, bias=True, std=None):
        super().__init__()
        layer = f"Linear({name!r})"
        _positive(layer, fan_in=fan_in, fan_out=fan_out)
        rng = _rng(rng)
        self.weight = f"{name}.weight"
        self.bias = f"{name}.bias" if bias else None
        _check_free(layer, store, [self.weight] + ([self.bias] if bias else []))
        if std is None:
            bound = 1.0 / math.sqrt(fan_in)
            self._add(store, self.weight, rng.uniform(-bound, bound, (fan_in, fan_out)))
            if bias:
                self._add(store, self.bias, rng.uniform(-bound, bound, (fan_out,)))
        else:
            self._add(store, self.weight, rng.normal(0.0, std, (fan_in, fan_out)))
            if bias:
                self._add(store, self.bias, np.zeros(fan_out))
        self.store = store

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        w = s.param(self.store, self.weight)
        if self.bias is None:
            return x @ w
        return x.linear(w, s.param(self.store, self.bias))


class MLP(Module):
    """Linear layers of sizes ``sizes`` (``"{name}.{i}.weight"``, ...) with ``activation``
    (a ``Var`` method name) between them, none after the last."""

    def __init__(self, store, sizes, rng=None, activation="relu", name="mlp"):
        super().__init__()
        sizes = list(sizes)
        if len(sizes) < 2 or not all(_is_int(v) and v > 0 for v in sizes):
            raise _errors.ArgumentError(
                f"MLP({name!r}): sizes {sizes} must be two or more positive integers (input, hidden..., output)"
            )
        if not hasattr(_tapir.Var, activation):
            raise _errors.ArgumentError(f"MLP({name!r}): activation {activation!r} is not a method of tapir.Var")
        rng = _rng(rng)
        self.layers = [Linear(store, f"{name}.{i}", a, b, rng) for i, (a, b) in enumerate(zip(sizes, sizes[1:]))]
        self.activation = activation

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        for i, layer in enumerate(self.layers):
            x = layer(s, x)
            if i + 1 < len(self.layers):
                x = getattr(x, self.activation)()
        return x


class Embedding(Module):
    """A table of ``num_embeddings`` vectors of ``embedding_dim`` elements
    (``"{name}.weight"``, ``[num_embeddings, embedding_dim]``), drawn from ``N(0, std²)``,
    ``std = 1`` as ``torch.nn.Embedding``.

    ``emb(s, indices)`` takes integers of any shape (an array or a list, not a ``Var``) and
    gives ``[*indices.shape, embedding_dim]``; its gradient adds each output row into the
    table row it came from (an index used twice gets both). An index out of range is the
    engine's ``TapirIndexError`` from ``index_select``.
    """

    def __init__(self, store, name, num_embeddings, embedding_dim, *, rng=None, std=1.0):
        super().__init__()
        layer = f"Embedding({name!r})"
        _positive(layer, num_embeddings=num_embeddings, embedding_dim=embedding_dim)
        self.weight = f"{name}.weight"
        _check_free(layer, store, [self.weight])
        self._add(store, self.weight, _rng(rng).normal(0.0, std, (num_embeddings, embedding_dim)))
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.store = store

    def __call__(self, s: _tapir.Scope, indices) -> _tapir.Var:
        return _embed(s.param(self.store, self.weight), indices)


class LayerNorm(Module):
    """``y = (x − μ)/sqrt(σ² + eps) ⊙ weight + bias`` over the last axis, of size ``dim``
    (``μ``, ``σ²``: its mean and population variance). ``"{name}.weight"`` (ones) and
    ``"{name}.bias"`` (zeros) are ``[dim]``, as ``torch.nn.LayerNorm(dim)``."""

    def __init__(self, store, name, dim, *, eps=1e-5):
        super().__init__()
        layer = f"LayerNorm({name!r})"
        _positive(layer, dim=dim)
        if not (isinstance(eps, (int, float)) and math.isfinite(eps) and eps >= 0):
            raise _errors.ArgumentError(f"{layer}: eps {eps!r} must be finite and non-negative")
        self.weight, self.bias = f"{name}.weight", f"{name}.bias"
        _check_free(layer, store, [self.weight, self.bias])
        self._add(store, self.weight, np.ones(dim))
        self._add(store, self.bias, np.zeros(dim))
        self.dim, self.eps = dim, float(eps)
        self.store = store

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        return x.layer_norm(s.param(self.store, self.weight), s.param(self.store, self.bias), self.eps)


class Dropout(Module):
    """Inverted dropout: while ``training``, each element is kept with probability
    ``1 − p`` and scaled by ``1/(1 − p)``, so its expectation is unchanged; in ``eval()``
    mode, and for ``p = 0``, the identity (nothing is drawn). ``p = 1`` gives zeros.

    The mask is drawn from a NumPy ``Generator``, the one given to the call or else the
    one given to the constructor (a fresh ``default_rng()`` if neither), as
    ``rng.random(x.shape) >= p``, and enters the scope as a constant (``s.input``); the
    gradient is the same mask times the incoming gradient. No parameters.
    """

    def __init__(self, p=0.5, *, rng=None):
        super().__init__()
        if not (isinstance(p, (int, float, np.floating)) and 0.0 <= p <= 1.0):
            raise _errors.ArgumentError(f"Dropout: probability p {p!r} must be in [0, 1]")
        self.p = float(p)
        self.rng = _rng(rng)

    def __call__(self, s: _tapir.Scope, x: _tapir.Var, rng: _Rng = None) -> _tapir.Var:
        if not self.training or self.p == 0.0:
            return x
        if self.p == 1.0:
            mask = np.zeros(x.shape, x.dtype)
        else:
            keep = (rng if rng is not None else self.rng).random(x.shape) >= self.p
            mask = keep.astype(x.dtype) * np.asarray(1.0 / (1.0 - self.p), x.dtype)
        return x * s.input(mask)


class Conv2d(Module):
    """2-D convolution (cross-correlation, as PyTorch) of ``[N, in_channels, H, W]`` into
    ``[N, out_channels, oh, ow]``, ``oh = (H + 2·padding − dilation·(kh − 1) − 1)/stride + 1``
    (likewise ``ow``). ``"{name}.weight"`` is ``[out_channels, in_channels/groups, kh, kw]``
    and ``"{name}.bias"`` ``[out_channels]``, both uniform in
    ``±1/sqrt((in_channels/groups)·kh·kw)`` as ``torch.nn.Conv2d``. ``kernel_size``,
    ``stride``, ``padding`` and ``dilation`` (the distance between the kernel's taps) are an
    integer or a pair (vertical, horizontal). ``groups`` splits the channels into blocks,
    output block ``k`` seeing input block ``k`` only; it must divide both channel counts
    (``groups = in_channels``: depthwise).
    """

    def __init__(self, store, name, in_channels, out_channels, kernel_size, *, stride=1, padding=0, dilation=1,
                 groups=1, bias=True, rng=None):
        super().__init__()
        layer = f"Conv2d({name!r})"
        _positive(layer, in_channels=in_channels, out_channels=out_channels)
        kh, kw = self.kernel_size = _pair(layer, "kernel_size", kernel_size)
        self.stride = _pair(layer, "stride", stride)
        self.padding = _pair(layer, "padding", padding, minimum=0)
        self.dilation = _pair(layer, "dilation", dilation)
        if not (_is_int(groups) and groups > 0 and in_channels % groups == 0 and out_channels % groups == 0):
            raise _errors.ArgumentError(
                f"{layer}: groups {groups!r} must be a positive integer dividing in_channels {in_channels} "
                f"and out_channels {out_channels}"
            )
        self.weight = f"{name}.weight"
        self.bias = f"{name}.bias" if bias else None
        _check_free(layer, store, [self.weight] + ([self.bias] if bias else []))
        rng = _rng(rng)
        per_group = in_channels // groups
        bound = 1.0 / math.sqrt(per_group * kh * kw)
        self._add(store, self.weight, rng.uniform(-bound, bound, (out_channels, per_group, kh, kw)))
        if bias:
            self._add(store, self.bias, rng.uniform(-bound, bound, (out_channels,)))
        self.in_channels, self.out_channels, self.groups = in_channels, out_channels, int(groups)
        self.store = store

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        y = x.conv2d(s.param(self.store, self.weight), self.stride, self.padding, self.dilation, self.groups)
        if self.bias is None:
            return y
        return y + s.param(self.store, self.bias).reshape(self.out_channels, 1, 1)


class _Pool2d(Module):
    op = ""

    def __init__(self, kernel_size, stride=None, padding=0):
        super().__init__()
        layer = type(self).__name__
        self.kernel_size = _pair(layer, "kernel_size", kernel_size)
        self.stride = self.kernel_size if stride is None else _pair(layer, "stride", stride)
        self.padding = _pair(layer, "padding", padding, minimum=0)
        if any(2 * p > k for p, k in zip(self.padding, self.kernel_size)):
            raise _errors.ArgumentError(
                f"{layer}: padding {self.padding} must be at most half the kernel_size {self.kernel_size}"
            )

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        return getattr(x, self.op)(self.kernel_size, self.stride, self.padding)


class MaxPool2d(_Pool2d):
    """The maximum of each ``kernel_size`` window of ``[N, C, H, W]`` (``stride`` defaults
    to ``kernel_size``; ``padding`` never wins), as ``torch.nn.MaxPool2d``. Padding is at
    most half the kernel, so that no undilated window is all padding. ``dilation`` (an
    integer or a pair) spaces a window's taps: ``oh = (H + 2·padding − dilation·(kh − 1) −
    1)/stride + 1``; a dilated window with no tap inside the input gives ``−inf``, as in
    PyTorch. No parameters."""

    op = "max_pool2d"

    def __init__(self, kernel_size, stride=None, padding=0, dilation=1):
        super().__init__(kernel_size, stride, padding)
        self.dilation = _pair("MaxPool2d", "dilation", dilation)

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        return x.max_pool2d(self.kernel_size, self.stride, self.padding, self.dilation)


class AvgPool2d(_Pool2d):
    """The mean of each ``kernel_size`` window of ``[N, C, H, W]``, padding counted as
    zeros and the divisor always ``kh·kw``, as ``torch.nn.AvgPool2d``'s defaults
    (``count_include_pad=True``). No parameters."""

    op = "avg_pool2d"


class Flatten(Module):
    """Merges the axes from ``start_dim`` on into one: ``[N, C, H, W]`` becomes
    ``[N, C·H·W]`` with the default ``start_dim=1``, as ``torch.nn.Flatten``. No
    parameters."""

    def __init__(self, start_dim=1):
        super().__init__()
        if not (_is_int(start_dim) and start_dim >= 0):
            raise _errors.ArgumentError(f"Flatten: start_dim {start_dim!r} must be a non-negative integer")
        self.start_dim = start_dim

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        shape = tuple(x.shape)
        if self.start_dim >= len(shape):
            raise _errors.ShapeError(f"Flatten: start_dim {self.start_dim} needs an input of rank > "
                                     f"{self.start_dim}, got shape {list(shape)}")
        return x.reshape(*shape[: self.start_dim], math.prod(shape[self.start_dim:]))


# -------------------------------------------------------------------- transformers


class CausalSelfAttention(Module):
    """Multi-head self-attention of ``[B, T, dim]`` in which position ``i`` attends only to
    positions ``j ≤ i``, with ``heads`` heads of ``dim/heads`` elements:

        qkv = c_attn(x)                                   [B, T, 3·dim]: q | k | v
        a   = dropout(softmax_{j ≤ i}(q_i·k_j/sqrt(D)))   [B, heads, T, T]
        y   = dropout(c_proj(a·v, heads merged))          [B, T, dim]

    through the engine's ``attention_weights`` and ``attend``. Parameters as Hugging Face's
    ``GPT2Attention``: ``"{name}.c_attn.*"`` (weight ``[dim, 3·dim]``, each of q, k, v
    head-major) and ``"{name}.c_proj.*"`` (``[dim, dim]``); initialised as GPT-2, weights
    from ``N(0, std²)`` (``c_proj`` from ``N(0, proj_std²)``, ``proj_std`` defaulting to
    ``std``) and biases 0. (``torch.nn.MultiheadAttention`` keeps separate q/k/v blocks
    and draws them Xavier-uniform.)
    """

    def __init__(self, store, name, dim, heads, *, rng=None, std=0.02, proj_std=None, dropout=0.0):
        super().__init__()
        layer = f"CausalSelfAttention({name!r})"
        _positive(layer, dim=dim, heads=heads)
        if dim % heads:
            raise _errors.ArgumentError(f"{layer}: dim {dim} must be a multiple of heads {heads}")
        rng = _rng(rng)
        self.c_attn = Linear(store, f"{name}.c_attn", dim, 3 * dim, rng, std=std)
        self.c_proj = Linear(store, f"{name}.c_proj", dim, dim, rng, std=std if proj_std is None else proj_std)
        self.attn_dropout = Dropout(dropout, rng=rng)
        self.resid_dropout = Dropout(dropout, rng=rng)
        self.dim, self.heads = dim, heads

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        qkv = self.c_attn(s, x)
        att = self.attn_dropout(s, qkv.attention_weights(self.heads, causal=True))
        return self.resid_dropout(s, self.c_proj(s, att.attend(qkv)))


class TransformerBlock(Module):
    """GPT-2's pre-LayerNorm block of width ``dim``:

        x = x + attn(ln_1(x))
        x = x + dropout(c_proj(activation(c_fc(ln_2(x)))))      c_fc: dim → 4·dim

    Parameters ``"{name}.ln_1.*"``, ``"{name}.attn.*"`` (``CausalSelfAttention``),
    ``"{name}.ln_2.*"``, ``"{name}.mlp.c_fc.*"`` (``[dim, 4·dim]``) and
    ``"{name}.mlp.c_proj.*"`` (``[4·dim, dim]``), as Hugging Face's ``GPT2Block``. Weights
    from ``N(0, std²)``, the two projections back into the residual stream (``attn.c_proj``,
    ``mlp.c_proj``) from ``N(0, proj_std²)``, biases 0, LayerNorms 1 and 0. ``activation``
    is a ``Var`` method name; GPT-2's is ``gelu_tanh``.
    """

    def __init__(self, store, name, dim, heads, *, rng=None, std=0.02, proj_std=None, dropout=0.0,
                 activation="gelu_tanh"):
        super().__init__()
        layer = f"TransformerBlock({name!r})"
        _positive(layer, dim=dim, heads=heads)
        if dim % heads:
            raise _errors.ArgumentError(f"{layer}: dim {dim} must be a multiple of heads {heads}")
        if not hasattr(_tapir.Var, activation):
            raise _errors.ArgumentError(f"{layer}: activation {activation!r} is not a method of tapir.Var")
        rng = _rng(rng)
        proj_std = std if proj_std is None else proj_std
        self.ln_1 = LayerNorm(store, f"{name}.ln_1", dim)
        self.attn = CausalSelfAttention(store, f"{name}.attn", dim, heads, rng=rng, std=std, proj_std=proj_std,
                                        dropout=dropout)
        self.ln_2 = LayerNorm(store, f"{name}.ln_2", dim)
        self.c_fc = Linear(store, f"{name}.mlp.c_fc", dim, 4 * dim, rng, std=std)
        self.c_proj = Linear(store, f"{name}.mlp.c_proj", 4 * dim, dim, rng, std=proj_std)
        self.dropout = Dropout(dropout, rng=rng)
        self.activation = activation

    def __call__(self, s: _tapir.Scope, x: _tapir.Var) -> _tapir.Var:
        x = x + self.attn(s, self.ln_1(s, x))
        h = getattr(self.c_fc(s, self.ln_2(s, x)), self.activation)()
        return x + self.dropout(s, self.c_proj(s, h))


class GPT(Module):
    """A GPT-2-style language model: token and position embeddings, ``layers``
    ``TransformerBlock``s, a final LayerNorm, and an output projection tied to the token
    embedding (``logits = h @ wteᵀ``; the table gets the gradient of both uses).

    Parameters ``"{name}.wte.weight"`` ``[vocab, width]``, ``"{name}.wpe.weight"``
    ``[context, width]``, ``"{name}.h.{i}.*"`` and ``"{name}.ln_f.*"``: with
    ``name="transformer"``, the names and shapes of Hugging Face's ``GPT2LMHeadModel``
    (whose ``Conv1D`` weights are ``[in, out]`` too). Initialised as OpenAI's GPT-2: ``wte``
    and every block weight from ``N(0, 0.02²)``, ``wpe`` from ``N(0, 0.01²)``, the residual
    projections from ``N(0, (0.02/sqrt(2·layers))²)``, biases 0, LayerNorms 1 and 0.
    ``dropout`` applies to the embeddings' sum, the attention weights and both residual
    branches while ``training``.

    ``gpt(s, tokens)`` takes integers ``[B, T]`` with ``T ≤ context`` and gives logits
    ``[B, T, vocab]``; ``gpt.loss(s, tokens, targets)`` the mean cross-entropy against
    ``targets`` of the same shape.
    """

    def __init__(self, store, vocab, context, width, heads, layers, *, rng=None, dropout=0.0, name="gpt"):
        super().__init__()
        layer = f"GPT({name!r})"
        _positive(layer, vocab=vocab, context=context, width=width, heads=heads, layers=layers)
        if width % heads:
            raise _errors.ArgumentError(f"{layer}: width {width} must be a multiple of heads {heads}")
        rng = _rng(rng)
        self.wte = Embedding(store, f"{name}.wte", vocab, width, rng=rng, std=0.02)
        self.wpe = Embedding(store, f"{name}.wpe", context, width, rng=rng, std=0.01)
        self.drop = Dropout(dropout, rng=rng)
        proj_std = 0.02 / math.sqrt(2 * layers)  # GPT-2's scaled residual projections
        self.h = [
            TransformerBlock(store, f"{name}.h.{i}", width, heads, rng=rng, std=0.02, proj_std=proj_std,
                             dropout=dropout)
            for i in range(layers)
        ]
        self.ln_f = LayerNorm(store, f"{name}.ln_f", width)
        self.vocab, self.context, self.width, self.heads, self.layers = vocab, context, width, heads, layers
        self.name = name
        self.store = store

    def __call__(self, s: _tapir.Scope, tokens) -> _tapir.Var:
        tokens = np.asarray(tokens)
        if tokens.ndim != 2:
            raise _errors.ShapeError(f"GPT({self.name!r}): tokens of shape {list(tokens.shape)} must be [batch, time]")
        t = tokens.shape[1]
        if t > self.context:
            raise _errors.ShapeError(
                f"GPT({self.name!r}): tokens of shape {list(tokens.shape)} hold {t} positions, more than the "
                f"context {self.context}"
            )
        wte = s.param(self.store, self.wte.weight)  # read once: the lookup and the tied head
        x = _embed(wte, tokens) + s.param(self.store, self.wpe.weight).narrow(0, 0, t)  # [T, C] over the batch
        x = self.drop(s, x)
        for block in self.h:
            x = block(s, x)
        return self.ln_f(s, x) @ wte.T

    def loss(self, s: _tapir.Scope, tokens, targets) -> _tapir.Var:
        """The mean cross-entropy of the logits for ``tokens`` against ``targets`` (the
        next tokens, same shape)."""
        logits = self(s, tokens)
        b, t, v = logits.shape
        return logits.reshape(b * t, v).cross_entropy(np.asarray(targets).reshape(-1))
