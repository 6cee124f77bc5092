"""`with s.no_grad():`, `Var.detach()` and `requires_grad`: values against NumPy,
gradients against float64 central differences of the function with the frozen part held
constant, and each misuse once, its message checked by text."""

import re
import sys
import threading

import numpy as np
import pytest

import _reference as ref
import tapir

AT = re.compile(r"test_no_grad\.py:(\d+)")


def lineno():
    return sys._getframe(1).f_lineno


def at_line(err, line):
    """`err`'s message names this file at `line`."""
    found = [int(n) for n in AT.findall(str(err))]
    assert line in found, f"expected test_no_grad.py:{line} in: {err}"


X = np.array([[0.3, -1.2, 0.7], [1.5, -0.4, 0.9]])


def test_no_grad_computes_values_without_gradients():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        with s.no_grad() as ng:
            assert isinstance(ng, tapir.NoGrad)
            e = x.exp()
            inside = s.leaf(X)  # a leaf asked for explicitly still requests its gradient
        np.testing.assert_allclose(e.numpy(), np.exp(X), rtol=1e-15)
        assert x.requires_grad and inside.requires_grad
        assert not e.requires_grad and not (e * 2.0).requires_grad
        assert (e * x).requires_grad and x.exp().requires_grad  # recording is back on
        s.backward((e * x).sum())
        np.testing.assert_allclose(x.grad, np.exp(X), rtol=1e-15)  # e is a constant here
        assert e.grad is None


def test_gradient_through_a_frozen_part_matches_finite_differences():
    # L = Σ r ⊙ (x ⊙ sin(x₀)) + Σ x², where sin(x₀) is recorded under no_grad (or through
    # detach): the finite differences hold it at its value at x₀.
    r = np.random.default_rng(7).standard_normal(X.shape)
    frozen = np.sin(X)
    numeric = ref.central_differences(lambda x: float(np.sum(r * (x * frozen)) + np.sum(x * x)), [X], [0])[0]
    for how in ("no_grad", "detach"):
        g = tapir.Graph(dtype="float64")
        with g.scope() as s:
            x = s.leaf(X)
            if how == "no_grad":
                with s.no_grad():
                    f = x.sin()
            else:
                f = x.sin().detach()
            assert not f.requires_grad
            loss = (s.input(r) * (x * f)).sum() + (x * x).sum()
            s.backward(loss)
            assert ref.close(x.grad, numeric, 1e-6, 1e-6) <= 0, (how, x.grad, numeric)


def test_detach_copies_the_value_and_requires_no_gradient():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        d = x.detach()
        np.testing.assert_array_equal(d.numpy(), X)
        assert x.requires_grad and not d.requires_grad
        assert not (d * d).requires_grad and (d * x).requires_grad
        with s.no_grad():
            assert not x.detach().requires_grad


def test_no_grad_regions_nest_and_an_object_can_be_reused():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        outer = s.no_grad()
        with outer:
            with s.no_grad():
                assert not x.tanh().requires_grad
            assert not x.tanh().requires_grad, "the outer region is still on"
            with outer:  # the same object, nested in itself
                assert not x.tanh().requires_grad
            assert not x.tanh().requires_grad
        assert x.tanh().requires_grad
        with outer:  # and again after it was exited
            assert not x.tanh().requires_grad
        assert x.tanh().requires_grad


def test_an_exception_inside_the_block_ends_the_region_and_propagates():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        with pytest.raises(KeyError, match="boom"):
            with s.no_grad():
                x.exp()
                raise KeyError("boom")
        assert x.exp().requires_grad
        s.backward(x.exp().sum())
        np.testing.assert_allclose(x.grad, np.exp(X), rtol=1e-15)


def test_a_loss_recorded_under_no_grad_has_no_gradient():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        with s.no_grad():
            loss = (x * x).sum()
        line = lineno() + 2
        with pytest.raises(tapir.GradientError) as e:
            s.backward(loss)
        assert "does not depend on any gradient-requesting leaf" in str(e.value)
        assert "outside no_grad" in str(e.value)
        at_line(e.value, line)


def test_grad_under_no_grad_is_a_value_that_requires_none():
    g = tapir.Graph(dtype="float64")
    with g.scope() as s:
        x = s.leaf(X)
        y = (x * x * x).sum()
        with s.no_grad():
            [d] = s.grad(y, [x])
        np.testing.assert_allclose(d.numpy(), 3 * X**2, rtol=1e-14)  # ∂Σx³/∂x = 3x²
        assert not d.requires_grad


def test_closing_the_scope_inside_the_block_raises_at_its_end():
    g = tapir.Graph()
    with g.scope() as s:
        with pytest.raises(tapir.ScopeError) as e:
            with s.no_grad():
                s.close()
                closed = lineno() - 1
        assert "no_grad: its scope ended at" in str(e.value)
        assert "end the block first" in str(e.value)
        at_line(e.value, closed)
    # With an exception already leaving the block, that exception propagates instead.
    with g.scope() as s:
        with pytest.raises(KeyError, match="first"):
            with s.no_grad():
                s.close()
                raise KeyError("first")
    with g.scope() as s:  # the graph is usable, and the new scope records gradients
        assert s.leaf(np.ones(2, np.float32)).exp().requires_grad


def test_a_region_of_an_ended_scope_cannot_be_entered_or_exited():
    g = tapir.Graph()
    with g.scope() as s:
        ng = s.no_grad()
        kept = s.no_grad()
        kept.__enter__()
    ended = lineno() - 4  # the `with` line: its exit is attributed there
    with pytest.raises(tapir.ScopeError) as e:
        with ng:
            pass
    assert "no_grad: entered after its scope ended at" in str(e.value)
    at_line(e.value, ended)
    with g.scope() as s:  # scope 2: exiting scope 1's region must not touch this one's
        x = s.leaf(np.ones(2, np.float32))
        with pytest.raises(tapir.ScopeError) as e:
            kept.__exit__(None, None, None)
        assert "no_grad: its scope ended" in str(e.value)
        assert x.exp().requires_grad
        with s.no_grad():
            with pytest.raises(tapir.ScopeError):
                kept.__exit__(None, None, None)
            assert not x.exp().requires_grad, "scope 2's region is still on"
    with pytest.raises(tapir.ScopeError) as e:
        s.no_grad()
    assert "this scope ended at" in str(e.value)


def test_exit_without_enter_and_another_thread_raise():
    g = tapir.Graph()
    with g.scope() as s:
        ng = s.no_grad()
        with pytest.raises(tapir.ScopeError, match="no_grad: exited without being entered"):
            ng.__exit__(None, None, None)
        box = {}

        def other():
            for what, call in [("enter", ng.__enter__), ("exit", lambda: entered.__exit__(None, None, None))]:
                try:
                    call()
                except BaseException as e:  # a PanicException is a BaseException
                    box[what] = e

        entered = s.no_grad()
        entered.__enter__()

        t = threading.Thread(target=other)
        t.start()
        t.join()
        for what in ("enter", "exit"):
            assert type(box[what]) is tapir.ScopeError and "no_grad: this scope belongs to another thread" in str(
                box[what]
            ), (what, box.get(what))
        x = s.leaf(np.ones(2, np.float32))
        assert not x.exp().requires_grad, "the other thread did not end this thread's region"
        entered.__exit__(None, None, None)
        assert x.exp().requires_grad
