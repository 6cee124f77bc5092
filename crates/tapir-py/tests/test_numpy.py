"""NumPy in and out: one dtype per graph, weak Python numbers, what is copied, the odd
arrays (Fortran order, negative strides, 0-d, empty, huge), and NumPy's protocols.

Cases that could take the process down (huge or empty shapes) run in a child process with
an address-space limit, so that a crash is reported as a failure of that test rather than
the end of the run."""

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import tapir

F32, F64 = np.float32, np.float64


# ------------------------------------------------------------------------- dtypes


def test_float32_graph_rejects_float64_array():
    g = tapir.Graph()
    assert g.dtype == "float32"
    with g.scope() as s:
        for make in (s.leaf, s.input):
            with pytest.raises(tapir.DTypeError) as e:
                make(np.ones(3, F64))
            assert isinstance(e.value, TypeError)
            msg = str(e.value)
            assert "float64" in msg and "float32" in msg and "astype" in msg, msg
    with g.scope() as s:
        x = s.leaf(np.ones(3, F32))
        with pytest.raises(tapir.DTypeError):
            x + np.ones(3, F64)
    with g.scope() as s:
        x = s.leaf(np.ones(3, F32))
        with pytest.raises(tapir.DTypeError):
            x.mse_loss(np.zeros(3, F64))


def test_float64_graph_rejects_float32_array():
    g = tapir.Graph(dtype="float64")
    assert g.dtype == "float64"
    with g.scope() as s:
        with pytest.raises(tapir.DTypeError) as e:
            s.leaf(np.ones((2, 2), F32))
        assert "float32" in str(e.value) and "float64" in str(e.value)
    with g.scope() as s:
        x = s.leaf(np.ones(2, F64))
        with pytest.raises(tapir.DTypeError):
            x * np.ones(2, F32)


def test_param_store_dtype_must_match_the_graph():
    store = tapir.ParamStore("float64")
    store.add("w", np.ones(2, F64))
    with pytest.raises(tapir.DTypeError):
        store.add("v", np.ones(2, F32))
    g = tapir.Graph("float32")
    with g.scope() as s:
        with pytest.raises(tapir.DTypeError):
            s.param(store, "w")


@pytest.mark.parametrize(
    "spec, expected",
    [("float32", "float32"), ("f32", "float32"), (np.float32, "float32"), (np.dtype("float32"), "float32"),
     ("float64", "float64"), ("f64", "float64"), (np.float64, "float64"), (None, "float32")],
)
def test_graph_dtype_spellings(spec, expected):
    assert tapir.Graph(dtype=spec).dtype == expected
    assert tapir.ParamStore(spec).dtype == expected


@pytest.mark.parametrize("spec", ["int32", np.float16, "float16", "bfloat16", np.complex64, bool])
def test_graph_of_another_dtype_is_refused(spec):
    with pytest.raises(tapir.DTypeError):
        tapir.Graph(dtype=spec)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_python_numbers_and_lists_are_weak(dtype):
    g = tapir.Graph(dtype=dtype)
    with g.scope() as s:
        x = s.leaf(np.full(3, 1.5, dtype))
        for y in (x * 2.0, 2.0 * x, x + 1, 3 - x, x / 4, x**2, 2.0**x, x.maximum(0.5), x + [1.0, 2.0, 3.0],
                  [1, 2, 3] * x, x.mse_loss([0.0, 0.0, 0.0])):
            assert y.dtype == dtype
            assert y.numpy().dtype == np.dtype(dtype)
        np.testing.assert_array_equal((x * 2.0).numpy(), np.full(3, 3.0, dtype))
        # A list given as a value takes the graph's dtype, ints included (convert.rs).
        v = s.leaf([1, 2, 3])
        assert v.numpy().dtype == np.dtype(dtype)
        np.testing.assert_array_equal(v.numpy(), [1.0, 2.0, 3.0])
        w = s.input([[1.5, 2], [3, 4]])
        np.testing.assert_array_equal(w.numpy(), np.array([[1.5, 2], [3, 4]], dtype))
        assert s.leaf(7).numpy().dtype == np.dtype(dtype)


