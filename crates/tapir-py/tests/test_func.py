"""`tapir.func`: closed forms (∇Σx² = 2x, the Hessian of Σx³ = diag(6x), the Jacobian of
a linear map = its matrix), the rest against float64 central differences, and the errors
by text."""

import math
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import _reference as ref
import tapir

AT = re.compile(r"test_func\.py:(\d+)")


def lineno():
    return sys._getframe(1).f_lineno


def at_line(err, line):
    found = [int(n) for n in AT.findall(str(err))]
    assert line in found, f"expected test_func.py:{line} in: {err}"


X = np.array([0.5, -1.25, 2.0, 0.75])
A = np.array([[1.0, 2.0, -1.0, 0.5], [0.0, -3.0, 4.0, 1.5], [2.5, 1.0, 0.0, -2.0]])
V = np.array([1.0, -0.5, 0.25, 2.0])


def f_np(x):
    return np.sum(np.sin(x) * x * x)  # f = Σ x² sin x


def grad_np(x):
    return 2 * x * np.sin(x) + x * x * np.cos(x)


def f_tapir(s, x):
    return (x.sin() * x * x).sum()


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_grad_of_sum_of_squares(dtype):
    x = X.astype(dtype)
    g = tapir.func.grad(lambda s, x: (x * x).sum(), x)  # ∇ Σx² = 2x
    assert g.dtype == np.dtype(dtype) and g.shape == x.shape
    np.testing.assert_array_equal(g, 2 * x)
    # A Tensor and a list are inputs too (a list is float64, as NumPy makes it).
    np.testing.assert_array_equal(tapir.func.grad(lambda s, x: (x * x).sum(), tapir.Tensor(x)), 2 * x)
    assert tapir.func.grad(lambda s, x: (x * x).sum(), X.tolist()).dtype == np.float64


def test_grad_matches_finite_differences_and_reuses_the_graph():
    g = tapir.Graph(dtype="float64")
    numeric = ref.central_differences(f_np, [X], [0])[0]
    for _ in range(3):  # one graph for every call: its arena is reused
        analytic = tapir.func.grad(f_tapir, X, graph=g)
        assert ref.close(analytic, numeric, 1e-6, 1e-6) <= 0, (analytic, numeric)
    assert g.stats()["nodes"] > 0


def test_value_and_grad_of_a_cube():
    value, grad = tapir.func.value_and_grad(lambda s, x: (x**3).sum(), X)  # Σx³ and 3x²
    assert isinstance(value, float)
    np.testing.assert_allclose(value, np.sum(X**3), rtol=1e-15)
    np.testing.assert_allclose(grad, 3 * X**2, rtol=1e-15)
    # A one-element output of any shape will do, as in Rust.
    value, grad = tapir.func.value_and_grad(lambda s, x: (x * x).sum(keepdims=True), X)
    np.testing.assert_allclose(grad, 2 * X, rtol=1e-15)


def test_hessian_of_a_cube_is_diagonal():
    h = tapir.func.hessian(lambda s, x: (x**3).sum(), X)  # ∂²Σx³ = diag(6x)
    assert h.shape == (4, 4)
    np.testing.assert_allclose(h, np.diag(6 * X), rtol=1e-14, atol=1e-14)
    # Of a matrix input, the shape is the input's twice.
    m = X.reshape(2, 2)
    h = tapir.func.hessian(lambda s, x: (x**3).sum(), m)
    np.testing.assert_allclose(h.reshape(4, 4), np.diag(6 * X), rtol=1e-14, atol=1e-14)
    assert h.shape == (2, 2, 2, 2)


def test_hessian_matches_finite_differences_of_the_gradient():
    # Row i of the Hessian is the gradient of ∂f/∂xᵢ (the closed form above).
    numeric = np.stack([ref.central_differences(lambda x, i=i: grad_np(x)[i], [X], [0])[0] for i in range(4)])
    h = tapir.func.hessian(f_tapir, X)
    assert ref.close(h, numeric, 1e-6, 1e-6) <= 0, (h, numeric)


