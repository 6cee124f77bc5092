"""The scope rules: each broken once, asserting the exception class and that the message
names the value (its op and shape) and a `file:line` of this file, so that a user can
find both the handle and the place."""

import ast
import gc
import pathlib
import re
import sys
import threading
import traceback

import numpy as np
import pytest

import tapir

THIS = pathlib.Path(__file__).name
AT_THIS_FILE = re.compile(re.escape(THIS) + r":(\d+)")


def lineno():
    """The line of the caller."""
    return sys._getframe(1).f_lineno


def assert_names(err, op, shape, lines=None):
    """`err`'s message names the handle (`op`, `shape`) and a `file:line` of this file (one
    of `lines` if given)."""
    msg = str(err)
    assert op in msg, f"the message does not name the op {op!r}: {msg}"
    shape_text = "[" + ", ".join(str(d) for d in shape) + "]"
    assert shape_text in msg, f"the message does not name the shape {shape_text}: {msg}"
    assert_located(err, lines)


def assert_located(err, lines=None):
    msg = str(err)
    found = [int(n) for n in AT_THIS_FILE.findall(msg)]
    assert found, f"the message names no {THIS}:<line>: {msg}"
    if lines is not None:
        assert set(found) & set(lines), f"the message names {THIS}:{found}, expected one of {sorted(lines)}: {msg}"


def located_or_none(err, lines=None):
    """None if `err` names a file:line of this file (one of `lines`), else its message."""
    try:
        assert_located(err, lines)
    except AssertionError:
        return str(err)
    return None


def assert_all_located(unlocated):
    unlocated = [m for m in unlocated if m is not None]
    assert not unlocated, f"messages naming no {THIS}:<line> of the call:\n" + "\n".join(unlocated)


def test_handle_used_after_its_scope_ended():
    g = tapir.Graph()
    with g.scope() as s:
        y = s.leaf(np.ones((2, 3), np.float32)).tanh()
    ended = lineno() - 2  # where the `with` block is (its exit is attributed there)
    for use in (lambda: y.numpy(), lambda: y + 1.0, lambda: y.sum(), lambda: y.item(), lambda: y.grad):
        with pytest.raises(tapir.ScopeError) as e:
            use()
        assert isinstance(e.value, RuntimeError)
        assert "ended" in str(e.value)
        assert_names(e.value, "tanh", [2, 3], lines=range(ended - 2, ended + 3))
    assert list(y.shape) == [2, 3]  # metadata survives: no graph memory is needed


def test_scope_object_used_after_its_block():
    g = tapir.Graph()
    with g.scope() as s:
        pass
    with pytest.raises(tapir.ScopeError) as e:
        s.leaf(np.ones(2, np.float32))
    assert_located(e.value)
    with pytest.raises(tapir.ScopeError):
        with s:  # a scope object is entered once
            pass
    with pytest.raises(tapir.ScopeError):
        g.scope().leaf(np.ones(2, np.float32))  # never entered


def test_close_ends_the_scope_and_is_idempotent():
    g = tapir.Graph()
    s = g.scope().__enter__()
    x = s.leaf(np.ones(2, np.float32))
    s.close()
    s.close()
    with pytest.raises(tapir.ScopeError) as e:
        x.numpy()
    assert_names(e.value, "leaf", [2])
    with g.scope() as s2:  # the graph is free again
        assert s2.leaf(np.ones(2, np.float32)).sum().item() == 2.0
    s.__exit__(None, None, None)  # closing an old scope does not close the new one's successor
    with g.scope() as s3:
        z = s3.leaf(np.ones(1, np.float32))
        s.close()
        assert z.item() == 1.0


def test_handles_of_two_graphs_do_not_mix():
    g, h = tapir.Graph(), tapir.Graph()
    unlocated = []
    with g.scope() as s, h.scope() as t:
        a = s.leaf(np.ones((2, 3), np.float32))
        b = t.input(np.ones((4, 3), np.float32))
        for line, use in [
            (lineno(), lambda: a + b),
            (lineno(), lambda: b * a),
            (lineno(), lambda: a.maximum(b)),
            (lineno(), lambda: s.concat([a, b])),
            (lineno(), lambda: s.backward(b)),
        ]:
            with pytest.raises(tapir.ScopeError) as e:
                use()
            msg = str(e.value)
            assert "[4, 3]" in msg and "input" in msg, msg  # the foreign handle is named
            unlocated.append(located_or_none(e.value, lines=[line]))
        # Both scopes still work after the refusals.
        assert (a * 2.0).sum().item() == 12.0
        assert b.sum().item() == 12.0
    assert_all_located(unlocated)


