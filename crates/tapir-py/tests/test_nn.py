"""`tapir.nn`'s layers and `tapir.optim`'s schedules.

Every layer is checked in float64 against a NumPy reference written here or in
`_reference.py`: the forward value, and the gradients of `L = Σ out ⊙ r` (a random `r`)
with respect to the input and every parameter against central finite differences of the
reference. Parameters are set to random values first, so that a LayerNorm's ones and a
bias's zeros hide nothing. Bad sizes at construction and bad shapes at the call are
checked by their messages. The schedules are compared with closed forms written here.
"""

import math
import zlib

import numpy as np
import pytest

import tapir
import _reference as ref

F64_RTOL, F64_ATOL = 1e-10, 1e-12
GRAD_RTOL, GRAD_ATOL = 1e-6, 1e-6


def rng(*key):
    return np.random.default_rng(zlib.crc32(repr(key).encode()))


def normal(*shape, key=0):
    return rng("normal", shape, key).standard_normal(shape)


def randomize(store, key, scale=0.5):
    """Every parameter of `store` set to `N(0, scale²)` values of its shape."""
    for i, name in enumerate(store.keys()):
        store[name] = scale * normal(*store[name].shape, key=(key, i))


def check_layer(store, call, reference, x, *, key, x_is_leaf=True):
    """Records `call(s, x)` in a float64 scope; checks its value against
    `reference(x, params)` (params: name -> array) and the gradients of `Σ out ⊙ r` for the
    input (if `x_is_leaf`) and every parameter against central finite differences of
    `reference`. Returns the value."""
    names = store.keys()
    params = {n: store[n] for n in names}
    expected = np.asarray(reference(x, params), np.float64)
    r = rng("weights", key).standard_normal(expected.shape)
    g = tapir.Graph("float64")
    grads = store.zeros_like()
    with g.scope() as s:
        xv = s.leaf(x) if x_is_leaf else x
        y = call(s, xv)
        value = y.numpy()
        s.backward_into((y * s.input(r)).sum(), grads)
        dx = xv.grad if x_is_leaf else None
    assert value.shape == expected.shape, f"{key}: shape {value.shape}, NumPy {expected.shape}"
    np.testing.assert_allclose(value, expected, rtol=F64_RTOL, atol=F64_ATOL, err_msg=f"{key}: forward")

    arrays = ([x] if x_is_leaf else []) + [params[n] for n in names]

    def loss(*arrays):
        xa, ps = (arrays[0], arrays[1:]) if x_is_leaf else (x, arrays)
        return float(np.sum(np.asarray(reference(xa, dict(zip(names, ps)))) * r))

    numeric = ref.central_differences(loss, arrays, range(len(arrays)))
    analytic = ([dx] if x_is_leaf else []) + [grads[n] for n in names]
    labels = (["input"] if x_is_leaf else []) + names
    for label, a, n in zip(labels, analytic, numeric):
        assert a is not None, f"{key}: no gradient reached {label}"
        worst = ref.close(a, n, GRAD_ATOL, GRAD_RTOL)
        assert worst <= 0, f"{key}: gradient of {label} off by {worst:.3g}\nanalytic:\n{a}\nnumeric:\n{n}"
    return value


def raises(cls, call, *fragments):
    """`call()` raises `cls` (a tapir error and a ValueError unless said otherwise) whose
    message holds every fragment."""
    with pytest.raises(cls) as e:
        call()
    msg = str(e.value)
    for f in fragments:
        assert f in msg, f"{f!r} not in the message {msg!r}"
    return msg


def in_scope(fn, dtype="float64"):
    g = tapir.Graph(dtype)
    with g.scope() as s:
        return fn(s)


# ---------------------------------------------------------------------- Linear, MLP


def test_linear_gradients_and_normal_init():
    store = tapir.ParamStore("float64")
    lin = tapir.nn.Linear(store, "fc", 4, 3, rng=np.random.default_rng(0))
    randomize(store, "linear")
    check_layer(store, lin, lambda x, p: x @ p["fc.weight"] + p["fc.bias"], normal(2, 5, 4), key="linear")

    # Given `std`: the weight from N(0, std²), the bias zero (GPT-2's).
    big = tapir.ParamStore("float64")
    lin = tapir.nn.Linear(big, "g", 200, 100, rng=np.random.default_rng(1), std=0.05)
    w = big["g.weight"]
    assert w.shape == (200, 100) and abs(w.mean()) < 0.002 and abs(w.std() - 0.05) < 0.002
    np.testing.assert_array_equal(big["g.bias"], np.zeros(100))
    assert lin.param_names() == ["g.weight", "g.bias"]


