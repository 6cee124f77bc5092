"""Every op of `tapir.Var` (and the scope's `concat`/`stack`), checked two ways against
NumPy in float64: (a) the forward value against a reference written here, (b) the
gradient of a random weighted sum `L = Σ out ⊙ r` (a plain sum would hide transposed
gradients) w.r.t. each leaf against central finite differences of the *reference*.
Inputs are kept away from kinks (relu, abs, max, clamp) and ties. A float32 pass checks
the forward values of the same table with float32 tolerances.

The last tests check that every public name of `tapir`, `tapir.nn`, `tapir.optim`,
`tapir.Var` and `tapir.Scope` is in this table, tested elsewhere (by a named test that
must exist) or excluded with a reason.
"""

import dataclasses
import importlib
import pathlib
import zlib
from typing import Callable

import numpy as np
import pytest

import tapir
import _reference as ref

F64_FWD_RTOL, F64_FWD_ATOL = 1e-10, 1e-12
F32_FWD_RTOL, F32_FWD_ATOL = 2e-5, 1e-5
GRAD_RTOL, GRAD_ATOL = 1e-6, 1e-6


# ---------------------------------------------------------------------------- inputs


def _rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def normal(*shape, key=0):
    return _rng("normal", shape, key).standard_normal(shape)


def uniform(lo, hi, *shape, key=0):
    return _rng("uniform", lo, hi, shape, key).uniform(lo, hi, shape)


def away(*shape, kinks=(0.0,), gap=0.1, key=0):
    """Normal values at least `gap` from every kink."""
    x = normal(*shape, key=key)
    for k in kinks:
        near = np.abs(x - k) < gap
        x[near] = k + np.where(x[near] >= k, gap, -gap) * (1.0 + np.abs(x[near]))
    return x


def distinct(*shape, key=0):
    """Values at least 0.05 apart (no ties for max, min and pooling)."""
    n = int(np.prod(shape))
    r = _rng("distinct", shape, key)
    return (r.permutation(n) * 0.1 - 0.05 * n + r.uniform(-0.02, 0.02, n)).reshape(shape)


@dataclasses.dataclass
class Arg:
    kind: str  # "leaf" (differentiable), "input" (a constant Var), "raw" (the array itself)
    value: np.ndarray


def L(a):
    return Arg("leaf", np.asarray(a, np.float64))


def C(a):
    return Arg("input", np.asarray(a, np.float64))


def R(a):
    return Arg("raw", np.asarray(a, np.float64))


@dataclasses.dataclass
class Case:
    id: str
    fn: Callable  # fn(s, *args) -> Var; args are Vars for leaf/input, arrays for raw
    ref: Callable  # ref(*arrays) -> np.ndarray (float64)
    args: list
    uses: tuple  # the attributes of tapir.Var / tapir.Scope this case exercises
    grad_ref: Callable = None  # (w, *arrays) -> [expected grad per leaf]; default: finite differences


CASES = []


def case(id, fn, reference, *args, uses, grad_ref=None):
    CASES.append(Case(id, fn, reference, list(args), tuple(uses), grad_ref))


# ------------------------------------------------------------------ the op table

# Binary arithmetic: Var ∘ Var (same shape and broadcast), Var ∘ number, Var ∘ array, and
# the reflected forms with a number, a list and an ndarray on the left.
A, B = normal(3, 4, key=1), normal(4, key=2)
NZ = away(3, 4, kinks=(0.0,), gap=0.5, key=3)  # divisors away from 0
NZB = away(4, kinks=(0.0,), gap=0.5, key=4)
for op, sym, f in [
    ("add", "+", lambda a, b: a + b),
    ("sub", "-", lambda a, b: a - b),
    ("mul", "*", lambda a, b: a * b),
    ("truediv", "/", lambda a, b: a / b),
]:
    den, denb = (NZ, NZB) if op == "truediv" else (A, B)
    d, rd = f"__{op}__", f"__r{op}__"
    case(f"{op}_var_var", lambda s, a, b, f=f: f(a, b), f, L(normal(3, 4, key=5)), L(den), uses=[d])
    case(f"{op}_var_var_broadcast_row", lambda s, a, b, f=f: f(a, b), f, L(A), L(denb), uses=[d])
    case(f"{op}_var_var_broadcast_col", lambda s, a, b, f=f: f(a, b), f, L(normal(3, 1, key=6)), L(den), uses=[d])
    case(f"{op}_var_const", lambda s, a, b, f=f: f(a, b), f, L(A), C(den), uses=[d])
    case(f"{op}_var_float", lambda s, a, f=f: f(a, 2.5), lambda a, f=f: f(a, 2.5), L(den), uses=[d])
    case(f"{op}_var_int", lambda s, a, f=f: f(a, 3), lambda a, f=f: f(a, 3.0), L(den), uses=[d])
    case(f"{op}_var_ndarray", lambda s, a, b, f=f: f(a, b), f, L(A), R(denb), uses=[d])
    case(f"{op}_var_list", lambda s, a, b, f=f: f(a, b.tolist()), f, L(A), R(denb), uses=[d])
    case(f"r{op}_float_var", lambda s, a, f=f: f(2.5, a), lambda a, f=f: f(2.5, a), L(den), uses=[rd])
    case(f"r{op}_int_var", lambda s, a, f=f: f(-3, a), lambda a, f=f: f(-3.0, a), L(den), uses=[rd])
    case(f"r{op}_list_var", lambda s, b, a, f=f: f(b.tolist(), a), f, R(B), L(den), uses=[rd])
    # NumPy on the left: the result must still be a Var (NumPy must defer to __r{op}__),
    # or the gradient is silently lost.
    case(f"r{op}_ndarray_var", lambda s, b, a, f=f: f(b, a), f, R(B), L(den), uses=[rd, "__array_ufunc__"])
    case(f"r{op}_var_method", lambda s, a, b, f=f, rd=rd: getattr(a, rd)(b), lambda a, b, f=f: f(b, a),
         L(den), L(A), uses=[rd])

case("matmul", lambda s, a, b: a @ b, np.matmul, L(normal(3, 4)), L(normal(4, 5)), uses=["__matmul__"])
case("matmul_method", lambda s, a, b: a.matmul(b), np.matmul, L(normal(3, 4)), L(normal(4, 5)), uses=["matmul"])
case("matmul_batched", lambda s, a, b: a @ b, np.matmul, L(normal(2, 3, 4)), L(normal(2, 4, 5)), uses=["__matmul__"])
case("matmul_broadcast_batch", lambda s, a, b: a @ b, np.matmul, L(normal(2, 3, 4)), L(normal(4, 5)),
     uses=["__matmul__"])
case("matmul_broadcast_batch_1", lambda s, a, b: a @ b, np.matmul, L(normal(1, 3, 4)), L(normal(2, 4, 5)),
     uses=["__matmul__"])
case("matmul_ndarray", lambda s, a, b: a @ b, np.matmul, L(normal(3, 4)), R(normal(4, 2)), uses=["__matmul__"])
case("rmatmul_list", lambda s, b, a: b.tolist() @ a, np.matmul, R(normal(2, 3)), L(normal(3, 4)),
     uses=["__rmatmul__"])
