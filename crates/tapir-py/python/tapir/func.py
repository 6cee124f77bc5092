"""Function transforms, as Rust's ``tapir::func`` and ``torch.func``: ``grad``,
``value_and_grad``, ``hvp``, ``jvp``, ``jacobian`` and ``hessian`` of a function of one
array.

    import numpy as np, tapir
    x = np.array([1.0, 2.0])
    tapir.func.grad(lambda s, x: (x * x).sum(), x)   # array([2., 4.]): ∇ Σx² = 2x

The function is a Python callable ``f(s, x) -> Var``: ``s`` is the open scope and ``x``
the input as a gradient-requesting leaf. Each transform opens one scope on ``graph``
(default: a new ``Graph`` of ``x``'s dtype: float32 for a float32 array or Tensor, float64
otherwise), records ``f``, takes the derivatives it needs with ``Scope.grad`` (recorded,
so they can be differentiated again) and returns NumPy arrays; pass the same ``graph``
to every call of a loop to reuse its memory.

They are written here over the scope API rather than as calls of Rust's ``tapir::func``,
whose functions open their own ``Graph::scope``: the binding's handles reach only the
scopes of its sessions, so a Python ``f`` could not record on that scope without
``unsafe``. Over the scope API each error is the one the engine raises where it
happens: an op of ``f`` that fails raises at ``f``'s line, an exception of ``f``
propagates unchanged (leaving the ``with`` block ends the scope, so the graph stays
usable), and the transforms' own checks raise the engine's classes with its messages.

Costs, with ``C`` one evaluation of ``f``: ``grad`` and ``value_and_grad`` about one
gradient (2–3 ``C``); ``hvp`` (reverse over reverse) and ``jvp`` (the double-vjp trick, no
tangent propagation) about two; ``jacobian`` one gradient per output element and
``hessian`` one per input element, so meant for small outputs and inputs.
"""

import math
import os
import sys
import typing
from collections import abc

import numpy as np

from . import _errors, _tapir

__all__ = ["grad", "value_and_grad", "hvp", "jvp", "jacobian", "hessian"]

# f(s, x) -> Var: records on the open scope `s` from the input leaf `x`.
_Function = abc.Callable[[_tapir.Scope, _tapir.Var], _tapir.Var]