def test_int_arrays_are_not_values_but_are_labels_and_indices():
    g = tapir.Graph()
    with g.scope() as s:
        for arr in (np.arange(3), np.arange(3, dtype=np.int32), np.arange(3, dtype=np.uint8)):
            with pytest.raises(tapir.DTypeError):
                s.leaf(arr)
    with g.scope() as s:
        x = s.leaf(np.zeros((3, 4), F32))
        for labels in ([0, 3, 1], np.array([0, 3, 1]), np.array([0, 3, 1], np.int32), np.array([0, 3, 1], np.uint16)):
            assert x.cross_entropy(labels).item() == pytest.approx(np.log(4.0), rel=1e-6)
            assert x.nll_loss(labels).item() == 0.0
        np.testing.assert_array_equal(x.index_select(1, np.array([3, 0], np.int64)).numpy(), np.zeros((3, 2)))


def test_labels_and_indices_must_be_non_negative_integers():
    cases = [
        (tapir.DTypeError, lambda x: x.cross_entropy(np.array([0.0, 1.0]))),
        (tapir.DTypeError, lambda x: x.index_select(0, np.array([0.0]))),
        (tapir.DTypeError, lambda x: x.nll_loss([0.5, 1])),
        (tapir.TapirIndexError, lambda x: x.cross_entropy([-1, 0])),
        (tapir.TapirIndexError, lambda x: x.index_select(0, [-1])),
        (tapir.TapirIndexError, lambda x: x.cross_entropy([0, 3])),
        (tapir.TapirIndexError, lambda x: x.index_select(1, [3])),
        (tapir.TapirIndexError, lambda x: x[2]),
        (tapir.TapirIndexError, lambda x: x[0, -4]),
    ]
    g = tapir.Graph()
    for cls, f in cases:
        with g.scope() as s:
            x = s.leaf(np.zeros((2, 3), F32))
            with pytest.raises(cls):
                f(x)
    assert issubclass(tapir.TapirIndexError, IndexError)


def test_an_empty_list_of_indices_is_a_list_of_ints():
    # docs/python.md: labels and indices are int32/int64 arrays or lists. NumPy reads [] as
    # float64, but an empty list holds no non-integer, so it selects nothing (np.take agrees).
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.ones((2, 3), F32))
        y = x.index_select(0, [])
        assert tuple(y.shape) == np.take(np.ones((2, 3)), [], axis=0).shape == (0, 3)
    with g.scope() as s:
        assert np.isnan(s.leaf(np.ones((0, 3), F32)).cross_entropy([]).item())  # the mean of nothing


@pytest.mark.parametrize(
    "bad",
    [np.ones(3, np.float16), np.ones(3, bool), np.array([1.0, None], object), np.ones(3, np.complex128),
     np.ones(3, np.complex64), [True, False], np.array(["a", "b"]), None],
    ids=["float16", "bool", "object", "complex128", "complex64", "bool-list", "str", "None"],
)
def test_unsupported_arrays_are_dtype_errors(bad):
    g = tapir.Graph()
    for use in (lambda s: s.leaf(bad), lambda s: s.input(bad), lambda s: s.leaf(np.ones(3, F32)) + bad):
        with g.scope() as s:
            with pytest.raises(tapir.DTypeError):
                use(s)
    with g.scope() as s:
        with pytest.raises(tapir.DTypeError):
            s.leaf(np.ones(3, F32)) * True  # a bool is not a number here
    store = tapir.ParamStore()
    with pytest.raises(tapir.DTypeError):
        store.add("w", bad)
    assert len(store) == 0


# ------------------------------------------------------------------- layouts, 0-d


@pytest.mark.parametrize(
    "make",
    [
        lambda a: np.asfortranarray(a),
        lambda a: a[::-1],
        lambda a: a[:, ::-2],
        lambda a: a[::2, 1::2],
        lambda a: a.T,
        lambda a: np.broadcast_to(a[:1], a.shape),
        lambda a: a.reshape(2, 3, 4)[:, ::-1, :].transpose(2, 0, 1),
    ],
    ids=["fortran", "negative-stride", "negative-step-2", "strided", "transposed", "zero-stride", "mixed"],
)
def test_odd_layouts_are_copied_in_row_major_order(make):
    base = np.arange(24, dtype=F64).reshape(4, 6) * 0.5 - 3.0
    arr = make(base)
    assert not arr.flags.c_contiguous or arr.base is not None
    expected = np.array(arr, copy=True)
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(arr)
        assert tuple(x.shape) == arr.shape
        np.testing.assert_array_equal(x.numpy(), expected)
        c = s.input(arr)
        np.testing.assert_array_equal((c * 1.0).numpy(), expected)
        # As an operand of an op, too, and gradients come back in the same layout.
        y = x * arr
        np.testing.assert_array_equal(y.numpy(), expected * expected)
        s.backward(y.sum())
        np.testing.assert_array_equal(x.grad, expected)  # ∂Σ(x ⊙ arr)/∂x = arr
    store = tapir.ParamStore("float64")
    store.add("w", arr)
    np.testing.assert_array_equal(store["w"], expected)


