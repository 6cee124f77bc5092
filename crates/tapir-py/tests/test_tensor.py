"""`tapir.Tensor` (an owned array, copied once) and pickling of `Tensor` and `ParamStore`:
values against NumPy, exact round trips, and the errors by text."""

import copy
import pickle

import numpy as np
import pytest

import tapir

DTYPES = ["float32", "float64"]


def values(dtype, *shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
def test_tensor_copies_an_array_once_and_keeps_its_dtype(dtype):
    a = values(dtype, 2, 3)
    t = tapir.Tensor(a)
    a[0, 0] = 99.0  # the tensor holds its own copy
    assert t.shape == (2, 3) and t.ndim == 2 and t.dtype == dtype and len(t) == 2
    out = t.numpy()
    assert out.dtype == np.dtype(dtype) and out.flags.owndata or out.base is not None
    assert out[0, 0] != 99.0
    np.testing.assert_array_equal(out[1], a[1])
    out[1, 1] = 7.0  # and NumPy gets a copy of it
    assert t.numpy()[1, 1] != 7.0
    np.testing.assert_array_equal(np.asarray(t), t.numpy())
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    with pytest.raises(ValueError, match="cannot be viewed without a copy"):
        np.asarray(t, copy=False)


def test_tensor_dtype_rules():
    assert tapir.Tensor([1.0, 2.0]).dtype == "float64"  # NumPy's default float
    assert tapir.Tensor([1, 2]).dtype == "float64"
    assert tapir.Tensor(np.arange(3, dtype=np.int32)).dtype == "float64"
    assert tapir.Tensor([1.5, 2.5], dtype="float32").dtype == "float32"
    assert tapir.Tensor(np.float32(2.5)).shape == ()
    half = np.array([1.0, 2.0], np.float16)
    with pytest.raises(tapir.DTypeError) as e:
        tapir.Tensor(half)
    assert str(e.value) == 'Tensor: a float16 array; pass dtype="float32" or dtype="float64" to convert it'
    np.testing.assert_array_equal(tapir.Tensor(half, dtype=np.float32).numpy(), [1.0, 2.0])
    for bad, name in [([True, False], "bool"), (np.array([1j]), "complex128"), (np.array([None]), "object")]:
        with pytest.raises(tapir.DTypeError) as e:
            tapir.Tensor(bad, dtype="float32")
        assert str(e.value) == f"Tensor: {name} values are not real numbers"
    with pytest.raises(tapir.DTypeError) as e:
        tapir.Tensor([1.0], dtype="int8")
    assert str(e.value) == "Tensor: holds float32 or float64 values, not int8"
    # Converting a Tensor: float64 → float32 rounds as NumPy's astype does.
    t = tapir.Tensor(np.array([0.1, 1e-40, 3.0]))
    t32 = tapir.Tensor(t, dtype="float32")
    assert t32.dtype == "float32"
    np.testing.assert_array_equal(t32.numpy(), np.array([0.1, 1e-40, 3.0]).astype(np.float32))
    np.testing.assert_array_equal(tapir.Tensor(t32).numpy(), t32.numpy())


def test_tensor_layouts_and_shapes():
    a = np.arange(24.0).reshape(2, 3, 4)
    for view in (a.transpose(2, 0, 1), a[:, ::-1, ::2], np.asfortranarray(a)):
        np.testing.assert_array_equal(tapir.Tensor(view).numpy(), view)
    empty = tapir.Tensor(np.zeros((0, 3)))
    assert empty.shape == (0, 3) and empty.numpy().shape == (0, 3)
    s = tapir.Tensor(3.0)
    assert s.shape == () and s.ndim == 0 and s.item() == 3.0
    with pytest.raises(TypeError, match="len\\(\\) of a 0-d Tensor"):
        len(s)
    with pytest.raises(tapir.GradientError) as e:
        tapir.Tensor([1.0, 2.0]).item()
    assert "item: needs a tensor with exactly one element, got shape [2]" in str(e.value)
    with pytest.raises(tapir.ShapeError) as e:
        tapir.Tensor(np.zeros((1,) * 9))
    assert "[1, 1, 1, 1, 1, 1, 1, 1, 1]" in str(e.value) or "rank" in str(e.value)


def test_tensor_repr():
    assert repr(tapir.Tensor(np.array([[1.0, 2.0], [3.0, 4.5]], np.float32))) == (
        "tapir.Tensor([[1. , 2. ],\n              [3. , 4.5]], dtype=float32)"
    )
    assert repr(tapir.Tensor(2.0)) == "tapir.Tensor(2., dtype=float64)"


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_tensor_is_accepted_wherever_an_array_is(dtype):
    a, b = values(dtype, 3, 4, seed=1), values(dtype, 4, seed=2)
    ta, tb = tapir.Tensor(a), tapir.Tensor(b)
    store = tapir.ParamStore(dtype=dtype)
    store.add("w", tb)
    store["w"] = tapir.Tensor(b * 2)
    np.testing.assert_array_equal(store["w"], b * 2)
    g = tapir.Graph(dtype=dtype)
    with g.scope() as s:
        x = s.leaf(ta)
        c = s.input(tb)
        y = ((x * tb + c) @ tapir.Tensor(b.reshape(4, 1))).sum() + (tb * x).sum() + s.param(store, "w").sum()
        s.backward(y)
        np.testing.assert_allclose(
            y.item(),
            ((a * b + b) @ b.reshape(4, 1)).sum() + (b * a).sum() + (2 * b).sum(),
            rtol=1e-5 if dtype == "float32" else 1e-12,
        )
        # ∂/∂xᵢⱼ of Σᵢⱼ (xᵢⱼbⱼ + bⱼ)bⱼ + Σᵢⱼ bⱼxᵢⱼ is bⱼ² + bⱼ.
        np.testing.assert_allclose(x.grad, np.broadcast_to(b * b + b, a.shape), rtol=1e-5)


def test_a_tensor_of_the_other_dtype_is_refused():
    g = tapir.Graph()  # float32
    t = tapir.Tensor(np.ones(2))  # float64
    with g.scope() as s:
        with pytest.raises(tapir.DTypeError) as e:
            s.leaf(t)
        assert str(e.value) == (
            "leaf: a float64 Tensor given to a float32 graph (one dtype per graph); "
            'convert with tapir.Tensor(t, dtype="float32")'
        )
        x = s.leaf(np.ones(2, np.float32))
        with pytest.raises(tapir.DTypeError, match="add: a float64 Tensor given to a float32 graph"):
            x + t
    with pytest.raises(tapir.DTypeError, match="ParamStore.add: a float64 Tensor"):
        tapir.ParamStore().add("w", t)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_tensor_pickles_exactly(dtype, protocol):
    special = np.array([0.0, -0.0, np.inf, -np.inf, 1e-38, np.finfo(dtype).max], dtype)
    for a in (values(dtype, 3, 1, 2), special, np.array(1.5, dtype), np.zeros((0, 2), dtype)):
        t = pickle.loads(pickle.dumps(tapir.Tensor(a), protocol=protocol))
        assert type(t) is tapir.Tensor and t.dtype == dtype and t.shape == a.shape
        assert t.numpy().tobytes() == a.tobytes()  # bit for bit, -0.0 included
    nan = pickle.loads(pickle.dumps(tapir.Tensor(np.array([np.nan], dtype))))
    assert np.isnan(nan.numpy()[0])
    assert copy.deepcopy(tapir.Tensor(special)).numpy().tobytes() == special.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_param_store_pickles_with_names_order_shapes_and_exact_values(dtype):
    store = tapir.ParamStore(dtype=dtype)
    names = ["z.weight", "a.bias", "__metadata__", "m"]  # not sorted, and one name safetensors refuses
    arrays = [values(dtype, 3, 2, seed=3), values(dtype, 2, seed=4), values(dtype, seed=5), np.zeros((0, 4), dtype)]
    for n, a in zip(names, arrays):
        store.add(n, a)
    back = pickle.loads(pickle.dumps(store))
    assert type(back) is tapir.ParamStore and back.dtype == dtype
    assert back.keys() == names and len(back) == 4 and back.numel() == store.numel()
    for n, a in zip(names, arrays):
        assert back[n].dtype == np.dtype(dtype) and back[n].shape == a.shape
        assert back[n].tobytes() == a.tobytes()
    assert pickle.loads(pickle.dumps(tapir.ParamStore(dtype=dtype))).keys() == []
    # The copy is independent, and works with gradients and optimizers of its own.
    back["__metadata__"] = np.ones((), dtype)
    assert store["__metadata__"] != back["__metadata__"]
    grads = back.zeros_like()
    g = tapir.Graph(dtype=dtype)
    with g.scope() as s:
        s.backward_into((s.param(back, "z.weight") ** 2).sum(), grads)
    np.testing.assert_allclose(grads["z.weight"], 2 * arrays[0], rtol=1e-6)


def test_a_lent_store_pickles_but_cannot_be_unpickled_into():
    store = tapir.ParamStore()
    store.add("w", np.arange(3, dtype=np.float32))
    g = tapir.Graph()
    with g.scope() as s:
        w = s.param(store, "w")
        data = pickle.dumps(store)  # reading is fine
        state = store.__reduce__()[2]
        with pytest.raises(tapir.ScopeError) as e:
            store.__setstate__(state)
        assert "ParamStore.__setstate__: the parameters are borrowed by the scope opened at" in str(e.value)
        assert "test_tensor.py" in str(e.value)
        assert w.sum().item() == 3.0
    np.testing.assert_array_equal(pickle.loads(data)["w"], [0.0, 1.0, 2.0])
    store.__setstate__([("v", np.ones(2, np.float32))])  # after the block it is free again
    assert store.keys() == ["v"]


def test_unpickling_a_bad_state_leaves_the_store_unchanged():
    store = tapir.ParamStore()
    store.add("w", np.ones(2, np.float32))
    with pytest.raises(tapir.DTypeError, match="ParamStore.add: a float64 array given to a float32 graph"):
        store.__setstate__([("a", np.ones(2, np.float32)), ("b", np.ones(2))])
    with pytest.raises(tapir.TapirError, match="a"):
        store.__setstate__([("a", np.ones(2, np.float32)), ("a", np.ones(2, np.float32))])
    assert store.keys() == ["w"]
