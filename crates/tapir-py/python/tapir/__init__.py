"""Tapir: reverse-mode automatic differentiation whose graph memory has an explicit
lifetime.

    import numpy as np, tapir
    g = tapir.Graph()
    with g.scope() as s:              # one iteration; its memory is reused by the next
        x = s.leaf(np.ones((3, 3), np.float32))
        y = (x @ x).tanh().sum()
        s.backward(y)
        print(y.item(), x.grad)

Handles (``Var``) hold no reference to the graph's memory: nothing to collect, no cycle,
no ``gc.collect()``. A handle used after its ``with`` block raises ``tapir.ScopeError``.
The GIL is held for each op; a scope belongs to the thread that opened it.
"""

from ._errors import (
    ArenaLimitError,
    ArgumentError,
    CallbackError,
    DTypeError,
    GradientError,
    NonFiniteError,
    ParamError,
    ScopeError,
    ShapeError,
    TapirError,
    TapirIndexError,
    TapirIOError,
    TapirMemoryError,
    UnsupportedError,
)
from ._tapir import Graph, GradBuffer, NoGrad, Optimizer, ParamStore, Scope, Tensor, Var, init_threads, set_spin_wait
from . import func, nn, optim

__all__ = [
    "Graph",
    "Scope",
    "Var",
    "NoGrad",
    "Tensor",
    "ParamStore",
    "GradBuffer",
    "Optimizer",
    "init_threads",
    "set_spin_wait",
    "func",
    "nn",
    "optim",
    "TapirError",
    "ScopeError",
    "DTypeError",
    "ShapeError",
    "TapirIndexError",
    "GradientError",
    "UnsupportedError",
    "ArenaLimitError",
    "TapirMemoryError",
    "ParamError",
    "NonFiniteError",
    "ArgumentError",
    "CallbackError",
    "TapirIOError",
]