def test_linear_and_mlp_reject_bad_sizes_and_inputs():
    store = tapir.ParamStore("float64")
    raises(tapir.ArgumentError, lambda: tapir.nn.Linear(store, "fc", 0, 3), "Linear('fc')", "fan_in 0", "fan_out 3",
           "positive")
    raises(tapir.ArgumentError, lambda: tapir.nn.Linear(store, "fc", 4, -2), "Linear('fc')", "fan_out -2")
    raises(tapir.ArgumentError, lambda: tapir.nn.MLP(store, [4, 0, 2], name="net"), "MLP('net')", "[4, 0, 2]")
    raises(tapir.ArgumentError, lambda: tapir.nn.MLP(store, [4]), "MLP('mlp')", "sizes [4]")
    raises(tapir.ArgumentError, lambda: tapir.nn.MLP(store, [4, 2], activation="nope"), "'nope'")
    assert len(store) == 0
    tapir.nn.Linear(store, "fc", 4, 3)
    # A clash is found before anything is added.
    raises(tapir.ArgumentError, lambda: tapir.nn.Linear(store, "fc", 2, 2), "Linear('fc')", "'fc.weight'", "'fc.bias'")
    assert store.keys() == ["fc.weight", "fc.bias"]
    lin = tapir.nn.Linear(store, "fc2", 4, 3)
    # An input whose last axis is not fan_in: the engine's error names the op and the shapes.
    e = raises(tapir.ArgumentError, lambda: in_scope(lambda s: lin(s, s.input(np.ones((2, 5))))),
               "linear: x [2, 5], w [4, 3], b [3]")
    assert "test_nn.py" in e  # the caller's line


# ------------------------------------------------------------------------ Embedding


def test_embedding_lookup_of_any_index_shape_and_scattered_gradients():
    store = tapir.ParamStore("float64")
    emb = tapir.nn.Embedding(store, "emb", 5, 3, rng=np.random.default_rng(0))
    assert store.keys() == ["emb.weight"] and store["emb.weight"].shape == (5, 3)
    idx = np.array([[4, 1, 4], [0, 4, 2]])  # 4 three times: its gradient is the sum of three rows
    check_layer(store, emb, lambda i, p: p["emb.weight"][i], idx, key="embedding", x_is_leaf=False)
    table = store["emb.weight"]

    def shapes(s):
        return [emb(s, [3]).shape, emb(s, np.int32(2)).shape, emb(s, []).shape, emb(s, [[1], [2]]).numpy()]

    one, scalar, empty, column = in_scope(shapes)
    assert one == (1, 3) and scalar == (3,) and empty == (0, 3)
    np.testing.assert_array_equal(column, table[[[1], [2]]])


def test_embedding_init_and_errors():
    store = tapir.ParamStore("float64")
    tapir.nn.Embedding(store, "big", 300, 50, rng=np.random.default_rng(0))  # N(0, 1), as PyTorch
    w = store["big.weight"]
    assert abs(w.mean()) < 0.01 and abs(w.std() - 1.0) < 0.01
    raises(tapir.ArgumentError, lambda: tapir.nn.Embedding(store, "e", 0, 4), "Embedding('e')", "num_embeddings 0",
           "embedding_dim 4")
    emb = tapir.nn.Embedding(store, "e", 5, 2)
    raises(tapir.TapirIndexError, lambda: in_scope(lambda s: emb(s, [1, 5])),
           "index_select: index 5 is out of range for dimension of size 5")
    raises(tapir.DTypeError, lambda: in_scope(lambda s: emb(s, [1.5])), "index_select")


# ------------------------------------------------------------------------ LayerNorm


def test_layer_norm_values_gradients_and_init():
    store = tapir.ParamStore("float64")
    ln = tapir.nn.LayerNorm(store, "ln", 6)
    np.testing.assert_array_equal(store["ln.weight"], np.ones(6))  # as torch.nn.LayerNorm
    np.testing.assert_array_equal(store["ln.bias"], np.zeros(6))
    randomize(store, "ln", scale=1.0)
    check_layer(store, ln, lambda x, p: ref.layer_norm(x, p["ln.weight"], p["ln.bias"]), normal(2, 3, 6), key="ln")
    eps = tapir.nn.LayerNorm(store, "ln_eps", 4, eps=0.3)
    check_layer(store, eps, lambda x, p: ref.layer_norm(x, p["ln_eps.weight"], p["ln_eps.bias"], 0.3),
                0.1 * normal(3, 4), key="ln_eps")


def test_layer_norm_errors():
    store = tapir.ParamStore("float64")
    raises(tapir.ArgumentError, lambda: tapir.nn.LayerNorm(store, "ln", 0), "LayerNorm('ln')", "dim 0")
    raises(tapir.ArgumentError, lambda: tapir.nn.LayerNorm(store, "ln", 3, eps=-1.0), "LayerNorm('ln')", "eps -1.0")
    ln = tapir.nn.LayerNorm(store, "ln", 4)
    raises(tapir.ArgumentError, lambda: in_scope(lambda s: ln(s, s.input(np.ones((2, 3))))),
           "layer_norm: x [2, 3], w [4], b [4]")


# -------------------------------------------------------------------------- Dropout


X_DROP = normal(4, 50, key="drop")