_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _caller() -> str:
    """`file:line` of the innermost frame outside the `tapir` package, as the engine's
    errors give it."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(_PACKAGE):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "<unknown>"


def _dims(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def _graph(x: typing.Any, graph: "_tapir.Graph | None") -> "_tapir.Graph":
    if graph is not None:
        return graph
    return _tapir.Graph(dtype="float32" if str(getattr(x, "dtype", "")) == "float32" else "float64")


def _record(op: str, f: _Function, s: "_tapir.Scope", x: "_tapir.Var") -> "_tapir.Var":
    y = f(s, x)
    if not isinstance(y, _tapir.Var):
        raise TypeError(
            f"{op}: f must return a tapir.Var recorded on the scope it is given, not {type(y).__name__} "
            f"(at {_caller()})"
        )
    return y


def _one_element(op: str, y: "_tapir.Var") -> None:
    if math.prod(y.shape) != 1:
        raise _errors.GradientError(
            f"{op}: needs a tensor with exactly one element, got shape {_dims(y.shape)} "
            f"(reduce it with sum or mean first) (at {_caller()})"
        )


def _same_shape(op: str, x: "_tapir.Var", v: "_tapir.Var") -> None:
    if x.shape != v.shape:
        raise _errors.ShapeError(f"{op}: shapes {_dims(x.shape)} and {_dims(v.shape)} must be equal (at {_caller()})")


def _empty(op: str, shape: tuple, dtype: str) -> np.ndarray:
    """The result of `op`, allocated before the first product; a refusal (the allocator's,
    or NumPy's for a size past its limit) is a `TapirMemoryError`, never an abort."""
    try:
        return np.empty(shape, dtype)
    except (MemoryError, ValueError):
        requested = math.prod(shape) * np.dtype(dtype).itemsize
        raise _errors.TapirMemoryError(
            f"{op}: out of memory allocating {requested} bytes for a tensor of shape {_dims(shape)} (at {_caller()})"
        ) from None


def _grad(op: str, s: "_tapir.Scope", y: "_tapir.Var", xs: list) -> list:
    """`s.grad(y, xs)`, an error of which names the transform first: `hvp: grad: ...`,
    so that a message says which call of the user's failed (its location is already the
    user's line)."""
    try:
        return s.grad(y, xs)
    except _errors.TapirError as e:
        if str(e).startswith(f"{op}:"):
            raise
        raise type(e)(f"{op}: {e}") from None


def _rows(op: str, s: "_tapir.Scope", ys: "_tapir.Var", x: "_tapir.Var", out: np.ndarray) -> np.ndarray:
    """Fills `out` (`ys`'s elements × `x`'s) with one recorded gradient per element of `ys`."""
    m, n = math.prod(ys.shape), math.prod(x.shape)
    rows = out.reshape(m, n)
    flat = ys.reshape(m)
    for i in range(m):
        [row] = _grad(op, s, flat[i], [x])
        rows[i] = row.numpy().reshape(n)
    return out


def _value_and_grad(op: str, f: _Function, x: typing.Any, graph: "_tapir.Graph | None") -> tuple[float, np.ndarray]:
    g = _graph(x, graph)
    with g.scope() as s:
        xv = s.leaf(x)
        y = _record(op, f, s, xv)
        _one_element(op, y)
        [dx] = _grad(op, s, y, [xv])
        return y.item(), dx.numpy()


def grad(f: _Function, x: typing.Any, *, graph: "_tapir.Graph | None" = None) -> np.ndarray:
    """The gradient ``∇f(x)`` of a one-element ``f``, with ``x``'s shape.

    ``GradientError`` unless ``f(s, x)`` has one element."""
    return _value_and_grad("grad", f, x, graph)[1]


def value_and_grad(f: _Function, x: typing.Any, *, graph: "_tapir.Graph | None" = None) -> tuple[float, np.ndarray]:
    """``f(x)`` (one element, as a float) and its gradient, from one recording."""
    return _value_and_grad("value_and_grad", f, x, graph)


def hvp(f: _Function, x: typing.Any, v: typing.Any, *, graph: "_tapir.Graph | None" = None) -> np.ndarray:
    """The Hessian-vector product ``∇²f(x) · v`` of a one-element ``f`` by reverse over
    reverse (``∇ₓ⟨∇f(x), v⟩``, about two gradients); no Hessian is formed. ``ShapeError``
    unless ``v`` has ``x``'s shape."""
    g = _graph(x, graph)
    with g.scope() as s:
        xv, vv = s.leaf(x), s.input(v)
        _same_shape("hvp", xv, vv)
        y = _record("hvp", f, s, xv)
        _one_element("hvp", y)
        [dx] = _grad("hvp", s, y, [xv])
        [hv] = _grad("hvp", s, (dx * vv).sum(), [xv])
        return hv.numpy()


def jvp(
    f: _Function, x: typing.Any, v: typing.Any, *, graph: "_tapir.Graph | None" = None
) -> tuple[np.ndarray, np.ndarray]:
    """``f(x)`` and the Jacobian-vector product ``J v`` (forward mode), for ``f`` of any
    shape, by the double-vjp trick: with a dummy leaf ``u`` of ``f``'s shape,
    ``uᵀJ = ∇ₓ⟨f(x), u⟩`` is linear in ``u``, so ``J v = ∇ᵤ⟨uᵀJ, v⟩`` (about two
    gradients). ``ShapeError`` unless ``v`` has ``x``'s shape."""
    g = _graph(x, graph)
    with g.scope() as s:
        xv, vv = s.leaf(x), s.input(v)
        _same_shape("jvp", xv, vv)
        y = _record("jvp", f, s, xv)
        # Any value of u works (the product is linear in it); it must request a gradient.
        u = s.leaf(np.zeros(y.shape, g.dtype))
        [ut_j] = _grad("jvp", s, (y * u).sum(), [xv])
        [jv] = _grad("jvp", s, (ut_j * vv).sum(), [u])
        return y.numpy(), jv.numpy()


def jacobian(f: _Function, x: typing.Any, *, graph: "_tapir.Graph | None" = None) -> np.ndarray:
    """The Jacobian of ``f`` at ``x``, of shape ``f``'s shape followed by ``x``'s: one
    recorded gradient per output element, so meant for small outputs. Its memory is
    allocated before the first gradient; a refusal is a ``TapirMemoryError``."""
    g = _graph(x, graph)
    with g.scope() as s:
        xv = s.leaf(x)
        y = _record("jacobian", f, s, xv)
        out = _empty("jacobian", tuple(y.shape) + tuple(xv.shape), g.dtype)
        return _rows("jacobian", s, y, xv, out)


def hessian(f: _Function, x: typing.Any, *, graph: "_tapir.Graph | None" = None) -> np.ndarray:
    """The Hessian of a one-element ``f`` at ``x``, of ``x``'s shape twice: the gradient
    is recorded once, then each of its elements differentiated, so meant for small
    inputs. Errors as for ``grad`` and ``jacobian``."""
    g = _graph(x, graph)
    with g.scope() as s:
        xv = s.leaf(x)
        y = _record("hessian", f, s, xv)
        _one_element("hessian", y)
        out = _empty("hessian", tuple(xv.shape) * 2, g.dtype)
        [dx] = _grad("hessian", s, y, [xv])
        return _rows("hessian", s, dx, xv, out)