def test_zero_d_arrays_have_shape_empty():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(np.array(2.5))
        assert tuple(x.shape) == () and x.ndim == 0
        assert x.numpy().shape == () and x.numpy() == 2.5
        y = x * x
        assert tuple(y.shape) == ()
        s.backward(y)
        assert x.grad.shape == () and x.grad == 5.0


def test_shape_is_a_tuple_like_numpy():
    # The getter's docstring says "The dimensions, as a tuple"; docs/python.md says a 0-d
    # array "is shape ()".
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.zeros((2, 3), F32))
        assert x.shape == (2, 3), f"shape is {x.shape!r}"
        assert s.leaf(np.float32(1.0)).shape == ()
        assert x.shape == x.numpy().shape


# ------------------------------------------------------------------ copies in/out


def _owner(a):
    """The array at the end of `a`'s base chain."""
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def test_numpy_returns_a_copy_numpy_owns():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.arange(6, dtype=F32).reshape(2, 3))
        a = x.numpy()
        assert a.flags.writeable
        assert _owner(a).flags.owndata and _owner(a).base is None, "the data is not NumPy's own"
        b = x.numpy()
        assert not np.shares_memory(a, b)
        a[0, 0] = 100.0
        assert x.numpy()[0, 0] == 0.0
        assert (x * 1.0).numpy()[0, 0] == 0.0  # the tape is unchanged too
        s.backward((x * x).sum())
        gr = x.grad
        assert _owner(gr).flags.owndata
        gr[:] = -1.0
        np.testing.assert_array_equal(x.grad, 2 * np.arange(6, dtype=F32).reshape(2, 3))
    # The copies outlive the scope, and the next scope (reusing the arena) leaves them alone.
    with g.scope() as s:
        s.leaf(np.full((2, 3), 7.0, F32)) * 3.0
    np.testing.assert_array_equal(b, np.arange(6, dtype=F32).reshape(2, 3))


def test_a_later_write_to_the_input_array_changes_nothing():
    g = tapir.Graph()
    arr = np.ones((2, 3), F32)
    const = np.full(3, 2.0, F32)
    with g.scope() as s:
        x = s.leaf(arr)
        c = s.input(const)
        y = x * c
        arr[:] = 50.0
        const[:] = -1.0
        np.testing.assert_array_equal(x.numpy(), np.ones((2, 3)))
        np.testing.assert_array_equal(c.numpy(), np.full(3, 2.0))
        s.backward(y.sum())
        np.testing.assert_array_equal(x.grad, np.full((2, 3), 2.0))
    store = tapir.ParamStore()
    w = np.ones(2, F32)
    store.add("w", w)
    w[:] = 9.0
    np.testing.assert_array_equal(store["w"], [1.0, 1.0])
    got = store["w"]
    got[:] = 5.0
    np.testing.assert_array_equal(store["w"], [1.0, 1.0])


# --------------------------------------------------------------------- protocols


def test_len_and_bool_follow_numpy():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.ones((4, 3), F32))
        assert len(x) == 4 == len(np.ones((4, 3)))
        with pytest.raises(TypeError):
            len(x.sum())  # NumPy: len() of unsized object
        with pytest.raises(ValueError, match="ambiguous"):
            bool(x)
        with pytest.raises(ValueError):
            if x > 0.0:
                pass
        assert bool(s.input(np.array([2.0], F32))) is True
        assert bool(s.input(np.array(0.0, F32))) is False
        assert bool(x.sum()) is True


def test_float_and_item_of_a_scalar():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(np.array([[0.1, 0.2], [0.3, 0.4]]))
        assert float(x.sum()) == pytest.approx(1.0, abs=1e-15)
        assert isinstance(x.sum().item(), float)
        assert float(x[1, 0]) == 0.3
        assert x.reshape(4)[3].item() == 0.4
        assert float(s.input(np.array([[2.5]]))) == 2.5  # one element, any rank: NumPy agrees
        with pytest.raises(TypeError):
            float(x)  # NumPy: only 0-d (one-element) arrays convert to Python scalars