case("rmatmul_ndarray", lambda s, b, a: b @ a, np.matmul, R(normal(2, 3)), L(normal(3, 4)),
     uses=["__rmatmul__", "__array_ufunc__"])
case("rmatmul_method", lambda s, a, b: a.__rmatmul__(b), lambda a, b: b @ a, L(normal(3, 4)), L(normal(2, 3)),
     uses=["__rmatmul__"])
case("transposed_product", lambda s, a: a.T @ a, lambda a: a.T @ a, L(normal(3, 4)), uses=["__matmul__", "T"])

P = uniform(0.5, 2.0, 3, 4, key=7)
case("pow_float", lambda s, a: a**2.5, lambda a: a**2.5, L(P), uses=["__pow__"])
case("pow_int", lambda s, a: a**3, lambda a: a**3.0, L(normal(3, 4)), uses=["__pow__"])
case("pow_negative", lambda s, a: a**-0.5, lambda a: a**-0.5, L(P), uses=["__pow__"])
case("pow_var", lambda s, a, b: a**b, np.power, L(P), L(normal(3, 4)), uses=["__pow__"])
case("pow_var_broadcast", lambda s, a, b: a**b, np.power, L(P), L(normal(4)), uses=["__pow__"])
case("pow_ndarray", lambda s, a, b: a**b, np.power, L(P), R(normal(3, 4)), uses=["__pow__"])
case("pow_method_var", lambda s, a, b: a.pow(b), np.power, L(P), L(normal(3, 4, key=8)), uses=["pow"])
case("pow_method_float", lambda s, a: a.pow(1.5), lambda a: a**1.5, L(P), uses=["pow"])
case("rpow_float", lambda s, a: 2.0**a, lambda a: 2.0**a, L(normal(3, 4)), uses=["__rpow__"])
case("rpow_int", lambda s, a: 3**a, lambda a: 3.0**a, L(normal(3, 4)), uses=["__rpow__"])
case("rpow_ndarray", lambda s, b, a: b**a, np.power, R(P), L(normal(3, 4)), uses=["__rpow__", "__array_ufunc__"])
case("rpow_method", lambda s, a, b: a.__rpow__(b), lambda a, b: b**a, L(normal(3, 4)), L(P), uses=["__rpow__"])
case("neg", lambda s, a: -a, np.negative, L(normal(3, 4)), uses=["__neg__"])

# Elementwise unary functions, on inputs inside their domain and away from kinks.
UNARY = {
    "exp": (np.exp, normal(3, 4)),
    "log": (np.log, uniform(0.2, 3.0, 3, 4)),
    "log1p": (np.log1p, uniform(-0.8, 3.0, 3, 4)),
    "expm1": (np.expm1, normal(3, 4)),
    "sqrt": (np.sqrt, uniform(0.2, 3.0, 3, 4)),
    "rsqrt": (lambda x: 1.0 / np.sqrt(x), uniform(0.2, 3.0, 3, 4)),
    "square": (np.square, normal(3, 4)),
    "recip": (lambda x: 1.0 / x, away(3, 4, gap=0.3)),
    "abs": (np.abs, away(3, 4)),
    "sin": (np.sin, normal(3, 4)),
    "cos": (np.cos, normal(3, 4)),
    "tanh": (np.tanh, normal(3, 4)),
    "atan": (np.arctan, normal(3, 4)),
    "erf": (ref.erf, normal(3, 4)),
    "sigmoid": (ref.sigmoid, 3 * normal(3, 4)),
    "relu": (lambda x: np.maximum(x, 0.0), away(3, 4)),
    "gelu": (ref.gelu, 2 * normal(3, 4)),
    "gelu_tanh": (ref.gelu_tanh, 2 * normal(3, 4)),
    "softplus": (ref.softplus, 3 * normal(3, 4)),
    "silu": (lambda x: x * ref.sigmoid(x), 2 * normal(3, 4)),
}
for name, (f, x) in UNARY.items():
    case(name, lambda s, a, name=name: getattr(a, name)(), f, L(x), uses=[name])
# Far tails, where a naive formula overflows or cancels.
case("softplus_tails", lambda s, a: a.softplus(), ref.softplus, L(np.array([-40.0, -5.0, 5.0, 40.0])),
     uses=["softplus"])
case("sigmoid_tails", lambda s, a: a.sigmoid(), ref.sigmoid, L(np.array([-30.0, -8.0, 8.0, 30.0])),
     uses=["sigmoid"])

# detach: a constant copy; in x.detach() * x only the second factor carries a gradient,
# so ∂/∂x Σ r ⊙ (x_const ⊙ x) = r ⊙ x.
case("detach", lambda s, a: a.detach() * a, lambda a: a * a, L(normal(3, 4)), uses=["detach"],
     grad_ref=lambda w, a: [w * a])

LK = away(3, 4)
case("leaky_relu", lambda s, a: a.leaky_relu(0.2), lambda a: np.where(a > 0, a, 0.2 * a), L(LK),
     uses=["leaky_relu"])
case("leaky_relu_default", lambda s, a: a.leaky_relu(), lambda a: np.where(a > 0, a, 0.01 * a), L(LK),
     uses=["leaky_relu"])
CL = away(4, 5, kinks=(-0.5, 0.7), gap=0.05)
case("clamp", lambda s, a: a.clamp(-0.5, 0.7), lambda a: np.clip(a, -0.5, 0.7), L(CL), uses=["clamp"])
MX, MY = normal(3, 4, key=11), normal(3, 4, key=12)
MY[np.abs(MX - MY) < 0.1] += 0.3  # no ties
for name, f in [("maximum", np.maximum), ("minimum", np.minimum)]:
    case(f"{name}_var", lambda s, a, b, n=name: getattr(a, n)(b), f, L(MX), L(MY), uses=[name])
    case(f"{name}_float", lambda s, a, n=name: getattr(a, n)(0.25), lambda a, f=f: f(a, 0.25),
         L(away(3, 4, kinks=(0.25,))), uses=[name])
    case(f"{name}_broadcast", lambda s, a, b, n=name: getattr(a, n)(b), f, L(MX), L(away(4, kinks=())),
         uses=[name])
    case(f"{name}_ndarray", lambda s, a, b, n=name: getattr(a, n)(b), f, L(MX), R(MY), uses=[name])