def test_jacobian_of_a_linear_map_is_its_matrix():
    j = tapir.func.jacobian(lambda s, x: (s.input(A) @ x.reshape(4, 1)).reshape(3), X)
    assert j.shape == (3, 4)
    np.testing.assert_array_equal(j, A)


def test_jacobian_matches_finite_differences():
    # f(x) = sin(x) ⊙ x reshaped [2, 2], of a [4] input: the Jacobian is [2, 2, 4].
    j = tapir.func.jacobian(lambda s, x: (x.sin() * x).reshape(2, 2), X)
    assert j.shape == (2, 2, 4)
    numeric = np.stack([
        ref.central_differences(lambda x, i=i: (np.sin(x) * x)[i], [X], [0])[0] for i in range(4)
    ]).reshape(2, 2, 4)
    assert ref.close(j, numeric, 1e-6, 1e-6) <= 0, (j, numeric)
    # Empty outputs and inputs give empty Jacobians.
    assert tapir.func.jacobian(lambda s, x: x.narrow(0, 0, 0), X).shape == (0, 4)


def test_hvp_matches_finite_differences():
    hv = tapir.func.hvp(f_tapir, X, V)
    # H v = ∇(∇f · v): central differences of the closed-form gradient's projection.
    numeric = ref.central_differences(lambda x: float(grad_np(x) @ V), [X], [0])[0]
    assert ref.close(hv, numeric, 1e-6, 1e-6) <= 0, (hv, numeric)
    np.testing.assert_allclose(hv, tapir.func.hessian(f_tapir, X) @ V, rtol=1e-12, atol=1e-12)


def test_jvp_matches_finite_differences():
    def f(s, x):
        return (s.input(A) @ (x.sin() * x).reshape(4, 1)).reshape(3)

    y, jv = tapir.func.jvp(f, X, V)
    np.testing.assert_allclose(y, A @ (np.sin(X) * X), rtol=1e-14)
    h = 1e-6
    numeric = (A @ (np.sin(X + h * V) * (X + h * V)) - A @ (np.sin(X - h * V) * (X - h * V))) / (2 * h)
    assert ref.close(jv, numeric, 1e-6, 1e-6) <= 0, (jv, numeric)
    np.testing.assert_allclose(jv, tapir.func.jacobian(f, X) @ V, rtol=1e-12, atol=1e-12)
    # A linear map's J v is A v, whatever x.
    _, jv = tapir.func.jvp(lambda s, x: (s.input(A) @ x.reshape(4, 1)).reshape(3), X, V)
    np.testing.assert_allclose(jv, A @ V, rtol=1e-14)


def test_a_non_scalar_output_is_a_gradient_error():
    for name in ("grad", "value_and_grad", "hvp", "hessian"):
        fn = getattr(tapir.func, name)
        args = (X, V) if name == "hvp" else (X,)
        line = lineno() + 2
        with pytest.raises(tapir.GradientError) as e:
            fn(lambda s, x: x * 2.0, *args)
        assert str(e.value) == (
            f"{name}: needs a tensor with exactly one element, got shape [4] (reduce it with sum or mean first) "
            f"(at {__file__}:{line})"
        )


def test_an_exception_of_f_propagates_unchanged_and_the_graph_stays_usable():
    g = tapir.Graph(dtype="float64")
    boom = KeyError("boom")

    def f(s, x):
        x.exp()
        raise boom

    for name in ("grad", "value_and_grad", "jacobian", "hessian"):
        with pytest.raises(KeyError) as e:
            getattr(tapir.func, name)(f, X, graph=g)
        assert e.value is boom
    with pytest.raises(KeyError):
        tapir.func.jvp(f, X, V, graph=g)
    np.testing.assert_array_equal(tapir.func.grad(lambda s, x: (x * x).sum(), X, graph=g), 2 * X)
    with g.scope() as s:
        assert s.leaf(X).sum().item() == X.sum()


def test_an_op_error_in_f_raises_at_fs_line():
    def f(s, x):
        return (x @ x.reshape(2, 2)).sum()

    line = lineno() - 2
    with pytest.raises(tapir.ShapeError) as e:
        tapir.func.grad(f, X)
    assert "matmul" in str(e.value) and "[4]" in str(e.value) and "[2, 2]" in str(e.value)
    at_line(e.value, line)


