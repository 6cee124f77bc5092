"""ParamStore checkpoints in the safetensors format, checked against the `safetensors`
package itself (its NumPy reader and writer), and the all-or-nothing rule on bad input."""

import numpy as np
import pytest
import safetensors.numpy as stn

import tapir


def make_store(dtype):
    rng = np.random.default_rng(0)
    store = tapir.ParamStore(dtype)
    arrays = {
        "mlp.0.weight": rng.standard_normal((5, 3)).astype(dtype),
        "mlp.0.bias": rng.standard_normal(3).astype(dtype),
        "emb": rng.standard_normal((2, 3, 4)).astype(dtype),
        "scale": np.array([1.5], dtype),
        "ünïcode/name.with:chars": np.array([[-0.0, np.inf], [np.finfo(np.float32).tiny, 1e30]], dtype),
    }
    for name, a in arrays.items():
        store.add(name, a)
    return store, arrays


def snapshot(store):
    return {k: store[k].copy() for k in store.keys()}


def assert_same(store, arrays):
    assert store.keys() == list(arrays)
    for k, a in arrays.items():
        got = store[k]
        assert got.dtype == a.dtype and got.shape == a.shape, k
        np.testing.assert_array_equal(got, a, err_msg=k)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_to_bytes_is_read_by_safetensors(dtype):
    store, arrays = make_store(dtype)
    data = store.to_bytes()
    assert isinstance(data, bytes)
    loaded = stn.load(data)
    assert set(loaded) == set(arrays)
    for k, a in arrays.items():
        assert loaded[k].dtype == np.dtype(dtype), k
        assert loaded[k].shape == a.shape, k
        np.testing.assert_array_equal(loaded[k], a, err_msg=k)  # bit-exact, infinities included
    assert repr(store).startswith("tapir.ParamStore(5 parameters")
    assert store.numel() == sum(a.size for a in arrays.values())


def test_empty_store_round_trips():
    data = tapir.ParamStore().to_bytes()
    assert stn.load(data) == {}
    tapir.ParamStore().load_bytes(data)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_bytes_written_by_safetensors_load(dtype):
    store, arrays = make_store(dtype)
    rng = np.random.default_rng(1)
    new = {k: rng.standard_normal(a.shape).astype(dtype) for k, a in arrays.items()}
    store.load_bytes(stn.save(new))
    assert_same(store, {k: new[k] for k in arrays})  # the store's order is kept
    # And tapir's own bytes load back.
    other, _ = make_store(dtype)
    other.load_bytes(store.to_bytes())
    assert_same(other, {k: new[k] for k in arrays})


def test_the_other_float_dtype_is_converted_on_load():
    # tapir_nn::io: "either can be read into either (F64 into f32 rounds to nearest)".
    store, arrays = make_store("float32")
    src = {k: (a.astype(np.float64) + 1e-9) for k, a in arrays.items()}
    store.load_bytes(stn.save(src))
    for k in arrays:
        np.testing.assert_array_equal(store[k], src[k].astype(np.float32))
    s64, a64 = make_store("float64")
    s64.load_bytes(stn.save({k: a.astype(np.float32) for k, a in a64.items()}))
    for k, a in a64.items():
        np.testing.assert_array_equal(s64[k], a.astype(np.float32).astype(np.float64))


def _corruptions(good, arrays):
    z = {k: np.zeros_like(a) for k, a in arrays.items()}
    wrong_shape = dict(z, **{"mlp.0.bias": np.zeros(4, np.float32)})
    missing = {k: v for k, v in z.items() if k != "emb"}
    extra = dict(z, **{"unexpected": np.zeros(1, np.float32)})
    header_len = int.from_bytes(good[:8], "little")
    return {
        "empty": b"",
        "5 bytes": good[:5],
        "header only": good[: 8 + header_len],
        "truncated by 1": good[:-1],
        "truncated by half": good[: len(good) // 2],
        "zeros": bytes(len(good)),
        "header length past the end": (len(good) * 4).to_bytes(8, "little") + good[8:],
        "not JSON": (20).to_bytes(8, "little") + b"{not json at all!!!}",
        "flipped header byte": good[:12] + bytes([good[12] ^ 0x55]) + good[13:],
        "int32 tensor": stn.save(dict(z, **{"scale": np.zeros(1, np.int32)})),
        "float16 tensor": stn.save(dict(z, **{"scale": np.zeros(1, np.float16)})),
        "a wrong shape": stn.save(wrong_shape),
        "a missing tensor": stn.save(missing),
        "an extra tensor": stn.save(extra),
    }


_store, _arrays = make_store("float32")
CORRUPT_NAMES = list(_corruptions(_store.to_bytes(), _arrays))
del _store, _arrays


@pytest.mark.parametrize("name", CORRUPT_NAMES)
def test_corrupt_buffer_raises_and_leaves_the_store_unchanged(name):
    store, arrays = make_store("float32")
    data = _corruptions(store.to_bytes(), arrays)[name]
    before = snapshot(store)
    with pytest.raises(tapir.TapirIOError) as e:
        store.load_bytes(data)
    assert isinstance(e.value, OSError)
    assert "load" in str(e.value)
    assert_same(store, before)
    # The store still works: a good checkpoint loads afterwards.
    store.load_bytes(stn.save({k: a + 1 for k, a in arrays.items()}))
    assert_same(store, {k: a + 1 for k, a in arrays.items()})


def test_every_truncation_is_refused():
    store, arrays = make_store("float64")
    good = store.to_bytes()
    before = snapshot(store)
    for n in range(0, len(good), 7):
        with pytest.raises(tapir.TapirIOError):
            store.load_bytes(good[:n])
    assert_same(store, before)


def test_a_mismatch_names_the_tensor_and_shapes():
    store, arrays = make_store("float32")
    bad = {k: np.zeros_like(a) for k, a in arrays.items()}
    bad["emb"] = np.zeros((2, 4, 3), np.float32)
    with pytest.raises(tapir.TapirIOError) as e:
        store.load_bytes(stn.save(bad))
    msg = str(e.value)
    assert "emb" in msg and "[2, 4, 3]" in msg and "[2, 3, 4]" in msg, msg


def test_trained_weights_survive_a_round_trip_through_a_file(tmp_path):
    store, arrays = make_store("float32")
    path = tmp_path / "w.safetensors"
    path.write_bytes(store.to_bytes())
    stn.save_file({k: a * 2 for k, a in stn.load_file(str(path)).items()}, str(path))
    store.load_bytes(path.read_bytes())
    assert_same(store, {k: a * 2 for k, a in arrays.items()})