def test_handle_of_scope_n_used_in_scope_n_plus_1():
    g = tapir.Graph()
    with g.scope() as s:
        old = s.leaf(np.ones((2, 2), np.float32)).exp()
    ended = lineno() - 2
    unlocated = []
    with g.scope() as s:
        new = s.leaf(np.ones((2, 2), np.float32))
        for line, use in [
            (lineno(), lambda: new + old),
            (lineno(), lambda: old + new),
            (lineno(), lambda: old.numpy()),
            (lineno(), lambda: s.backward(old.sum())),
            (lineno(), lambda: s.stack([new, old])),
        ]:
            with pytest.raises(tapir.ScopeError) as e:
                use()
            msg = str(e.value)
            assert "exp" in msg and "[2, 2]" in msg, msg
            # Where the stale handle's scope ended, or the line of the call.
            unlocated.append(located_or_none(e.value, lines=[line, ended]))
        assert new.sum().item() == 4.0
    assert_all_located(unlocated)


def test_handle_used_from_another_thread_raises_scope_error():
    g = tapir.Graph()
    caught, unlocated = {}, []

    def run(name, f):
        def body():
            try:
                caught[name] = ("ok", f())
            except BaseException as e:  # a PanicException is a BaseException
                caught[name] = ("raised", e)

        t = threading.Thread(target=body)
        t.start()
        t.join()
        return caught[name]

    with g.scope() as s:
        x = s.leaf(np.ones((3, 2), np.float32)).sin()
        for name, f in [
            ("op", lambda: x * 2.0),
            ("value", lambda: x.numpy()),
            ("grad", lambda: x.grad),
            ("leaf", lambda: s.leaf(np.ones(2, np.float32))),
            ("backward", lambda: s.backward(x.sum())),
            ("scope", lambda: g.scope().__enter__()),
            ("stats", lambda: g.stats()),
        ]:
            kind, e = run(name, f)
            assert kind == "raised", f"{name}: from another thread it returned {e!r}"
            assert type(e) is tapir.ScopeError, f"{name}: {type(e).__module__}.{type(e).__name__}: {e}"
            if name in ("op", "value", "grad", "backward"):
                assert "sin" in str(e) and "[3, 2]" in str(e), str(e)
                unlocated.append(located_or_none(e))
        # The owning thread is unaffected.
        assert x.sum().item() == pytest.approx(6 * np.sin(1.0), rel=1e-6)
    assert_all_located(unlocated)


def test_graph_made_in_another_thread_is_refused_here():
    box = {}
    t = threading.Thread(target=lambda: box.setdefault("g", tapir.Graph()))
    t.start()
    t.join()
    with pytest.raises(tapir.ScopeError) as e:
        with box["g"].scope():
            pass
    assert "thread" in str(e.value)


def test_nested_scopes_of_one_graph_raise():
    g = tapir.Graph()
    with g.scope() as s:
        opened = lineno() - 1
        x = s.leaf(np.ones(2, np.float32))
        with pytest.raises(tapir.ScopeError) as e:
            with g.scope():
                pass
        assert_located(e.value, lines=[opened])
        assert "already open" in str(e.value)
        assert x.sum().item() == 2.0  # the outer scope is unharmed
    other = tapir.Graph()
    with g.scope() as s, other.scope() as t:  # scopes of two graphs do nest
        assert (s.leaf(np.ones(1, np.float32)) * 2.0).item() == 2.0
        assert t.input(np.ones(1, np.float32)).item() == 1.0