def test_dropout_eval_and_p0_are_the_identity_and_draw_nothing():
    gen = np.random.default_rng(5)
    state = gen.bit_generator.state
    for d in (tapir.nn.Dropout(0.4, rng=gen).eval(), tapir.nn.Dropout(0.0, rng=gen)):
        def fn(s, d=d):
            x = s.leaf(X_DROP)
            y = d(s, x)
            assert y is x
            return y.numpy()

        np.testing.assert_array_equal(in_scope(fn), X_DROP)
    assert gen.bit_generator.state == state


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dropout_mask_is_the_generators_and_scaled_exactly(dtype):
    p = 0.3
    x = X_DROP.astype(dtype)
    d = tapir.nn.Dropout(p, rng=np.random.default_rng(7))
    assert d.training
    keep = np.random.default_rng(7).random(x.shape) >= p
    mask = keep.astype(dtype) * np.asarray(1.0 / (1.0 - p), dtype)
    r = normal(*x.shape, key="dr").astype(dtype)

    def fn(s):
        xv = s.leaf(x)
        y = d(s, xv)
        s.backward((y * s.input(r)).sum())
        return y.numpy(), xv.grad

    y, dx = in_scope(fn, dtype)
    assert y.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(y, x * mask)
    np.testing.assert_array_equal(dx, r * mask)  # d(x ⊙ m)/dx = m
    assert 0.2 < 1.0 - keep.mean() < 0.4
    # The generator advanced: the next call draws another mask; a generator given to the
    # call is used instead of the layer's.
    second = in_scope(lambda s: d(s, s.input(x)).numpy(), dtype)
    assert not np.array_equal(second, y)
    other = in_scope(lambda s: d(s, s.input(x), rng=np.random.default_rng(7)).numpy(), dtype)
    np.testing.assert_array_equal(other, y)


def test_dropout_p1_gives_zeros_and_bad_p_is_refused():
    d = tapir.nn.Dropout(1.0)

    def fn(s):
        x = s.leaf(X_DROP)
        y = d(s, x)
        s.backward(y.sum())
        return y.numpy(), x.grad

    y, dx = in_scope(fn)
    np.testing.assert_array_equal(y, np.zeros_like(X_DROP))
    np.testing.assert_array_equal(dx, np.zeros_like(X_DROP))
    for bad in (-0.1, 1.5, float("nan"), "0.5"):
        raises(tapir.ArgumentError, lambda bad=bad: tapir.nn.Dropout(bad), "Dropout", f"p {bad!r}", "[0, 1]")


# ------------------------------------------------------------------ Conv2d, pooling


@pytest.mark.parametrize("stride, padding", [(1, 0), ((2, 1), (1, 0)), (2, 1)])
def test_conv2d_values_and_gradients(stride, padding):
    store = tapir.ParamStore("float64")
    conv = tapir.nn.Conv2d(store, "conv", 3, 4, (3, 2), stride=stride, padding=padding, rng=np.random.default_rng(0))
    assert store.keys() == ["conv.weight", "conv.bias"]
    assert store["conv.weight"].shape == (4, 3, 3, 2) and store["conv.bias"].shape == (4,)
    st = stride if isinstance(stride, tuple) else (stride, stride)
    pd = padding if isinstance(padding, tuple) else (padding, padding)

    def reference(x, p):
        return ref.conv2d(x, p["conv.weight"], st, pd) + p["conv.bias"][:, None, None]

    check_layer(store, conv, reference, normal(2, 3, 5, 6), key=("conv", stride, padding))


def test_conv2d_init_no_bias_and_errors():
    store = tapir.ParamStore("float64")
    tapir.nn.Conv2d(store, "c", 8, 16, 3, rng=np.random.default_rng(0))
    bound = 1.0 / math.sqrt(8 * 3 * 3)  # torch.nn.Conv2d: U(±1/√fan_in) for both
    for name in ("c.weight", "c.bias"):
        v = np.abs(store[name])
        assert v.max() <= bound and v.max() > 0.8 * bound, name
    nb = tapir.nn.Conv2d(store, "nb", 2, 3, 2, bias=False)
    assert "nb.bias" not in store and nb.param_names() == ["nb.weight"]
    check_layer(store, nb, lambda x, p: ref.conv2d(x, p["nb.weight"]), normal(1, 2, 3, 4), key="conv_nobias")

    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 0, 4, 3), "Conv2d('k')", "in_channels 0",
           "out_channels 4")
    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 2, 4, (3, 0)), "Conv2d('k')",
           "kernel_size (3, 0)")
    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 2, 4, 3, stride=0), "Conv2d('k')", "stride 0")
    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 2, 4, 3, padding=-1), "Conv2d('k')",
           "padding -1", "non-negative")
    conv = tapir.nn.Conv2d(store, "k", 2, 4, 3)
    raises(tapir.ShapeError, lambda: in_scope(lambda s: conv(s, s.input(np.ones((2, 5, 5))))),
           "conv2d: needs input [N, C, H, W]", "[4, 2, 3, 3]", "input shape [2, 5, 5]")
    raises(tapir.ShapeError, lambda: in_scope(lambda s: conv(s, s.input(np.ones((1, 3, 5, 5))))),
           "conv2d", "with equal C", "input shape [1, 3, 5, 5]")


@pytest.mark.parametrize("groups, dilation, stride, padding", [(1, 2, 1, 0), (2, 2, (2, 1), (1, 2)), (4, (2, 1), 1, 1),
                                                              (2, (1, 2), 2, (2, 0))])