def test_np_asarray_of_a_var():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.arange(6, dtype=F32).reshape(3, 2))
        a = np.asarray(x)
        assert isinstance(a, np.ndarray) and a.dtype == F32 and a.shape == (3, 2)
        np.testing.assert_array_equal(a, np.arange(6).reshape(3, 2))
        b = np.asarray(x, dtype=F64)
        assert b.dtype == F64
        np.testing.assert_array_equal(np.array(x.T), np.arange(6).reshape(3, 2).T)
        a[0, 0] = 10.0
        assert x.numpy()[0, 0] == 0.0
    with pytest.raises(tapir.ScopeError):
        np.asarray(x)


def test_numpy_operators_defer_to_var_and_ufuncs_refuse_it():
    # An ndarray on the left of an operator must not turn the Var into an array (which
    # would drop it from the tape); a ufunc on a Var raises rather than doing the same.
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.full(3, 2.0, F32))
        a = np.array([1.0, 2.0, 3.0], F32)
        for y in (a + x, a - x, a * x, a / x, a**x, np.float32(3.0) * x, a.reshape(1, 3) @ x.reshape(3, 1)):
            assert isinstance(y, tapir.Var), type(y)
        np.testing.assert_array_equal((a - x).numpy(), a - 2.0)
        s.backward((a * x).sum())
        np.testing.assert_array_equal(x.grad, a)
        for ufunc in (np.exp, np.negative, np.add.reduce):
            with pytest.raises(TypeError):
                ufunc(x)


def test_arena_limit():
    g = tapir.Graph(arena_limit=1 << 20)
    assert issubclass(tapir.ArenaLimitError, MemoryError)
    with pytest.raises(tapir.ArenaLimitError) as e:
        with g.scope() as s:
            x = s.leaf(np.ones((256, 256), F32))  # 256 KiB: fits
            (x @ x @ x @ x).sum()  # 4 × 256 KiB more: past 1 MiB
    assert "limit" in str(e.value)
    with g.scope() as s:  # a smaller scope still works
        assert s.leaf(np.ones((16, 16), F32)).sum().item() == 256.0
    with pytest.raises(MemoryError):
        with g.scope() as s:
            s.full((1024, 1024))  # 4 MiB
    g.set_arena_limit(None)
    with g.scope() as s:
        assert s.full((1024, 1024), 1.0).sum().item() == 1024 * 1024


# ------------------------------------------------ never crash: run in a child process


def run_isolated(body, limit_gib=6):
    """Runs `body` (which fills the dict `out`) in a child Python with an address-space
    limit; returns (returncode, out, stderr tail)."""
    code = textwrap.dedent(
        """
        import json, resource, sys
        import numpy as np, tapir
        resource.setrlimit(resource.RLIMIT_AS, ({lim}, {lim}))
        out = {{}}
        def attempt(name, f):
            try:
                r = f()
                out[name] = ["ok", list(r.shape) if hasattr(r, "shape") else r if isinstance(r, list) else repr(r)]
            except BaseException as e:
                out[name] = ["raised", type(e).__name__, [c.__name__ for c in type(e).__mro__], str(e)[:200]]
            print(json.dumps({{name: out[name]}}), flush=True)
        """
    ).format(lim=limit_gib << 30) + textwrap.dedent(body)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    out = {}
    for line in p.stdout.splitlines():
        if line.startswith("{"):
            out.update(json.loads(line))
    return p.returncode, out, p.stderr[:1500]


HUGE = {
    "reshape (2**40, 2**40)": "s.leaf(np.ones((2, 3), np.float32)).reshape(2**40, 2**40)",
    "full (2**31, 2**31)": "s.full((2**31, 2**31))",
    "full (2**20, 2**20)": "s.full((2**20, 2**20))",
    "full (2**63,)": "s.full((2**63,))",
    "broadcast_to (2**31, 2**31)": "s.leaf(np.ones((1, 1), np.float32)).broadcast_to(2**31, 2**31)",
    "broadcast_to (2**20, 2**20)": "s.leaf(np.ones((1, 1), np.float32)).broadcast_to(2**20, 2**20)",
    "unsqueeze of huge": "s.full((2**62, 4)).unsqueeze(0)",
    "matmul to (2**20, 2**20)": "s.leaf(np.ones((2**20, 1), np.float32)) @ s.leaf(np.ones((1, 2**20), np.float32))",
    # A zero-stride NumPy view takes no memory, but its 2**40 elements do once copied in.
    "leaf of a zero-stride view": "s.leaf(np.broadcast_to(np.float32(0), (2**20, 2**20)))",
    "input of a zero-stride view": "s.input(np.broadcast_to(np.float32(0), (2**20, 2**20)))",
    "operand: a zero-stride view": "s.leaf(np.ones((1, 1), np.float32)) + np.broadcast_to(np.float32(0), (2**20, 2**20))",
    "ParamStore.add of a zero-stride view": "tapir.ParamStore().add('w', np.broadcast_to(np.float32(0), (2**20, 2**20)))",
}