def test_scope_left_open_by_a_suspended_generator():
    g = tapir.Graph()

    def batches():
        with g.scope() as s:
            yield s.leaf(np.ones(2, np.float32))

    opened = lineno() - 3
    it = batches()
    v = next(it)
    with pytest.raises(tapir.ScopeError) as e:
        with g.scope():
            pass
    assert_located(e.value, lines=[opened])
    assert "generator" in str(e.value)
    it.close()  # GeneratorExit runs the `with` block's exit
    with pytest.raises(tapir.ScopeError):
        v.numpy()
    with g.scope() as s:
        assert s.leaf(np.ones(2, np.float32)).sum().item() == 2.0


def test_exception_inside_with_closes_the_scope():
    g = tapir.Graph()
    with pytest.raises(KeyError, match="boom"):
        with g.scope() as s:
            x = s.leaf(np.ones((2, 2), np.float32)).relu()
            raise KeyError("boom")
    with g.scope() as s:  # the next block opens
        assert s.leaf(np.ones(3, np.float32)).sum().item() == 3.0
        with pytest.raises(tapir.ScopeError) as e:
            x + 1.0
        assert_names(e.value, "relu", [2, 2])
    # A failed op inside the block does not keep the scope open either.
    with pytest.raises(tapir.ShapeError):
        with g.scope() as s:
            s.leaf(np.ones((2, 3), np.float32)) @ s.leaf(np.ones((2, 3), np.float32))
    with g.scope() as s:
        assert s.input(np.ones(1, np.float32)).item() == 1.0


def test_handles_kept_across_10000_iterations():
    g = tapir.Graph()
    kept = []
    data = np.arange(6, dtype=np.float32).reshape(2, 3)
    for i in range(10_000):
        with g.scope() as s:
            x = s.leaf(data)
            loss = (x * float(i)).sum()
            s.backward(loss)
            kept.append(loss)
            if i % 2500 == 0:
                assert loss.item() == 15.0 * i
                assert np.array_equal(x.grad, np.full((2, 3), float(i), np.float32))
    assert len(kept) == 10_000
    unlocated = []
    for k in (0, 1, 5000, 9998, 9999):
        with pytest.raises(tapir.ScopeError) as e:
            kept[k].item()
        assert "sum" in str(e.value) and "[]" in str(e.value), str(e.value)
        unlocated.append(located_or_none(e.value))
    with g.scope() as s:
        with pytest.raises(tapir.ScopeError) as e:
            s.leaf(data) + kept[0]
        assert "sum" in str(e.value) and "[]" in str(e.value), str(e.value)
        unlocated.append(located_or_none(e.value))
    assert_all_located(unlocated)


def test_store_changes_inside_the_scope_raise_and_succeed_after():
    store = tapir.ParamStore()
    store.add("w", np.ones((3, 2), np.float32))
    grads = store.zeros_like()
    opt = tapir.optim.SGD(store, lr=0.5)
    g = tapir.Graph()
    with g.scope() as s:
        opened = lineno() - 1
        w = s.param(store, "w")
        s.backward_into((w * w).sum(), grads)  # d/dw Σ w² = 2w = 2
        for what, change in [
            ("step", lambda: opt.step(store, grads)),
            ("__setitem__", lambda: store.__setitem__("w", np.zeros((3, 2), np.float32))),
            ("add", lambda: store.add("b", np.zeros(2, np.float32))),
            ("load_bytes", lambda: store.load_bytes(store.to_bytes())),
        ]:
            with pytest.raises(tapir.ScopeError) as e:
                change()
            assert what in str(e.value)
            assert_located(e.value, lines=[opened])
        np.testing.assert_array_equal(store["w"], np.ones((3, 2)))  # nothing changed
        assert "b" not in store
    opt.step(store, grads)  # w ← 1 − 0.5·2 = 0
    np.testing.assert_array_equal(store["w"], np.zeros((3, 2)))
    store["w"] = np.full((3, 2), 2.0, np.float32)
    store.add("b", np.zeros(2, np.float32))
    store.load_bytes(store.to_bytes())
    np.testing.assert_array_equal(store["w"], np.full((3, 2), 2.0))
    assert store.keys() == ["w", "b"]
    # A scope that did not read the store does not lock it.
    with g.scope() as s:
        s.input(np.ones(1, np.float32))
        store["w"] = np.ones((3, 2), np.float32)
    # A failed scope releases the store too.
    with pytest.raises(ZeroDivisionError):
        with g.scope() as s:
            s.param(store, "w")
            1 / 0
    store["w"] = np.zeros((3, 2), np.float32)