def test_conv2d_groups_and_dilation_values_and_gradients(groups, dilation, stride, padding):
    store = tapir.ParamStore("float64")
    conv = tapir.nn.Conv2d(store, "conv", 4, 8, (3, 2), stride=stride, padding=padding, dilation=dilation,
                           groups=groups, rng=np.random.default_rng(1))
    assert store["conv.weight"].shape == (8, 4 // groups, 3, 2) and store["conv.bias"].shape == (8,)
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    st, pd, dl = pair(stride), pair(padding), pair(dilation)
    assert (conv.stride, conv.padding, conv.dilation, conv.groups) == (st, pd, dl, groups)

    def reference(x, p):
        return ref.conv2d(x, p["conv.weight"], st, pd, dl, groups) + p["conv.bias"][:, None, None]

    check_layer(store, conv, reference, normal(2, 4, 7, 6), key=("conv_groups", groups, dilation, stride, padding))


def test_conv2d_groups_init_and_errors():
    store = tapir.ParamStore("float64")
    tapir.nn.Conv2d(store, "g", 8, 16, 3, groups=2, rng=np.random.default_rng(0))
    assert store["g.weight"].shape == (16, 4, 3, 3)
    bound = 1.0 / math.sqrt(4 * 3 * 3)  # torch.nn.Conv2d: fan_in = (in/groups)·kh·kw
    for name in ("g.weight", "g.bias"):
        v = np.abs(store[name])
        assert v.max() <= bound and v.max() > 0.8 * bound, name
    dw = tapir.nn.Conv2d(store, "dw", 3, 6, 3, padding=2, dilation=2, groups=3, bias=False)
    assert store["dw.weight"].shape == (6, 1, 3, 3) and dw.param_names() == ["dw.weight"]
    check_layer(store, dw, lambda x, p: ref.conv2d(x, p["dw.weight"], (1, 1), (2, 2), (2, 2), 3),
                normal(1, 3, 5, 4), key="conv_depthwise")

    for groups in (0, 3, -2, 2.0, True):
        raises(tapir.ArgumentError, lambda groups=groups: tapir.nn.Conv2d(store, "k", 4, 6, 3, groups=groups),
               "Conv2d('k')", f"groups {groups!r}", "in_channels 4", "out_channels 6")
    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 4, 6, 3, groups=4), "groups 4",
           "in_channels 4 and out_channels 6")
    raises(tapir.ArgumentError, lambda: tapir.nn.Conv2d(store, "k", 2, 4, 3, dilation=(1, 0)), "Conv2d('k')",
           "dilation (1, 0)", "positive")
    assert "k.weight" not in store  # nothing added by a failed constructor
    big = tapir.nn.Conv2d(store, "k", 2, 4, 3, dilation=3)
    raises(tapir.ShapeError, lambda: in_scope(lambda s: big(s, s.input(np.ones((1, 2, 6, 6))))),
           "conv2d: kernel [3, 3] dilated by [3, 3] does not fit", "input shape [1, 2, 6, 6]")


def test_conv2d_and_max_pool2d_option_errors_name_the_op_and_shapes():
    x, w = np.ones((1, 4, 5, 5)), np.ones((6, 2, 3, 3))
    msg = raises(tapir.ShapeError, lambda: in_scope(lambda s: s.input(x).conv2d(w, groups=3)),
                 "conv2d: needs input [N, C, H, W] and weights [O, C/groups, kh, kw]", "groups = 3",
                 "weights [6, 2, 3, 3]", "input shape [1, 4, 5, 5]")
    assert "conv2d_with" not in msg and "test_nn.py" in msg  # the Python name, at the caller's line
    raises(tapir.ShapeError, lambda: in_scope(lambda s: s.input(x).conv2d(w)), "conv2d:", "with equal C",
           "weights [6, 2, 3, 3]", "input shape [1, 4, 5, 5]")
    raises(tapir.ArgumentError, lambda: in_scope(lambda s: s.input(x).conv2d(w, groups=0)),
           "conv2d: groups must be positive, got 0", "input shape [1, 4, 5, 5], weights [6, 2, 3, 3]")
    raises(tapir.ArgumentError, lambda: in_scope(lambda s: s.input(x).conv2d(w, dilation=(0, 1), groups=2)),
           "conv2d: kernel [3, 3], stride [1, 1] and dilation [0, 1] must be positive", "input shape [1, 4, 5, 5]")
    raises(tapir.ShapeError, lambda: in_scope(lambda s: s.input(x).conv2d(w, dilation=(3, 1), groups=2)),
           "conv2d: kernel [3, 3] dilated by [3, 1] does not fit", "input shape [1, 4, 5, 5]")
    msg = raises(tapir.ArgumentError, lambda: in_scope(lambda s: s.input(x).max_pool2d((2, 2), dilation=(0, 0))),
                 "max_pool2d: kernel [2, 2], stride [2, 2] and dilation [0, 0] must be positive",
                 "input shape [1, 4, 5, 5]")
    assert "max_pool2d_dilated" not in msg
    raises(tapir.ArgumentError, lambda: in_scope(lambda s: s.input(x).max_pool2d((2, 2), padding=(2, 0))),
           "max_pool2d: padding [2, 0] must be at most half the kernel [2, 2]")
    raises(tapir.ShapeError, lambda: in_scope(lambda s: s.input(x[0]).max_pool2d((2, 2), dilation=(2, 2))),
           "max_pool2d: needs a 4-D input [N, C, H, W] (input shape [4, 5, 5])")


POOL_X = (np.random.default_rng(11).permutation(120) * 0.1 - 6.0).reshape(2, 2, 5, 6)  # no ties