@pytest.mark.parametrize("name", list(HUGE))
def test_huge_shapes_raise_a_tapir_error(name):
    body = f"""
g = tapir.Graph()
with g.scope() as s:
    attempt("case", lambda: {HUGE[name]})
with g.scope() as s:
    attempt("after", lambda: s.full((2, 2), 1.0).sum().item())
"""
    rc, out, err = run_isolated(body)
    got = out.get("case")
    assert got is not None, f"{name}: the process died (exit status {rc}); stderr:\n{err[:300]}"
    assert got[0] == "raised" and "TapirError" in got[2], f"{name}: {got}"
    assert issubclass(getattr(tapir, got[1]), (ValueError, MemoryError)), got
    assert rc == 0 and out.get("after") == ["ok", "4.0"], (rc, out, err[:600])


EMPTY = """
g = tapir.Graph()
ops = {
    "leaf": lambda x: x,
    "sum": lambda x: x.sum(),
    "sum axis 0": lambda x: x.sum(axis=0),
    "mean": lambda x: x.mean(),
    "max axis 1": lambda x: x.max(axis=1),
    "max": lambda x: x.max(),
    "logsumexp axis 0": lambda x: x.logsumexp(0),
    "var": lambda x: x.var(),
    "tanh": lambda x: x.tanh(),
    "x @ x.T": lambda x: x @ x.T,
    "x.T @ x": lambda x: x.T @ x,
    "softmax": lambda x: x.softmax(),
    "layer_norm": lambda x: x.layer_norm(np.ones(3, np.float32), np.zeros(3, np.float32)),
    "reshape": lambda x: x.reshape(3, 0),
    "cross_entropy": lambda x: x.cross_entropy(np.zeros(0, np.int64)),
    "index_select []": lambda x: x.index_select(0, []),
    "index_select int64 empty": lambda x: x.index_select(1, np.zeros(0, np.int64)),
    "getitem": lambda x: x[:, 1:],
    "concat": lambda x: x.sum(axis=0).unsqueeze(0) + x,
    "mse_loss": lambda x: x.mse_loss(np.zeros((0, 3), np.float32)),
}
for name, f in ops.items():
    with g.scope() as s:
        x = s.leaf(np.ones((0, 3), np.float32))
        def run():
            y = f(x)
            v = y.numpy()
            s.backward(y.sum())
            gr = x.grad
            return [list(y.shape), list(v.shape), None if gr is None else list(gr.shape)]
        attempt(name, run)
"""


def test_empty_arrays_give_a_result_or_a_clean_error():
    rc, out, err = run_isolated(EMPTY)
    assert rc == 0, f"the process died (exit status {rc}) after {list(out)}; stderr:\n{err}"
    expected = {  # results NumPy gives, where it gives one
        "leaf": [0, 3], "sum": [], "sum axis 0": [3], "mean": [], "max axis 1": [0], "tanh": [0, 3],
        "x @ x.T": [0, 0], "x.T @ x": [3, 3], "softmax": [0, 3], "reshape": [3, 0], "getitem": [0, 2],
    }
    problems = []
    for name, got in out.items():
        if got[0] == "raised":
            if "TapirError" not in got[2] and got[1] not in ("ValueError", "TypeError"):
                problems.append(f"{name}: raised a non-Tapir {got[1]}: {got[3]}")
        elif name in expected and got[1][0] != expected[name]:
            problems.append(f"{name}: shape {got[1][0]}, NumPy gives {expected[name]}")
    for name in expected:
        if out.get(name, ["missing"])[0] != "ok":
            problems.append(f"{name}: NumPy gives a result, tapir {out.get(name)}")
    assert not problems, "\n".join(problems)