def test_gradient_buffer_is_the_scopes_until_it_ends():
    # backward_into writes the gradients straight into the buffer, so the scope keeps it
    # until the `with` block ends: every use meanwhile raises ScopeError naming where the
    # scope was opened, and afterwards the buffer holds ∂L/∂w.
    store = tapir.ParamStore("float64")
    store.add("w", np.array([1.0, -2.0, 3.0]))
    grads = store.zeros_like()
    opt = tapir.optim.SGD(store, lr=0.5)
    g = tapir.Graph("float64")
    with g.scope() as s:
        opened = lineno() - 1
        w = s.param(store, "w")
        s.backward_into((w * w).sum(), grads)  # 2w
        np.testing.assert_array_equal(w.grad, [2.0, -4.0, 6.0])  # read through the handle
        for what, use in [
            ("zero", grads.zero),
            ("__getitem__", lambda: grads["w"]),
            ("clip_grad_norm", lambda: tapir.optim.clip_grad_norm(store, grads, 1.0)),
            ("backward_into", lambda: s.backward_into(w.sum(), grads)),
        ]:
            with pytest.raises(tapir.ScopeError) as e:
                use()
            assert what in str(e.value) and "gradient buffer" in str(e.value), str(e.value)
            assert_located(e.value, lines=[opened])
    np.testing.assert_array_equal(grads["w"], [2.0, -4.0, 6.0])
    opt.step(store, grads)  # w ← w − 0.5·2w = 0
    np.testing.assert_array_equal(store["w"], np.zeros(3))
    # A second buffer in a scope whose tape is consumed: the engine's error, and the buffer
    # is not taken.
    other = store.zeros_like()
    with g.scope() as s:
        w = s.param(store, "w")
        s.backward_into(w.sum(), grads)  # += 1
        with pytest.raises(tapir.GradientError):
            s.backward_into(w.sum(), other)
        np.testing.assert_array_equal(other["w"], np.zeros(3))
    np.testing.assert_array_equal(grads["w"], [3.0, -3.0, 7.0])


def test_gradient_buffer_comes_back_after_an_exception_or_a_failed_pass():
    store = tapir.ParamStore("float64")
    store.add("w", np.array([1.0, 2.0]))
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    with pytest.raises(ZeroDivisionError):
        with g.scope() as s:
            s.backward_into((s.param(store, "w") * 3.0).sum(), grads)
            1 / 0
    np.testing.assert_array_equal(grads["w"], [3.0, 3.0])
    # A buffer of another store is refused by the pass and comes back unchanged.
    theirs = tapir.ParamStore("float64")
    theirs.add("v", np.ones(2))
    wrong = theirs.zeros_like()
    with g.scope() as s:
        with pytest.raises(tapir.TapirError):
            s.backward_into(s.param(store, "w").sum(), wrong)
    np.testing.assert_array_equal(wrong["v"], [0.0, 0.0])
    # A non-scalar loss, or a loss of another scope, is refused before the buffer is taken.
    with g.scope() as s:
        w = s.param(store, "w")
        with pytest.raises(tapir.TapirError):
            s.backward_into(w, grads)
        s.backward_into(w.sum(), grads)
    np.testing.assert_array_equal(grads["w"], [4.0, 4.0])


def test_gradient_buffer_comes_back_when_a_suspended_scope_dies_with_its_graph():
    store = tapir.ParamStore("float64")
    store.add("w", np.array([2.0]))
    grads = store.zeros_like()

    def steps():
        g = tapir.Graph("float64")
        with g.scope() as s:
            s.backward_into((s.param(store, "w") ** 2).sum(), grads)
            yield

    it = steps()
    next(it)
    with pytest.raises(tapir.ScopeError):
        grads.zero()
    del it  # the generator is closed and its graph freed
    gc.collect()
    np.testing.assert_array_equal(grads["w"], [4.0])
    store["w"] = np.array([0.0])  # and the store is free