@pytest.mark.parametrize("cls, reference", [(tapir.nn.MaxPool2d, ref.max_pool2d), (tapir.nn.AvgPool2d, ref.avg_pool2d)])
@pytest.mark.parametrize("kernel, stride, padding", [(2, None, 0), ((2, 3), (1, 2), 0), (3, 2, 1)])
def test_pooling_values_and_gradients(cls, reference, kernel, stride, padding):
    pool = cls(kernel, stride, padding)
    k = kernel if isinstance(kernel, tuple) else (kernel, kernel)
    st = k if stride is None else stride if isinstance(stride, tuple) else (stride, stride)
    pd = (padding, padding)
    assert (pool.kernel_size, pool.stride, pool.padding) == (k, st, pd) and pool.param_names() == []
    check_layer(tapir.ParamStore("float64"), pool, lambda x, p: reference(x, k, st, pd), POOL_X,
                key=(cls.__name__, kernel, stride, padding))


@pytest.mark.parametrize("cls", [tapir.nn.MaxPool2d, tapir.nn.AvgPool2d])
def test_pooling_errors(cls):
    n = cls.__name__
    raises(tapir.ArgumentError, lambda: cls(0), n, "kernel_size 0")
    raises(tapir.ArgumentError, lambda: cls(2, stride=(1, 0)), n, "stride (1, 0)")
    raises(tapir.ArgumentError, lambda: cls(2, padding=2), n, "padding (2, 2)", "half the kernel_size (2, 2)")
    op = "max_pool2d" if cls is tapir.nn.MaxPool2d else "avg_pool2d"
    raises(tapir.ShapeError, lambda: in_scope(lambda s: cls(2)(s, s.input(np.ones((3, 4, 4))))),
           f"{op}: needs a 4-D input [N, C, H, W] (input shape [3, 4, 4])")


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(2, None, 0, 2), ((3, 2), (1, 2), 1, (2, 1)),
                                                              ((2, 3), 1, (1, 0), (1, 2))])
def test_max_pool2d_dilation_values_and_gradients(kernel, stride, padding, dilation):
    pool = tapir.nn.MaxPool2d(kernel, stride, padding, dilation)
    pair = lambda v: v if isinstance(v, tuple) else (v, v)  # noqa: E731
    k, pd, dl = pair(kernel), pair(padding), pair(dilation)
    st = k if stride is None else pair(stride)
    assert (pool.kernel_size, pool.stride, pool.padding, pool.dilation) == (k, st, pd, dl)
    check_layer(tapir.ParamStore("float64"), pool, lambda x, p: ref.max_pool2d(x, k, st, pd, dl), POOL_X,
                key=("max_pool2d_dilation", kernel, stride, padding, dilation))
    assert tapir.nn.MaxPool2d(2).dilation == (1, 1)
    raises(tapir.ArgumentError, lambda: tapir.nn.MaxPool2d(2, dilation=0), "MaxPool2d", "dilation 0", "positive")
    raises(tapir.ArgumentError, lambda: tapir.nn.MaxPool2d(2, dilation=(2, 1, 1)), "MaxPool2d", "dilation (2, 1, 1)")