# Comparisons: constants (no gradient through them); multiplied by a leaf to check the
# value they gate, and by their own input to check that nothing flows back through them.
CX, CY = normal(3, 4, key=13), normal(3, 4, key=14)
CY[np.abs(CX - CY) < 0.1] += 0.3
CX[0, 0] = CY[0, 0] = 0.5  # one exact tie for equal/ge/le
CMP = {
    "gt": (np.greater, "__gt__"),
    "ge": (np.greater_equal, "__ge__"),
    "lt": (np.less, "__lt__"),
    "le": (np.less_equal, "__le__"),
    "equal": (np.equal, None),
}
Z = normal(3, 4, key=15)
for name, (f, dunder) in CMP.items():
    case(f"{name}_gates", lambda s, a, b, z, n=name: getattr(a, n)(b) * z, lambda a, b, z, f=f: f(a, b) * z,
         C(CX), C(CY), L(Z), uses=[name])
    case(f"{name}_float", lambda s, a, z, n=name: getattr(a, n)(0.5) * z, lambda a, z, f=f: f(a, 0.5) * z,
         C(CX), L(Z), uses=[name])
    if dunder:
        op = {"__gt__": ">", "__ge__": ">=", "__lt__": "<", "__le__": "<="}[dunder]
        fn = eval(f"lambda s, a, b, z: (a {op} b) * z")
        case(f"{dunder}", fn, lambda a, b, z, f=f: f(a, b) * z, C(CX), C(CY), L(Z), uses=[dunder])
        rfn = eval(f"lambda s, a, z: (0.5 {op} a) * z")  # Python reflects to the mirrored op
        case(f"{dunder}_reflected", rfn, lambda a, z, f=f: f(0.5, a) * z, C(CX), L(Z),
             uses=[dunder])
XNT = away(3, 4, kinks=(0.0,), gap=0.05)
for name, (f, _) in CMP.items():
    if name == "equal":
        continue
    # Away from the threshold, so that finite differences do not cross it.
    case(f"{name}_no_gradient_through", lambda s, a, n=name: getattr(a, n)(0.0) * a,
         lambda a, f=f: f(a, 0.0) * a, L(XNT), uses=[name])

# Reductions, with every axis form and keepdims.
X3 = normal(2, 3, 4, key=16)
XD = distinct(2, 3, 4)
REDUCE = {
    "sum": lambda a, axis, keepdims: np.sum(a, axis=axis, keepdims=keepdims),
    "mean": lambda a, axis, keepdims: np.mean(a, axis=axis, keepdims=keepdims),
    "max": lambda a, axis, keepdims: np.max(a, axis=axis, keepdims=keepdims),
    "min": lambda a, axis, keepdims: np.min(a, axis=axis, keepdims=keepdims),
    "var": lambda a, axis, keepdims: np.var(a, axis=axis, keepdims=keepdims, ddof=1),
}
AXES = [None, 0, 1, -1, (0, 2), (-1, 0), [1, 2], (0, 1, 2)]
for name, f in REDUCE.items():
    x = XD if name in ("max", "min") else X3
    for axis in AXES:
        for keepdims in (False, True):
            kw = {} if (axis is None and not keepdims) else {"axis": axis, "keepdims": keepdims}
            case(f"{name}[axis={axis},keepdims={keepdims}]",
                 lambda s, a, n=name, kw=kw: getattr(a, n)(**kw),
                 lambda a, f=f, axis=axis, keepdims=keepdims: f(a, tuple(axis) if isinstance(axis, list) else axis,
                                                               keepdims),
                 L(x), uses=[name])
    case(f"{name}[positional]", lambda s, a, n=name: getattr(a, n)(1), lambda a, f=f: f(a, 1, False), L(x),
         uses=[name])
for axis in [None, 1, (0, 2)]:
    case(f"var[correction=0,axis={axis}]", lambda s, a, axis=axis: a.var(axis=axis, correction=0),
         lambda a, axis=axis: np.var(a, axis=axis), L(X3), uses=["var"])
    case(f"var[correction=2,axis={axis},keepdims]", lambda s, a, axis=axis: a.var(axis, True, 2),
         lambda a, axis=axis: np.var(a, axis=axis, ddof=2, keepdims=True), L(X3), uses=["var"])
for axis in [0, 1, -1, 2]:
    for keepdims in (False, True):
        case(f"logsumexp[axis={axis},keepdims={keepdims}]",
             lambda s, a, axis=axis, k=keepdims: a.logsumexp(axis=axis, keepdims=k),
             lambda a, axis=axis, k=keepdims: ref.logsumexp(a, axis, k), L(3 * X3), uses=["logsumexp"])
case("logsumexp_default", lambda s, a: a.logsumexp(), lambda a: ref.logsumexp(a, -1), L(X3), uses=["logsumexp"])
case("logsumexp_large", lambda s, a: a.logsumexp(axis=1), lambda a: ref.logsumexp(a, 1),
     L(normal(3, 4) + 500.0), uses=["logsumexp"])

# Shapes.
case("reshape_varargs", lambda s, a: a.reshape(4, 6), lambda a: a.reshape(4, 6), L(X3), uses=["reshape"])
case("reshape_tuple", lambda s, a: a.reshape((3, 2, 4)), lambda a: a.reshape(3, 2, 4), L(X3), uses=["reshape"])
case("reshape_list", lambda s, a: a.reshape([24]), lambda a: a.reshape(24), L(X3), uses=["reshape"])
case("reshape_to_scalar", lambda s, a: a.reshape(()), lambda a: a.reshape(()), L(normal(1, 1)), uses=["reshape"])
case("reshape_infer", lambda s, a: a.reshape(-1), lambda a: a.reshape(24), L(X3), uses=["reshape"])
case("reshape_infer_middle", lambda s, a: a.reshape((2, -1, 3)), lambda a: a.reshape(2, 4, 3), L(X3),
     uses=["reshape"])
case("transpose_default", lambda s, a: a.transpose(), lambda a: np.swapaxes(a, -2, -1), L(X3), uses=["transpose"])
case("transpose_axes", lambda s, a: a.transpose(0, 2), lambda a: np.swapaxes(a, 0, 2), L(X3), uses=["transpose"])
case("transpose_negative", lambda s, a: a.transpose(-3, 1), lambda a: np.swapaxes(a, 0, 1), L(X3),
     uses=["transpose"])
case("T", lambda s, a: a.T, lambda a: a.T, L(normal(3, 4)), uses=["T"])
case("T_batched", lambda s, a: a.T, lambda a: np.swapaxes(a, -2, -1), L(X3), uses=["T"])
case("permute_varargs", lambda s, a: a.permute(2, 0, 1), lambda a: np.transpose(a, (2, 0, 1)), L(X3),
     uses=["permute"])
case("permute_tuple", lambda s, a: a.permute((1, 2, 0)), lambda a: np.transpose(a, (1, 2, 0)), L(X3),
     uses=["permute"])
case("permute_negative", lambda s, a: a.permute(-1, 0, -2), lambda a: np.transpose(a, (2, 0, 1)), L(X3),
     uses=["permute"])
case("squeeze", lambda s, a: a.squeeze(1), lambda a: np.squeeze(a, 1), L(normal(3, 1, 4)), uses=["squeeze"])
case("squeeze_negative", lambda s, a: a.squeeze(-1), lambda a: np.squeeze(a, -1), L(normal(3, 4, 1)),
     uses=["squeeze"])
case("unsqueeze", lambda s, a: a.unsqueeze(1), lambda a: np.expand_dims(a, 1), L(normal(3, 4)), uses=["unsqueeze"])
case("unsqueeze_end", lambda s, a: a.unsqueeze(-1), lambda a: np.expand_dims(a, -1), L(normal(3, 4)),
     uses=["unsqueeze"])