def test_second_derivative_of_cube():
    # y = x³: dy/dx = 3x², d²y/dx² = 6x, d³y/dx³ = 6.
    g = tapir.Graph(dtype="float64")
    xs = np.array([-1.5, 0.5, 2.0])
    with g.scope() as s:
        x = s.leaf(xs)
        y = (x**3).sum()
        (dx,) = s.grad(y, [x])
        np.testing.assert_allclose(dx.numpy(), 3 * xs**2, rtol=1e-14)
        (ddx,) = s.grad(dx.sum(), [x])
        np.testing.assert_allclose(ddx.numpy(), 6 * xs, rtol=1e-14)
        (dddx,) = s.grad(ddx.sum(), [x])
        np.testing.assert_allclose(dddx.numpy(), np.full(3, 6.0), rtol=1e-14)
        # The tape is not consumed by grad: backward still runs, on the gradient itself.
        s.backward((dx * dx).sum())  # Σ 9x⁴ → 36x³
        np.testing.assert_allclose(x.grad, 36 * xs**3, rtol=1e-14)


def test_grad_of_two_inputs_and_create_graph_flag():
    # f = Σ sin(x)·y: ∂f/∂x = cos(x)·y, ∂f/∂y = sin(x); ∂²f/∂x∂y summed = Σ cos(x).
    g = tapir.Graph(dtype="float64")
    xv, yv = np.array([0.3, -1.2]), np.array([2.0, 0.5])
    with g.scope() as s:
        x, y = s.leaf(xv), s.leaf(yv)
        f = (x.sin() * y).sum()
        dx, dy = s.grad(f, [x, y], create_graph=True)
        np.testing.assert_allclose(dx.numpy(), np.cos(xv) * yv, rtol=1e-14)
        np.testing.assert_allclose(dy.numpy(), np.sin(xv), rtol=1e-14)
        (dxy,) = s.grad(dx.sum(), [y])
        np.testing.assert_allclose(dxy.numpy(), np.cos(xv), rtol=1e-14)
        with pytest.raises(tapir.GradientError):
            s.grad(x * y, [x])  # not a scalar


def test_second_backward_raises_gradient_error():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.ones(2, np.float32))
        y = (x * x).sum()
        s.backward(y)
        line = lineno() + 2
        with pytest.raises(tapir.GradientError) as e:
            s.backward(y)
        assert isinstance(e.value, RuntimeError)
        assert "consumed" in str(e.value)
        assert_located(e.value, lines=[line])
        np.testing.assert_array_equal(x.grad, [2.0, 2.0])  # the first gradients stay


def test_op_errors_raise_at_the_ops_line():
    g = tapir.Graph()
    cases = [
        ("matmul", tapir.ShapeError, lambda s: s.leaf(np.ones((4, 3), np.float32)) @ s.leaf(np.ones((4, 3), np.float32))),
        ("add", tapir.ShapeError, lambda s: s.leaf(np.ones((2, 3), np.float32)) + s.input(np.ones((4,), np.float32))),
        ("sum", tapir.ShapeError, lambda s: s.leaf(np.ones((2, 3), np.float32)).sum(axis=2)),
        ("reshape", tapir.ShapeError, lambda s: s.leaf(np.ones((2, 3), np.float32)).reshape(4, 2)),
        ("clamp", tapir.ArgumentError, lambda s: s.leaf(np.ones(3, np.float32)).clamp(1.0, -1.0)),
        ("cross_entropy", tapir.TapirIndexError, lambda s: s.leaf(np.ones((2, 3), np.float32)).cross_entropy([0, 3])),
        ("index_select", tapir.TapirIndexError, lambda s: s.leaf(np.ones((2, 3), np.float32)).index_select(0, [2])),
        ("backward", tapir.GradientError, lambda s: s.backward(s.leaf(np.ones((2, 3), np.float32)))),
    ]
    for op, cls, f in cases:
        with g.scope() as s:
            line = lineno() + 2
            with pytest.raises(cls) as e:
                f(s)
        assert op in str(e.value), str(e.value)
        # The innermost frame of this file in the traceback is the op's line (the lambda's).
        frames = [fr for fr in traceback.extract_tb(e.value.__traceback__) if fr.filename == __file__]
        assert frames, "no frame of this file in the traceback"
        op_line = frames[-1].lineno
        assert op_line in [c[2].__code__.co_firstlineno for c in cases if c[0] == op]
        assert_located(e.value, lines=[op_line, line])