def test_flatten_and_a_small_cnn_in_float32():
    f = tapir.nn.Flatten()
    check_layer(tapir.ParamStore("float64"), f, lambda x, p: x.reshape(2, -1), normal(2, 3, 4, 5), key="flatten")
    assert in_scope(lambda s: tapir.nn.Flatten(2)(s, s.input(np.ones((2, 3, 4, 5)))).shape) == (2, 3, 20)
    raises(tapir.ArgumentError, lambda: tapir.nn.Flatten(-1), "Flatten: start_dim -1")
    raises(tapir.ShapeError, lambda: in_scope(lambda s: f(s, s.input(np.ones(3)))), "Flatten", "shape [3]")

    # conv → relu → max pool → flatten → linear, in float32 against the float64 reference.
    store = tapir.ParamStore("float32")
    r = np.random.default_rng(0)
    conv = tapir.nn.Conv2d(store, "conv", 1, 4, 3, padding=1, rng=r)
    pool, flat = tapir.nn.MaxPool2d(2), tapir.nn.Flatten()
    fc = tapir.nn.Linear(store, "fc", 4 * 4 * 4, 10, r)
    x = normal(3, 1, 8, 8).astype(np.float32)
    logits = in_scope(lambda s: fc(s, flat(s, pool(s, conv(s, s.input(x)).relu()))).numpy(), "float32")
    p = {n: store[n].astype(np.float64) for n in store.keys()}
    h = np.maximum(ref.conv2d(x.astype(np.float64), p["conv.weight"], (1, 1), (1, 1))
                   + p["conv.bias"][:, None, None], 0.0)
    expected = ref.max_pool2d(h, (2, 2)).reshape(3, -1) @ p["fc.weight"] + p["fc.bias"]
    assert logits.dtype == np.float32
    np.testing.assert_allclose(logits, expected, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------- transformers


def attention_ref(x, p, prefix, heads):
    qkv = x @ p[f"{prefix}.c_attn.weight"] + p[f"{prefix}.c_attn.bias"]
    a = ref.attend(ref.attention_weights(qkv, heads, causal=True), qkv)
    return a @ p[f"{prefix}.c_proj.weight"] + p[f"{prefix}.c_proj.bias"]


def block_ref(x, p, prefix, heads):
    h = ref.layer_norm(x, p[f"{prefix}.ln_1.weight"], p[f"{prefix}.ln_1.bias"])
    x = x + attention_ref(h, p, f"{prefix}.attn", heads)
    h = ref.layer_norm(x, p[f"{prefix}.ln_2.weight"], p[f"{prefix}.ln_2.bias"])
    h = ref.gelu_tanh(h @ p[f"{prefix}.mlp.c_fc.weight"] + p[f"{prefix}.mlp.c_fc.bias"])
    return x + h @ p[f"{prefix}.mlp.c_proj.weight"] + p[f"{prefix}.mlp.c_proj.bias"]


def gpt_ref(tokens, p, layers, heads, name="gpt"):
    """Logits [B, T, V]: embeddings, blocks, final LayerNorm, the tied head."""
    wte = p[f"{name}.wte.weight"]
    x = wte[tokens] + p[f"{name}.wpe.weight"][: tokens.shape[1]]
    for i in range(layers):
        x = block_ref(x, p, f"{name}.h.{i}", heads)
    return ref.layer_norm(x, p[f"{name}.ln_f.weight"], p[f"{name}.ln_f.bias"]) @ wte.T


def test_causal_self_attention_values_gradients_and_causality():
    store = tapir.ParamStore("float64")
    attn = tapir.nn.CausalSelfAttention(store, "attn", 8, 2, rng=np.random.default_rng(0))
    assert store.keys() == ["attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight", "attn.c_proj.bias"]
    assert store["attn.c_attn.weight"].shape == (8, 24) and store["attn.c_proj.weight"].shape == (8, 8)
    randomize(store, "attn")
    x = normal(2, 4, 8, key="attn")
    y = check_layer(store, attn, lambda x, p: attention_ref(x, p, "attn", 2), x, key="attn")
    # Position i sees positions j ≤ i only: changing the last one changes only its output.
    x2 = x.copy()
    x2[:, -1] += 1.0
    y2 = in_scope(lambda s: attn(s, s.input(x2)).numpy())
    np.testing.assert_array_equal(y2[:, :-1], y[:, :-1])
    assert not np.allclose(y2[:, -1], y[:, -1])


def test_attention_and_block_errors():
    store = tapir.ParamStore("float64")
    for cls in (tapir.nn.CausalSelfAttention, tapir.nn.TransformerBlock):
        n = cls.__name__
        raises(tapir.ArgumentError, lambda cls=cls: cls(store, "a", 6, 4), f"{n}('a')", "dim 6", "multiple of heads 4")
        raises(tapir.ArgumentError, lambda cls=cls: cls(store, "a", 0, 2), f"{n}('a')", "dim 0", "heads 2")
        raises(tapir.ArgumentError, lambda cls=cls: cls(store, "a", 8, -1), f"{n}('a')", "heads -1")
    raises(tapir.ArgumentError, lambda: tapir.nn.TransformerBlock(store, "b", 4, 2, activation="nope"),
           "TransformerBlock('b')", "'nope'")
    assert len(store) == 0
    attn = tapir.nn.CausalSelfAttention(store, "attn", 8, 2)
    # [T, C] without the batch axis: the engine's attention_weights names the shape.
    raises(tapir.ArgumentError, lambda: in_scope(lambda s: attn(s, s.input(np.ones((4, 8))))),
           "attention_weights: qkv [4, 24], heads 2: needs qkv [B, T, 3C]")


def test_transformer_block_values_and_gradients():
    store = tapir.ParamStore("float64")
    block = tapir.nn.TransformerBlock(store, "blk", 4, 2, rng=np.random.default_rng(0))
    assert store.keys() == [
        "blk.ln_1.weight", "blk.ln_1.bias",
        "blk.attn.c_attn.weight", "blk.attn.c_attn.bias", "blk.attn.c_proj.weight", "blk.attn.c_proj.bias",
        "blk.ln_2.weight", "blk.ln_2.bias",
        "blk.mlp.c_fc.weight", "blk.mlp.c_fc.bias", "blk.mlp.c_proj.weight", "blk.mlp.c_proj.bias",
    ]
    assert block.param_names() == store.keys()
    assert store["blk.mlp.c_fc.weight"].shape == (4, 16) and store["blk.mlp.c_proj.weight"].shape == (16, 4)
    randomize(store, "blk")
    check_layer(store, block, lambda x, p: block_ref(x, p, "blk", 2), normal(2, 3, 4, key="blk"), key="blk")


def small_gpt(dtype="float64", dropout=0.0, seed=0, **kw):
    store = tapir.ParamStore(dtype)
    cfg = {"vocab": 5, "context": 4, "width": 4, "heads": 2, "layers": 2} | kw
    model = tapir.nn.GPT(store, **cfg, rng=np.random.default_rng(seed), dropout=dropout)
    return store, model


def test_gpt_names_shapes_and_init():
    store, gpt = small_gpt(vocab=7, context=6, width=8, layers=1)
    shapes = {n: store[n].shape for n in store.keys()}
    assert shapes == {
        "gpt.wte.weight": (7, 8), "gpt.wpe.weight": (6, 8),
        "gpt.h.0.ln_1.weight": (8,), "gpt.h.0.ln_1.bias": (8,),
        "gpt.h.0.attn.c_attn.weight": (8, 24), "gpt.h.0.attn.c_attn.bias": (24,),
        "gpt.h.0.attn.c_proj.weight": (8, 8), "gpt.h.0.attn.c_proj.bias": (8,),
        "gpt.h.0.ln_2.weight": (8,), "gpt.h.0.ln_2.bias": (8,),
        "gpt.h.0.mlp.c_fc.weight": (8, 32), "gpt.h.0.mlp.c_fc.bias": (32,),
        "gpt.h.0.mlp.c_proj.weight": (32, 8), "gpt.h.0.mlp.c_proj.bias": (8,),
        "gpt.ln_f.weight": (8,), "gpt.ln_f.bias": (8,),
    }
    assert gpt.param_names() == store.keys()
    # GPT-2's initialisation, on a larger model so that the spreads are measurable.
    store, _ = small_gpt(vocab=300, context=64, width=64, heads=4, layers=2)
    for name, std in [("gpt.wte.weight", 0.02), ("gpt.wpe.weight", 0.01), ("gpt.h.1.mlp.c_fc.weight", 0.02),
                      ("gpt.h.0.attn.c_proj.weight", 0.01), ("gpt.h.1.mlp.c_proj.weight", 0.01)]:
        assert abs(store[name].std() - std) < 0.05 * std, name  # 0.02/√(2·layers) = 0.01
    for name in ("gpt.h.0.attn.c_attn.bias", "gpt.h.1.mlp.c_proj.bias", "gpt.ln_f.bias"):
        np.testing.assert_array_equal(store[name], 0.0)
    np.testing.assert_array_equal(store["gpt.h.0.ln_1.weight"], 1.0)


def test_gpt_values_and_gradients():
    store, gpt = small_gpt()
    randomize(store, "gpt")
    tokens = np.array([[0, 3, 4, 3], [2, 1, 0, 4]])
    check_layer(store, gpt, lambda t, p: gpt_ref(t, p, 2, 2), tokens, key="gpt", x_is_leaf=False)
    targets = np.array([[3, 4, 3, 1], [1, 0, 4, 4]])
    p = {n: store[n] for n in store.keys()}
    expected = ref.cross_entropy(gpt_ref(tokens, p, 2, 2).reshape(8, 5), targets.reshape(-1))
    loss = in_scope(lambda s: gpt.loss(s, tokens, targets).item())
    assert loss == pytest.approx(expected, rel=1e-12)
    # Shorter sequences use the first positions.
    short = in_scope(lambda s: gpt(s, tokens[:, :2]).numpy())
    np.testing.assert_allclose(short, gpt_ref(tokens[:, :2], p, 2, 2), rtol=F64_RTOL, atol=F64_ATOL)


def test_gpt_starts_at_ln_vocab_and_adamw_steps_reduce_the_loss():
    vocab = 64
    store, gpt = small_gpt("float32", vocab=vocab, context=16, width=32, heads=4, layers=2)
    data = np.random.default_rng(3).integers(0, vocab, (4, 17))
    x, y = data[:, :-1], data[:, 1:]
    opt = tapir.optim.AdamW(store, lr=1e-2)
    grads = store.zeros_like()
    g = tapir.Graph("float32")
    losses = []
    for _ in range(8):
        grads.zero()
        with g.scope() as s:
            loss = gpt.loss(s, x, y)
            s.backward_into(loss, grads)
            losses.append(loss.item())
        opt.step(store, grads)
    assert abs(losses[0] - math.log(vocab)) < 0.05, losses[0]  # uniform guesses at first
    assert losses[-1] < losses[0] - 0.5, losses
    assert all(b < a for a, b in zip(losses, losses[1:])), losses


def test_gpt_errors():
    store = tapir.ParamStore("float64")
    raises(tapir.ArgumentError, lambda: tapir.nn.GPT(store, 5, 4, 6, 4, 1), "GPT('gpt')", "width 6",
           "multiple of heads 4")
    raises(tapir.ArgumentError, lambda: tapir.nn.GPT(store, 5, 4, 8, 2, 0, name="m"), "GPT('m')", "layers 0")
    raises(tapir.ArgumentError, lambda: tapir.nn.GPT(store, 0, 4, 8, 2, 1), "GPT('gpt')", "vocab 0")
    assert len(store) == 0
    _, gpt = small_gpt()
    raises(tapir.ShapeError, lambda: in_scope(lambda s: gpt(s, np.array([1, 2, 3]))), "GPT('gpt')",
           "tokens of shape [3]", "[batch, time]")
    raises(tapir.ShapeError, lambda: in_scope(lambda s: gpt(s, np.zeros((1, 5), np.int64))), "GPT('gpt')",
           "[1, 5]", "5 positions", "context 4")
    raises(tapir.TapirIndexError, lambda: in_scope(lambda s: gpt(s, np.array([[1, 5]]))),
           "index_select: index 5 is out of range for dimension of size 5")


def test_gpt_dropout_follows_train_and_eval():
    tokens = np.array([[0, 3, 4, 3], [2, 1, 0, 4]])
    _, plain = small_gpt(seed=1)
    _, dropped = small_gpt(seed=1, dropout=0.5)  # dropout draws nothing at construction
    blocks = [m for m in dropped.children() if isinstance(m, tapir.nn.TransformerBlock)]
    assert len(blocks) == 2 and dropped.h == blocks
    reference = in_scope(lambda s: plain(s, tokens).numpy())
    train_out = in_scope(lambda s: dropped(s, tokens).numpy())
    assert not np.allclose(train_out, reference)
    assert dropped.eval() is dropped and not dropped.training
    assert not dropped.h[1].attn.attn_dropout.training and not dropped.drop.training
    np.testing.assert_array_equal(in_scope(lambda s: dropped(s, tokens).numpy()), reference)
    dropped.train()
    assert all(m.training for m in (dropped, dropped.h[0].dropout, dropped.h[1].attn.resid_dropout))


# ------------------------------------------------------------------------ schedules


def sgd(lr=0.5):
    store = tapir.ParamStore("float64")
    store.add("w", np.array([0.0]))
    return store, tapir.optim.SGD(store, lr)


def rates(sched, n):
    """The optimizer's rate at steps 0..n-1."""
    out = [sched.optimizer.lr]
    for _ in range(n - 1):
        assert sched.step() == sched.optimizer.lr
        out.append(sched.optimizer.lr)
    return out


def test_step_lr_and_lambda_lr_match_closed_forms():
    _, opt = sgd(0.5)
    sched = tapir.optim.StepLR(opt, step_size=3, gamma=0.5)
    assert sched.base_lr == 0.5
    assert rates(sched, 10) == pytest.approx([0.5, 0.5, 0.5, 0.25, 0.25, 0.25, 0.125, 0.125, 0.125, 0.0625], rel=1e-15)
    assert sched.last_step == 9
    _, opt = sgd(0.2)
    sched = tapir.optim.LambdaLR(opt, lambda t: 0.9**t)
    assert rates(sched, 6) == pytest.approx([0.2 * 0.9**t for t in range(6)], rel=1e-15)
    assert sched.lr_at(20) == pytest.approx(0.2 * 0.9**20, rel=1e-15)


def test_linear_lr_matches_closed_form():
    _, opt = sgd(0.3)
    sched = tapir.optim.LinearLR(opt)  # torch's defaults: 1/3 → 1 over 5 steps
    assert rates(sched, 8) == pytest.approx([0.3 * (1 / 3 + (2 / 3) * min(t, 5) / 5) for t in range(8)], rel=1e-14)
    _, opt = sgd(1.0)
    warm = tapir.optim.LinearLR(opt, start_factor=0.25, end_factor=0.5, total_iters=2)
    assert rates(warm, 4) == pytest.approx([0.25, 0.375, 0.5, 0.5], rel=1e-15)


def test_cosine_annealing_matches_closed_form():
    base, eta_min, t_max = 0.4, 0.01, 10
    _, opt = sgd(base)
    sched = tapir.optim.CosineAnnealingLR(opt, T_max=t_max, eta_min=eta_min)
    expected = [eta_min + (base - eta_min) * (1 + math.cos(math.pi * t / t_max)) / 2 for t in range(t_max + 1)]
    got = rates(sched, t_max + 4)
    assert got[: t_max + 1] == pytest.approx(expected, rel=1e-14)
    assert got[5] == pytest.approx((base + eta_min) / 2, rel=1e-14) and got[t_max:] == pytest.approx([eta_min] * 4)
    # Warm-up: (t + 1)/warmup of the base, then the half cosine over the remaining steps.
    _, opt = sgd(1.0)
    sched = tapir.optim.CosineAnnealingLR(opt, T_max=14, warmup=4)
    got = rates(sched, 16)
    assert got[:4] == pytest.approx([0.25, 0.5, 0.75, 1.0], rel=1e-15)
    assert got[4:15] == pytest.approx([(1 + math.cos(math.pi * k / 10)) / 2 for k in range(11)], rel=1e-14,
                                      abs=1e-16)
    assert got[15] == 0.0


def test_a_schedule_drives_the_optimizer():
    # L = w, so each SGD step subtracts the step's rate.
    store, opt = sgd(1.0)
    sched = tapir.optim.StepLR(opt, 2, gamma=0.1)
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    for _ in range(5):
        grads.zero()
        with g.scope() as s:
            s.backward_into(s.param(store, "w").sum(), grads)
        opt.step(store, grads)
        sched.step()
    assert store["w"][0] == pytest.approx(-(1.0 + 1.0 + 0.1 + 0.1 + 0.01), rel=1e-14)


def test_schedule_arguments_are_checked():
    _, opt = sgd()
    raises(tapir.ArgumentError, lambda: tapir.optim.StepLR(opt, 0), "StepLR: step_size 0", "positive")
    raises(tapir.ArgumentError, lambda: tapir.optim.StepLR(opt, 2, gamma=float("nan")), "StepLR: gamma nan")
    raises(tapir.ArgumentError, lambda: tapir.optim.LinearLR(opt, start_factor=0.0), "LinearLR: start_factor 0.0",
           "(0.0, 1.0]")
    raises(tapir.ArgumentError, lambda: tapir.optim.LinearLR(opt, total_iters=0), "LinearLR: total_iters 0")
    raises(tapir.ArgumentError, lambda: tapir.optim.CosineAnnealingLR(opt, 0), "CosineAnnealingLR: T_max 0")
    raises(tapir.ArgumentError, lambda: tapir.optim.CosineAnnealingLR(opt, 5, warmup=5),
           "CosineAnnealingLR: warmup 5 must be less than T_max 5")
    raises(tapir.ArgumentError, lambda: tapir.optim.CosineAnnealingLR(opt, 5, eta_min=-1.0), "eta_min -1.0")
    raises(tapir.ArgumentError, lambda: tapir.optim.LambdaLR(opt, 0.5), "LambdaLR: lr_lambda 0.5")
    raises(NotImplementedError, lambda: tapir.optim.LRScheduler(opt), "LRScheduler does not define lr_at")
    assert opt.lr == 0.5  # a refused schedule leaves the rate alone