case("unsqueeze_front", lambda s, a: a.unsqueeze(0), lambda a: np.expand_dims(a, 0), L(normal(3, 4)),
     uses=["unsqueeze"])
case("broadcast_to_varargs", lambda s, a: a.broadcast_to(2, 3, 4), lambda a: np.broadcast_to(a, (2, 3, 4)),
     L(normal(3, 1)), uses=["broadcast_to"])
case("broadcast_to_tuple", lambda s, a: a.broadcast_to((5, 4)), lambda a: np.broadcast_to(a, (5, 4)),
     L(normal(4)), uses=["broadcast_to"])
case("broadcast_to_keep", lambda s, a: a.broadcast_to(2, -1, 4), lambda a: np.broadcast_to(a, (2, 3, 4)),
     L(normal(3, 1)), uses=["broadcast_to"])
case("broadcast_to_scalar", lambda s, a: a.broadcast_to(2, 3), lambda a: np.broadcast_to(a, (2, 3)),
     L(np.array(1.5)), uses=["broadcast_to"])
case("narrow", lambda s, a: a.narrow(2, 1, 2), lambda a: a[:, :, 1:3], L(X3), uses=["narrow"])
case("narrow_negative_axis", lambda s, a: a.narrow(-2, 0, 2), lambda a: a[:, 0:2, :], L(X3), uses=["narrow"])
case("index_select", lambda s, a: a.index_select(0, [2, 0, 2, 1]), lambda a: np.take(a, [2, 0, 2, 1], axis=0),
     L(normal(3, 4)), uses=["index_select"])
case("index_select_axis1_int32", lambda s, a: a.index_select(1, np.array([3, 3, 0], np.int32)),
     lambda a: np.take(a, [3, 3, 0], axis=1), L(normal(3, 4)), uses=["index_select"])
case("index_select_negative_axis", lambda s, a: a.index_select(-1, np.array([1, 0], np.int64)),
     lambda a: np.take(a, [1, 0], axis=-1), L(X3), uses=["index_select"])
for key in [1, -1, slice(1, 3), slice(None, 2), slice(-2, None), (1, 2), (0, slice(1, 3)), (slice(None), 1),
            (-1, slice(0, 2), 3), (slice(1, 2), slice(None), slice(2, 4))]:
    case(f"getitem[{key}]", lambda s, a, key=key: a[key], lambda a, key=key: a[key], L(X3), uses=["__getitem__"])

# Scope-level joins.
case("concat_axis0", lambda s, a, b: s.concat([a, b]), lambda a, b: np.concatenate([a, b]), L(normal(2, 3)),
     L(normal(4, 3)), uses=["concat"])
case("concat_axis1", lambda s, a, b, c: s.concat([a, b, c], axis=1), lambda a, b, c: np.concatenate([a, b, c], 1),
     L(normal(2, 3)), L(normal(2, 1)), L(normal(2, 2)), uses=["concat"])
case("concat_negative_axis", lambda s, a, b: s.concat([a, b], axis=-1), lambda a, b: np.concatenate([a, b], -1),
     L(normal(2, 2, 3)), C(normal(2, 2, 2)), uses=["concat"])
case("stack_axis0", lambda s, a, b: s.stack([a, b]), lambda a, b: np.stack([a, b]), L(normal(2, 3)),
     L(normal(2, 3, key=1)), uses=["stack"])
case("stack_axis_last", lambda s, a, b: s.stack([a, b, a], axis=-1), lambda a, b: np.stack([a, b, a], -1),
     L(normal(2, 3)), L(normal(2, 3, key=1)), uses=["stack"])
case("stack_axis1", lambda s, a, b: s.stack([a, b], axis=1), lambda a, b: np.stack([a, b], 1), L(normal(2, 3)),
     L(normal(2, 3, key=1)), uses=["stack"])
case("full_times_leaf", lambda s, a: s.full((3, 4), 1.5) * a, lambda a: 1.5 * a, L(normal(3, 4)), uses=["full"])

# Softmax family and losses.
for axis in [-1, 0, 1]:
    case(f"softmax[axis={axis}]", lambda s, a, axis=axis: a.softmax(axis), lambda a, axis=axis: ref.softmax(a, axis),
         L(2 * X3), uses=["softmax"])
    case(f"log_softmax[axis={axis}]", lambda s, a, axis=axis: a.log_softmax(axis),
         lambda a, axis=axis: ref.log_softmax(a, axis), L(2 * X3), uses=["log_softmax"])
case("softmax_default", lambda s, a: a.softmax(), ref.softmax, L(normal(3, 5)), uses=["softmax"])
case("log_softmax_default", lambda s, a: a.log_softmax(), ref.log_softmax, L(normal(3, 5)), uses=["log_softmax"])
case("softmax_large", lambda s, a: a.softmax(), ref.softmax, L(normal(3, 5) * 3 + 800.0), uses=["softmax"])
LABELS = [2, 0, 4, 4, 1]
LOGITS = 2 * normal(5, 5)
case("cross_entropy_list", lambda s, a: a.cross_entropy(LABELS), lambda a: ref.cross_entropy(a, LABELS), L(LOGITS),
     uses=["cross_entropy"])
case("cross_entropy_int64", lambda s, a: a.cross_entropy(np.array(LABELS)), lambda a: ref.cross_entropy(a, LABELS),
     L(LOGITS), uses=["cross_entropy"])
case("cross_entropy_int32", lambda s, a: a.cross_entropy(np.array(LABELS, np.int32)),
     lambda a: ref.cross_entropy(a, LABELS), L(LOGITS), uses=["cross_entropy"])
case("cross_entropy_uint8", lambda s, a: a.cross_entropy(np.array(LABELS, np.uint8)),
     lambda a: ref.cross_entropy(a, LABELS), L(LOGITS), uses=["cross_entropy"])
case("nll_loss", lambda s, a: a.nll_loss(LABELS), lambda a: ref.nll_loss(a, LABELS), L(LOGITS), uses=["nll_loss"])
case("nll_loss_of_log_softmax", lambda s, a: a.log_softmax().nll_loss(np.array(LABELS)),
     lambda a: ref.cross_entropy(a, LABELS), L(LOGITS), uses=["nll_loss", "log_softmax"])
case("mse_loss_var", lambda s, a, b: a.mse_loss(b), lambda a, b: np.mean((a - b) ** 2), L(normal(3, 4)),
     L(normal(3, 4, key=1)), uses=["mse_loss"])
case("mse_loss_ndarray", lambda s, a, b: a.mse_loss(b), lambda a, b: np.mean((a - b) ** 2), L(normal(3, 4)),
     R(normal(3, 4, key=1)), uses=["mse_loss"])
case("mse_loss_broadcast", lambda s, a, b: a.mse_loss(b), lambda a, b: np.mean((a - b) ** 2), L(normal(3, 4)),
     L(normal(4, key=1)), uses=["mse_loss"])