def test_a_failed_op_fails_the_rest_of_the_scope_with_its_first_error():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.ones((2, 3), np.float32))
        with pytest.raises(tapir.ShapeError):
            x @ x
        with pytest.raises(tapir.TapirError) as e:
            x + 1.0
        assert "matmul" in str(e.value)
    with g.scope() as s:  # the next scope is clean
        assert (s.leaf(np.ones(2, np.float32)) + 1.0).sum().item() == 4.0


def _builtin_bases():
    """(class name, [base names]) of each class in python/tapir/_errors.py, read from the source."""
    src = pathlib.Path(tapir._errors.__file__).read_text()
    return [
        (node.name, [b.id for b in node.bases if isinstance(b, ast.Name)])
        for node in ast.parse(src).body
        if isinstance(node, ast.ClassDef)
    ]


def test_every_exception_derives_from_its_builtin():
    import builtins

    classes = _builtin_bases()
    names = [n for n, _ in classes]
    assert len(classes) >= 14 and "TapirError" in names
    for name, bases in classes:
        cls = getattr(tapir, name)
        assert cls is getattr(tapir._errors, name)
        for base in bases:
            parent = getattr(builtins, base, None) or getattr(tapir, base)
            assert issubclass(cls, parent), f"{name} does not derive from {base}"
        assert issubclass(cls, tapir.TapirError)
        # Each can be raised and caught as its built-in.
        builtin = [getattr(builtins, b) for b in bases if hasattr(builtins, b)]
        for b in builtin:
            with pytest.raises(b):
                raise cls("x")
    expected = {
        "ScopeError": RuntimeError, "DTypeError": TypeError, "ShapeError": ValueError,
        "TapirIndexError": IndexError, "GradientError": RuntimeError, "UnsupportedError": NotImplementedError,
        "ArenaLimitError": MemoryError, "TapirMemoryError": MemoryError, "ParamError": KeyError,
        "NonFiniteError": FloatingPointError, "ArgumentError": ValueError, "CallbackError": RuntimeError,
        "TapirIOError": OSError,
    }
    for name, b in expected.items():
        assert issubclass(getattr(tapir, name), b), name
    assert str(tapir.ParamError("no parameter named 'w'")) == "no parameter named 'w'"  # not KeyError's quoting


def test_stats():
    g = tapir.Graph()
    with g.scope() as s:
        x = s.leaf(np.ones((64, 64), np.float32))
        y = (x @ x).sum()
        st = s.stats()
        assert st["nodes"] >= 3
        assert st["arena_in_use"] >= 2 * 64 * 64 * 4
        assert st["arena_high_water"] >= st["arena_in_use"]
        with pytest.raises(tapir.ScopeError):
            g.stats()  # graph settings only between scopes
        with pytest.raises(tapir.ScopeError):
            g.set_arena_limit(None)
        s.backward(y)
    gs = g.stats()
    assert gs["nodes"] == st["nodes"] and gs["arena_capacity"] >= gs["arena_high_water"] >= 2 * 64 * 64 * 4


def test_no_cycles_for_the_collector():
    # A handle holds numbers only, so a loop of scopes leaves nothing for the collector.
    g = tapir.Graph()
    gc.collect()
    kept = []
    for _ in range(100):
        with g.scope() as s:
            y = (s.leaf(np.ones(4, np.float32)) * 2.0).tanh()
            s.backward(y.sum())
            kept.append(y)
    assert gc.collect() == 0


def test_a_scope_keeps_its_graph_alive():
    # The scope object holds its graph, so a graph with no other reference is not
    # dropped under the open scope.
    with tapir.Graph(dtype="float64").scope() as s:
        x = s.leaf(np.array([1.0, 2.0]))
        s.backward((x * x).sum())
        assert x.grad.tolist() == [2.0, 4.0]
    with pytest.raises(tapir.ScopeError, match="used after its scope ended"):
        x.numpy()