def test_argument_errors():
    line = lineno() + 2
    with pytest.raises(tapir.ShapeError) as e:
        tapir.func.hvp(f_tapir, X, V[:3])
    assert str(e.value) == f"hvp: shapes [4] and [3] must be equal (at {__file__}:{line})"
    with pytest.raises(tapir.ShapeError, match=r"jvp: shapes \[4\] and \[1\] must be equal"):
        tapir.func.jvp(lambda s, x: x, X, V[:1])  # [1] would broadcast: it is refused
    with pytest.raises(TypeError) as e:
        tapir.func.grad(lambda s, x: 1.0, X)
    assert str(e.value).startswith("grad: f must return a tapir.Var recorded on the scope it is given, not float")
    with pytest.raises(tapir.DTypeError, match="leaf: a float32 array given to a float64 graph"):
        tapir.func.grad(f_tapir, X.astype(np.float32), graph=tapir.Graph(dtype="float64"))
    g = tapir.Graph(dtype="float64")
    with g.scope():
        with pytest.raises(tapir.ScopeError, match="a scope of this graph is already open"):
            tapir.func.grad(f_tapir, X, graph=g)


def test_a_jacobian_past_the_arena_limit_raises_and_the_graph_recovers():
    g = tapir.Graph(dtype="float64", arena_limit=1 << 16)
    x = np.linspace(-1.0, 1.0, 64)
    with pytest.raises(tapir.ArenaLimitError) as e:
        tapir.func.jacobian(lambda s, x: (x.reshape(64, 1) * x.reshape(1, 64)).reshape(4096), x, graph=g)
    # The transform's name first, then the failing call's; the location is this file's line.
    message = str(e.value)
    assert message.startswith("jacobian: "), message
    assert "arena" in message and f"(at {__file__}:" in message, message
    np.testing.assert_allclose(tapir.func.grad(lambda s, x: (x * x).sum(), x, graph=g), 2 * x)


def test_a_jacobian_too_large_for_memory_is_a_tapir_memory_error(tmp_path):
    # The Jacobian of the identity on 2^17 float32s is 2^17 × 2^17, 64 GiB. The child runs
    # under an address-space limit of about 4 GB, so that the refusal does not depend on
    # the machine's memory or overcommit policy.
    child = tmp_path / "child.py"
    child.write_text(textwrap.dedent("""
        import resource
        resource.setrlimit(resource.RLIMIT_AS, (4_000_000_000, 4_000_000_000))
        import numpy as np, tapir
        x = np.zeros(1 << 17, np.float32)
        try:
            tapir.func.jacobian(lambda s, x: x, x)
        except tapir.TapirMemoryError as e:
            print("child:", e)
    """))
    out = subprocess.run([sys.executable, str(child)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    expected = (
        f"child: jacobian: out of memory allocating {(1 << 34) * 4} bytes for a tensor of shape [131072, 131072] "
        f"(at {child}:7)"
    )
    assert expected in out.stdout, out.stdout + out.stderr


def test_derivatives_that_vanish_are_zeros_not_errors():
    # A linear f has a zero Hessian; a constant f zero gradients and Jacobians.
    np.testing.assert_array_equal(tapir.func.hvp(lambda s, x: (x * 2.0).sum(), X, V), np.zeros(4))
    np.testing.assert_array_equal(tapir.func.hessian(lambda s, x: (x * 2.0).sum(), X), np.zeros((4, 4)))
    np.testing.assert_array_equal(tapir.func.grad(lambda s, x: s.input(np.ones(())), X), np.zeros(4))
    y, jv = tapir.func.jvp(lambda s, x: s.input(np.ones(2)), X, V)
    np.testing.assert_array_equal(y, np.ones(2))
    np.testing.assert_array_equal(jv, np.zeros(2))
    np.testing.assert_array_equal(tapir.func.jacobian(lambda s, x: s.input(np.ones(2)), X), np.zeros((2, 4)))