T01 = uniform(0.0, 1.0, 3, 4)
case("bce_with_logits_var", lambda s, a, t: a.bce_with_logits(t), lambda a, t: np.mean(ref.softplus(a) - a * t),
     L(3 * normal(3, 4)), L(T01), uses=["bce_with_logits"])
case("bce_with_logits_ndarray", lambda s, a, t: a.bce_with_logits(t), lambda a, t: np.mean(ref.softplus(a) - a * t),
     L(3 * normal(3, 4)), R((T01 > 0.5).astype(float)), uses=["bce_with_logits"])
case("bce_with_logits_extreme", lambda s, a, t: a.bce_with_logits(t), lambda a, t: np.mean(ref.softplus(a) - a * t),
     L(np.array([-60.0, -20.0, 20.0, 60.0])), C(np.array([1.0, 0.0, 1.0, 0.0])), uses=["bce_with_logits"])

# Network ops.
case("linear", lambda s, x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, L(normal(3, 4)), L(normal(4, 5)),
     L(normal(5)), uses=["linear"])
case("linear_batched", lambda s, x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, L(normal(2, 3, 4)),
     L(normal(4, 5)), L(normal(5)), uses=["linear"])
case("linear_ndarray_params", lambda s, x, w, b: x.linear(w, b), lambda x, w, b: x @ w + b, L(normal(3, 4)),
     R(normal(4, 2)), R(normal(2)), uses=["linear"])
case("layer_norm", lambda s, x, w, b: x.layer_norm(w, b), ref.layer_norm, L(normal(3, 6)), L(normal(6)),
     L(normal(6)), uses=["layer_norm"])
case("layer_norm_eps", lambda s, x, w, b: x.layer_norm(w, b, eps=0.1), lambda x, w, b: ref.layer_norm(x, w, b, 0.1),
     L(normal(2, 3, 5)), L(normal(5)), L(normal(5)), uses=["layer_norm"])
case("layer_norm_eps_positional", lambda s, x, w, b: x.layer_norm(w, b, 1e-3),
     lambda x, w, b: ref.layer_norm(x, w, b, 1e-3), L(normal(4, 5)), C(normal(5)), C(normal(5)),
     uses=["layer_norm"])
for stride, padding in [((1, 1), (0, 0)), ((2, 1), (1, 0)), ((1, 2), (1, 1)), ((2, 2), (2, 1))]:
    case(f"conv2d[stride={stride},padding={padding}]",
         lambda s, x, w, st=stride, p=padding: x.conv2d(w, stride=st, padding=p),
         lambda x, w, st=stride, p=padding: ref.conv2d(x, w, st, p), L(normal(2, 3, 5, 6)), L(normal(4, 3, 3, 2)),
         uses=["conv2d"])
case("conv2d_default", lambda s, x, w: x.conv2d(w), ref.conv2d, L(normal(1, 2, 4, 4)), L(normal(3, 2, 2, 2)),
     uses=["conv2d"])
case("conv2d_positional", lambda s, x, w: x.conv2d(w, (2, 2), (1, 1)), lambda x, w: ref.conv2d(x, w, (2, 2), (1, 1)),
     L(normal(1, 2, 5, 5)), L(normal(2, 2, 3, 3)), uses=["conv2d"])
# Dilated and grouped convolutions: groups 1, 2 and C = 4 (depthwise, two filters per
# channel), dilation 1 and 2, with stride, padding, a non-square input [2, 4, 7, 6] and a
# non-square kernel 3×2.
CONV_X = normal(2, 4, 7, 6, key=20)
for groups in (1, 2, 4):
    for dilation in ((1, 1), (2, 2), (2, 1)):
        for stride, padding in [((1, 1), (0, 0)), ((2, 1), (1, 2))]:
            kw = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
            case(f"conv2d[groups={groups},dilation={dilation},stride={stride},padding={padding}]",
                 lambda s, x, w, kw=kw: x.conv2d(w, **kw),
                 lambda x, w, kw=kw: ref.conv2d(x, w, **kw), L(CONV_X), L(normal(8, 4 // groups, 3, 2, key=groups)),
                 uses=["conv2d"])
case("conv2d_positional_dilation_groups", lambda s, x, w: x.conv2d(w, (1, 2), (2, 1), (2, 3), 2),
     lambda x, w: ref.conv2d(x, w, (1, 2), (2, 1), (2, 3), 2), L(CONV_X), L(normal(2, 2, 2, 2)), uses=["conv2d"])
case("conv2d_depthwise_constant_weights", lambda s, x, w: x.conv2d(w, padding=(1, 1), groups=4),
     lambda x, w: ref.conv2d(x, w, padding=(1, 1), groups=4), L(CONV_X), C(normal(4, 1, 3, 3)), uses=["conv2d"])
POOL_X = distinct(2, 2, 5, 6)
for pool, f in [("max_pool2d", ref.max_pool2d), ("avg_pool2d", ref.avg_pool2d)]:
    for kernel, stride, padding in [((2, 2), None, (0, 0)), ((2, 3), (1, 2), (0, 0)), ((3, 3), (2, 2), (1, 1)),
                                    ((2, 2), (1, 1), (1, 0))]:
        kw = {"stride": stride, "padding": padding}
        case(f"{pool}[kernel={kernel},stride={stride},padding={padding}]",
             lambda s, x, p=pool, k=kernel, kw=kw: getattr(x, p)(k, **kw),
             lambda x, f=f, k=kernel, st=stride, pd=padding: f(x, k, st, pd), L(POOL_X), uses=[pool])
    case(f"{pool}_positional", lambda s, x, p=pool: getattr(x, p)((2, 2), (2, 1), (1, 1)),
         lambda x, f=f: f(x, (2, 2), (2, 1), (1, 1)), L(POOL_X), uses=[pool])
# Dilated max pooling; every window keeps a tap inside the input (no −inf).
for kernel, stride, padding, dilation in [((2, 2), None, (0, 0), (2, 2)), ((3, 2), (1, 2), (1, 1), (2, 1)),
                                          ((2, 3), (2, 1), (1, 1), (1, 2)), ((2, 2), (1, 1), (0, 0), (1, 1))]:
    kw = {"stride": stride, "padding": padding, "dilation": dilation}
    case(f"max_pool2d[kernel={kernel},stride={stride},padding={padding},dilation={dilation}]",
         lambda s, x, k=kernel, kw=kw: x.max_pool2d(k, **kw), lambda x, k=kernel, kw=kw: ref.max_pool2d(x, k, **kw),
         L(POOL_X), uses=["max_pool2d"])
case("max_pool2d_positional_dilation", lambda s, x: x.max_pool2d((2, 2), (1, 2), (1, 0), (2, 3)),
     lambda x: ref.max_pool2d(x, (2, 2), (1, 2), (1, 0), (2, 3)), L(POOL_X), uses=["max_pool2d"])

QKV = normal(2, 4, 12)  # B=2, T=4, C=4
for heads in (1, 2, 4):
    for causal in (True, False):
        case(f"attention_weights[heads={heads},causal={causal}]",
             lambda s, q, h=heads, c=causal: q.attention_weights(h, causal=c),
             lambda q, h=heads, c=causal: ref.attention_weights(q, h, c), L(QKV), uses=["attention_weights"])
case("attention_weights_default_causal", lambda s, q: q.attention_weights(2), lambda q: ref.attention_weights(q, 2),
     L(QKV), uses=["attention_weights"])
case("attention", lambda s, q: q.attention_weights(2).attend(q),
     lambda q: ref.attend(ref.attention_weights(q, 2), q), L(QKV), uses=["attention_weights", "attend"])
case("attend", lambda s, p, q: p.attend(q), ref.attend, L(uniform(0.0, 1.0, 2, 2, 4, 4)), L(QKV), uses=["attend"])


# ------------------------------------------------------------------------- runner


def record(c, dtype):
    """Runs case `c` in a fresh graph of `dtype`; returns (value, [grad per leaf], weights)."""
    g = tapir.Graph(dtype=dtype)
    w = _rng("weights", c.id).standard_normal(np.shape(c.ref(*[a.value for a in c.args])))
    with g.scope() as s:
        args = []
        for a in c.args:
            v = a.value.astype(dtype)
            args.append(s.leaf(v) if a.kind == "leaf" else s.input(v) if a.kind == "input" else v)
        y = c.fn(s, *args)
        assert isinstance(y, tapir.Var), f"{c.id}: the result is a {type(y).__name__}, not a tapir.Var"
        value = y.numpy()
        assert isinstance(value, np.ndarray) and value.dtype == np.dtype(dtype)
        assert tuple(y.shape) == value.shape
        if dtype == "float32":
            return value, None, w
        s.backward((y * s.input(w)).sum())
        grads = [a.grad for a, spec in zip(args, c.args) if spec.kind == "leaf"]
    return value, grads, w


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_op_float64(c):
    arrays = [a.value for a in c.args]
    expected = np.asarray(c.ref(*arrays), np.float64)
    value, grads, w = record(c, "float64")
    assert value.shape == expected.shape, f"{c.id}: shape {value.shape}, NumPy {expected.shape}"
    np.testing.assert_allclose(value, expected, rtol=F64_FWD_RTOL, atol=F64_FWD_ATOL, err_msg=f"{c.id}: forward")

    leaves = [i for i, a in enumerate(c.args) if a.kind == "leaf"]
    if c.grad_ref is not None:
        numeric = c.grad_ref(w, *arrays)
    else:
        numeric = ref.central_differences(lambda *xs: float(np.sum(np.asarray(c.ref(*xs)) * w)), arrays, leaves)
    for k, analytic, num in zip(leaves, grads, numeric):
        assert analytic is not None, f"{c.id}: no gradient reached input {k}"
        assert analytic.shape == num.shape, f"{c.id}: grad of input {k} has shape {analytic.shape}, not {num.shape}"
        worst = ref.close(analytic, num, GRAD_ATOL, GRAD_RTOL)
        assert worst <= 0, (
            f"{c.id}: gradient of input {k} off by {worst:.3g} beyond tolerance\n"
            f"analytic:\n{analytic}\nfinite differences:\n{num}"
        )


@pytest.mark.parametrize("c", CASES, ids=[c.id for c in CASES])
def test_op_float32_forward(c):
    # The reference sees the same float32-rounded inputs, computed in float64.
    arrays = [a.value.astype(np.float32).astype(np.float64) for a in c.args]
    expected = np.asarray(c.ref(*arrays), np.float64)
    c32 = dataclasses.replace(c, args=[Arg(a.kind, v) for a, v in zip(c.args, arrays)])
    value, _, _ = record(c32, "float32")
    assert value.shape == expected.shape
    scale = max(1.0, float(np.max(np.abs(expected), initial=0.0)))
    np.testing.assert_allclose(value, expected, rtol=F32_FWD_RTOL, atol=F32_FWD_ATOL * scale, err_msg=c.id)


# --------------------------------------------------------------- hand-worked cases


def test_hand_worked_product_rule():
    # L = Σ (x ⊙ y), so dL/dx = y and dL/dy = x.
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(np.array([1.0, 2.0, 3.0]))
        y = s.leaf(np.array([4.0, 5.0, 6.0]))
        loss = (x * y).sum()
        assert loss.item() == 32.0
        s.backward(loss)
        assert x.grad.tolist() == [4.0, 5.0, 6.0]
        assert y.grad.tolist() == [1.0, 2.0, 3.0]


def test_a_value_used_twice_gets_both_contributions():
    # L = Σ x ⊙ x, so dL/dx = 2x (both uses of x accumulate).
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(np.array([1.5, -2.0]))
        s.backward((x * x).sum())
        assert x.grad.tolist() == [3.0, -4.0]


def test_leaf_without_path_has_no_grad_and_constants_do_not_require_grad():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(np.ones(3))
        unused = s.leaf(np.ones(2))
        c = s.input(np.ones(3))
        assert x.requires_grad and not c.requires_grad
        assert (x * c).requires_grad and not (c * 2.0).requires_grad
        assert not x.detach().requires_grad
        assert not x.gt(0.0).requires_grad
        assert x.grad is None  # before backward
        s.backward((x * c).sum())
        assert unused.grad is None
        assert c.grad is None
        assert x.grad.tolist() == [1.0, 1.0, 1.0]


def test_properties_and_repr():
    g = tapir.Graph(dtype="float32")
    with g.scope() as s:
        x = s.leaf(np.zeros((2, 3), np.float32))
        y = x.tanh()
        assert list(y.shape) == [2, 3] and y.ndim == 2 and y.dtype == "float32"
        assert s.input(np.float32(1.0)).ndim == 0
        r = repr(y)
        assert "tanh" in r and "[2, 3]" in r and "float32" in r
    assert list(y.shape) == [2, 3]  # the shape survives the scope, the value does not
    assert "tapir.Graph" in repr(g) and "float32" in repr(g)


@pytest.mark.parametrize("call, cls, words", [
    (lambda x: x.reshape(-1, -1), tapir.ShapeError, ["reshape", "[-1, -1]"]),
    (lambda x: x.reshape(5, -1), tapir.ShapeError, ["reshape", "[5, -1]", "24 elements"]),
    (lambda x: x.reshape(0, -1), tapir.ShapeError, ["reshape", "[0, -1]"]),
    (lambda x: x.reshape(-2, 12), tapir.ShapeError, ["reshape", "[-2, 12]"]),
    (lambda x: x.permute(0, 1, -4), tapir.ShapeError, ["permute", "[0, 1, -4]", "rank 3"]),
    (lambda x: x.broadcast_to(-1, 2, 3, 4), tapir.ShapeError, ["broadcast_to", "[-1, 2, 3, 4]"]),
    (lambda x: x.narrow(0, -1, 1), tapir.ArgumentError, ["narrow", "[-1, 1]"]),
    (lambda x: x.var(correction=-1), tapir.ArgumentError, ["var", "correction -1"]),
    (lambda x: x.reshape(1, 2, 3, 4).conv2d(np.ones((1, 2, 1, 1)), stride=(-1, 1)), tapir.ArgumentError,
     ["conv2d", "stride [-1, 1]"]),
    (lambda x: x.reshape(1, 2, 3, 4).conv2d(np.ones((1, 2, 1, 1)), groups=-2), tapir.ArgumentError,
     ["conv2d", "groups -2"]),
    (lambda x: x.reshape(1, 2, 3, 4).max_pool2d((2, 2), dilation=(1, -1)), tapir.ArgumentError,
     ["max_pool2d", "dilation [1, -1]"]),
    (lambda x: x.reshape(1, 2, 3, 4).avg_pool2d((-2, 2)), tapir.ArgumentError, ["avg_pool2d", "kernel [-2, 2]"]),
    (lambda x: x.reshape(1, 3, 8).attention_weights(-1), tapir.ArgumentError, ["attention_weights", "heads -1"]),
])
def test_negative_sizes_raise_typed_errors_naming_op_shape_and_line(call, cls, words):
    """A negative size, stride or count is a typed tapir error (not PyO3's OverflowError),
    naming the op, the value, the handle's shape and the caller's line."""
    g = tapir.Graph("float64")
    with g.scope() as s:
        x = s.leaf(X3)
        with pytest.raises(cls) as e:
            call(x)
        msg = str(e.value)
        for w in words:
            assert w in msg, f"{w!r} not in {msg!r}"
        assert "test_ops.py:" in msg, msg
        assert "shape [" in msg, msg


def test_reference_conv2d_and_max_pool2d_agree_with_pytorch():
    # The oracle itself: _reference's dilated, grouped conv2d and dilated max_pool2d
    # against the PyTorch float64 outputs the Rust tests read (tools/conv_fixtures.py).
    path = pathlib.Path(__file__).resolve().parents[2] / "tapir/tests/data/conv_fixtures.txt"
    cases = []
    for line in path.read_text().splitlines():
        if line.startswith("case "):
            op, *args = line.split()[1:]
            cases.append((op, {k: tuple(map(int, v.split(","))) for k, v in (a.split("=") for a in args)}, {}))
        elif line and not line.startswith("#"):
            name, *values = line.split()
            cases[-1][2][name] = np.array(values, np.float64)
    checked = set()
    for op, a, t in cases:
        x = t["x"].reshape(a["x"])
        if op == "conv2d":
            out = ref.conv2d(x, t["w"].reshape(a["w"]), a["stride"], a["padding"], a["dilation"], a["groups"][0])
            checked.add((op, a["groups"][0] == a["x"][1], a["dilation"] != (1, 1)))
        elif op == "max_pool2d":
            out = ref.max_pool2d(x, a["kernel"], a["stride"], a["padding"], a["dilation"])
            checked.add((op, a["dilation"] != (1, 1)))
        else:
            continue
        np.testing.assert_allclose(out.reshape(-1), t["out"], rtol=1e-12, atol=1e-12, err_msg=f"{op} {a}")
    assert {("conv2d", True, True), ("conv2d", False, True), ("max_pool2d", True)} <= checked


# ------------------------------------------------------------------- introspection

COVERED = {name for c in CASES for name in c.uses}

# Names tested in other files: name -> "module::test" (the test must exist).
ELSEWHERE = {
    # tapir.Var
    "numpy": "test_numpy::test_numpy_returns_a_copy_numpy_owns",
    "item": "test_numpy::test_float_and_item_of_a_scalar",
    "__float__": "test_numpy::test_float_and_item_of_a_scalar",
    "__bool__": "test_numpy::test_len_and_bool_follow_numpy",
    "__len__": "test_numpy::test_len_and_bool_follow_numpy",
    "__array__": "test_numpy::test_np_asarray_of_a_var",
    "grad": "test_op_float64",
    "requires_grad": "test_leaf_without_path_has_no_grad_and_constants_do_not_require_grad",
    "shape": "test_properties_and_repr",
    "ndim": "test_properties_and_repr",
    "dtype": "test_properties_and_repr",
    "__repr__": "test_properties_and_repr",
    # tapir.Scope
    "__enter__": "test_scope::test_exception_inside_with_closes_the_scope",
    "__exit__": "test_scope::test_exception_inside_with_closes_the_scope",
    "close": "test_scope::test_close_ends_the_scope_and_is_idempotent",
    "leaf": "test_op_float64",
    "input": "test_op_float64",
    "backward": "test_op_float64",
    "backward_into": "test_train::test_backward_into_accumulates",
    "param": "test_scope::test_store_changes_inside_the_scope_raise_and_succeed_after",
    "grad@Scope": "test_scope::test_second_derivative_of_cube",
    "stats": "test_scope::test_stats",
    "no_grad": "test_no_grad::test_no_grad_computes_values_without_gradients",
    # tapir
    "Graph": "test_op_float64",
    "Scope": "test_op_float64",
    "Var": "test_op_float64",
    "NoGrad": "test_no_grad::test_no_grad_computes_values_without_gradients",
    "ParamStore": "test_io::test_to_bytes_is_read_by_safetensors",
    "Tensor": "test_tensor::test_tensor_copies_an_array_once_and_keeps_its_dtype",
    "func": "test_func::test_grad_of_sum_of_squares",
    "GradBuffer": "test_train::test_backward_into_accumulates",
    "Optimizer": "test_train::test_sgd_step_matches_closed_form",
    "init_threads": "test_train::test_init_threads_in_a_fresh_process",
    "set_spin_wait": "test_train::test_init_threads_in_a_fresh_process",
    "nn": "test_train::test_mlp_reaches_97_percent_on_digits",
    "optim": "test_train::test_sgd_step_matches_closed_form",
    "TapirError": "test_scope::test_every_exception_derives_from_its_builtin",
    "ScopeError": "test_scope::test_handle_used_after_its_scope_ended",
    "DTypeError": "test_numpy::test_float32_graph_rejects_float64_array",
    "ShapeError": "test_numpy::test_huge_shapes_raise_a_tapir_error",
    "TapirIndexError": "test_numpy::test_labels_and_indices_must_be_non_negative_integers",
    "GradientError": "test_scope::test_second_backward_raises_gradient_error",
    "ArenaLimitError": "test_numpy::test_arena_limit",
    "TapirIOError": "test_io::test_corrupt_buffer_raises_and_leaves_the_store_unchanged",
    "ParamError": "test_train::test_param_store_basics",
    "ArgumentError": "test_scope::test_op_errors_raise_at_the_ops_line",
    "UnsupportedError": "test_scope::test_every_exception_derives_from_its_builtin",
    "TapirMemoryError": "test_scope::test_every_exception_derives_from_its_builtin",
    "NonFiniteError": "test_scope::test_every_exception_derives_from_its_builtin",
    "CallbackError": "test_scope::test_every_exception_derives_from_its_builtin",
    # tapir.nn
    "MLP": "test_train::test_mlp_reaches_97_percent_on_digits",
    "Linear": "test_train::test_linear_layer_matches_numpy",
    "Module": "test_nn::test_gpt_dropout_follows_train_and_eval",
    "Embedding": "test_nn::test_embedding_lookup_of_any_index_shape_and_scattered_gradients",
    "LayerNorm": "test_nn::test_layer_norm_values_gradients_and_init",
    "Dropout": "test_nn::test_dropout_mask_is_the_generators_and_scaled_exactly",
    "Conv2d": "test_nn::test_conv2d_values_and_gradients",
    "MaxPool2d": "test_nn::test_pooling_values_and_gradients",
    "AvgPool2d": "test_nn::test_pooling_values_and_gradients",
    "Flatten": "test_nn::test_flatten_and_a_small_cnn_in_float32",
    "CausalSelfAttention": "test_nn::test_causal_self_attention_values_gradients_and_causality",
    "TransformerBlock": "test_nn::test_transformer_block_values_and_gradients",
    "GPT": "test_nn::test_gpt_values_and_gradients",
    # tapir.optim
    "SGD": "test_train::test_sgd_step_matches_closed_form",
    "Adam": "test_train::test_adam_steps_match_closed_form",
    "AdamW": "test_train::test_adamw_steps_match_closed_form",
    "clip_grad_norm": "test_train::test_clip_grad_norm_matches_closed_form",
    "LRScheduler": "test_nn::test_schedule_arguments_are_checked",
    "LambdaLR": "test_nn::test_step_lr_and_lambda_lr_match_closed_forms",
    "StepLR": "test_nn::test_step_lr_and_lambda_lr_match_closed_forms",
    "LinearLR": "test_nn::test_linear_lr_matches_closed_form",
    "CosineAnnealingLR": "test_nn::test_cosine_annealing_matches_closed_form",
    # tapir.func (checked by name@func: plain "grad" is Var.grad)
    "grad@func": "test_func::test_grad_of_sum_of_squares",
    "value_and_grad@func": "test_func::test_value_and_grad_of_a_cube",
    "hvp@func": "test_func::test_hvp_matches_finite_differences",
    "jvp@func": "test_func::test_jvp_matches_finite_differences",
    "jacobian@func": "test_func::test_jacobian_of_a_linear_map_is_its_matrix",
    "hessian@func": "test_func::test_hessian_of_a_cube_is_diagonal",
    # tapir.Tensor (checked by name@Tensor: the plain names are Var's)
    "shape@Tensor": "test_tensor::test_tensor_copies_an_array_once_and_keeps_its_dtype",
    "ndim@Tensor": "test_tensor::test_tensor_copies_an_array_once_and_keeps_its_dtype",
    "dtype@Tensor": "test_tensor::test_tensor_dtype_rules",
    "__len__@Tensor": "test_tensor::test_tensor_layouts_and_shapes",
    "numpy@Tensor": "test_tensor::test_tensor_copies_an_array_once_and_keeps_its_dtype",
    "__array__@Tensor": "test_tensor::test_tensor_copies_an_array_once_and_keeps_its_dtype",
    "item@Tensor": "test_tensor::test_tensor_layouts_and_shapes",
    "__repr__@Tensor": "test_tensor::test_tensor_repr",
    "__reduce__@Tensor": "test_tensor::test_tensor_pickles_exactly",
}

# Names deliberately not tested as ops, with the reason.
EXCLUDED = {
    "__doc__": "documentation (test_stubs checks the docstrings)",
    "__module__": "class metadata",
    "__eq__": "identity comparison generated by PyO3 (elementwise equality is .equal, tested)",
    "__ne__": "identity comparison generated by PyO3 (the negation of __eq__)",
    "__hash__": "identity hash generated by PyO3, so handles can be dict keys",
    "__new__": "PyO3 constructor slot",
    "__init__": "PyO3 constructor slot",
    "__all__": "the export list itself",
}


def _resolve(ref_name):
    """The test function a tested-elsewhere entry names (this module if no module given)."""
    mod, _, fn = ref_name.rpartition("::")
    module = importlib.import_module(mod) if mod else importlib.import_module(__name__)
    return getattr(module, fn, None)


def test_tested_elsewhere_entries_name_existing_tests():
    missing = sorted(f"{k} -> {v}" for k, v in ELSEWHERE.items() if _resolve(v) is None)
    assert not missing, "tested-elsewhere entries naming no test:\n" + "\n".join(missing)


def _uncovered(names, scoped=None):
    known = COVERED | set(ELSEWHERE) | set(EXCLUDED)
    out = []
    for n in sorted(names):
        if n in known or (scoped and f"{n}@{scoped}" in known):
            continue
        out.append(n)
    return out


def _defined_by(cls):
    """Public attributes and the dunders `cls` defines itself (not inherited from object)."""
    names = {n for n in set(dir(cls)) - set(dir(object))}
    names |= {n for n, v in vars(cls).items() if n.startswith("__") and getattr(object, n, None) is not v}
    return names


def test_every_var_attribute_is_tested_or_excluded():
    names = _defined_by(tapir.Var)
    assert {"__add__", "__gt__", "sum", "T"} <= names  # the introspection itself works
    missing = _uncovered(names)
    assert not missing, f"tapir.Var names neither in the op table, tested elsewhere nor excluded: {missing}"


def test_every_scope_method_is_tested_or_excluded():
    names = {n for n in _defined_by(tapir.Scope) if not n.startswith("__") or n in vars(tapir.Scope)}
    missing = _uncovered(names, scoped="Scope")
    assert not missing, f"tapir.Scope names neither tested nor excluded: {missing}"


def _uncovered_strictly(names, scoped):
    """`names` with no `name@scoped` entry: for namespaces whose plain names mean another
    class's attribute (`grad` is `Var.grad`)."""
    return sorted(n for n in names if f"{n}@{scoped}" not in ELSEWHERE and n not in EXCLUDED)


def test_every_function_of_tapir_func_is_tested():
    m = importlib.import_module("tapir.func")
    names = {n for n in dir(m) if not n.startswith("_") and type(getattr(m, n)).__name__ != "module"}
    assert names == set(m.__all__), f"tapir.func's public names are not its __all__: {names ^ set(m.__all__)}"
    missing = _uncovered_strictly(names, "func")
    assert not missing, f"tapir.func names with no name@func test: {missing}"


def test_every_tensor_attribute_is_tested_or_excluded():
    names = _defined_by(tapir.Tensor)
    assert {"shape", "numpy", "__reduce__"} <= names  # the introspection itself works
    missing = _uncovered_strictly(names, "Tensor")
    assert not missing, f"tapir.Tensor names with no name@Tensor test nor exclusion: {missing}"


@pytest.mark.parametrize("module", ["tapir", "tapir.nn", "tapir.optim"])
def test_every_public_name_of_the_package_is_tested_or_excluded(module):
    m = importlib.import_module(module)
    names = {n for n in dir(m) if not n.startswith("_")}
    # Modules the package imports for itself are not its API.
    names -= {n for n in names if type(getattr(m, n)).__name__ == "module" and n not in ("nn", "optim", "func")}
    if hasattr(m, "__all__"):
        assert set(m.__all__) <= set(dir(m)), f"{module}.__all__ names missing attributes"
    missing = _uncovered(names)
    assert not missing, f"{module} names neither tested nor excluded: {missing}"
