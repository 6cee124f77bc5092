"""Training: the digits example reaches 97% test accuracy; the optimizers, gradient
clipping, `backward_into` and `tapir.nn` against closed forms written here."""

import importlib
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import tapir

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def train_digits():
    return importlib.import_module("train_digits")


# ------------------------------------------------------------------------- digits


@pytest.fixture(scope="module")
def trained():
    return train_digits().train(epochs=40, seed=0, log=lambda *_: None)


def test_digits_data_is_the_shipped_file():
    td = train_digits()
    (x_train, y_train), (x_test, y_test) = td.load_digits()
    assert td.DATA.exists() and td.DATA.name == "digits.csv.gz"
    assert x_train.shape == (1438, 64) and x_test.shape == (359, 64)
    assert x_train.dtype == np.float32 and y_train.dtype == np.int64
    assert 0.0 <= x_train.min() and x_train.max() <= 1.0
    assert set(np.unique(y_train)) == set(range(10)) == set(np.unique(y_test))
    assert y_test[0] == 4 and y_train[:4].tolist() == [0, 1, 2, 3]  # image 4 is a test image


def test_mlp_reaches_97_percent_on_digits(trained):
    acc = trained["test_accuracy"][-1]
    print(f"\ndigits MLP: test accuracy {100 * acc:.2f}%, train {100 * trained['train_accuracy']:.2f}%")
    print("loss curve:", " ".join(f"{v:.3g}" for v in trained["losses"]))
    assert acc >= 0.97, f"test accuracy {100 * acc:.2f}% < 97%"
    losses = trained["losses"]
    assert losses[-1] < 0.1 * losses[0]
    assert all(np.isfinite(losses))


def test_trained_model_survives_a_checkpoint(trained):
    td = train_digits()
    store, mlp, g = trained["store"], trained["mlp"], trained["graph"]
    (x_train, _), (x_test, y_test) = td.load_digits()
    _, x_test = td.standardize(x_train, x_test)
    before = td.accuracy(g, mlp, x_test, y_test)
    fresh = tapir.ParamStore()
    mlp2 = tapir.nn.MLP(fresh, [64, 256, 128, 10], rng=np.random.default_rng(123))
    assert td.accuracy(g, mlp2, x_test, y_test) < 0.5  # untrained
    fresh.load_bytes(store.to_bytes())
    assert td.accuracy(g, mlp2, x_test, y_test) == before


def test_example_runs_as_a_script(tmp_path):
    p = subprocess.run(
        [sys.executable, str(EXAMPLES / "train_digits.py"), "--epochs", "2", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert p.returncode == 0, p.stderr
    assert "loss curve:" in p.stdout and "test accuracy" in p.stdout


@pytest.mark.plot
def test_example_saves_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    td = train_digits()
    path = tmp_path / "curve.png"
    assert td.plot([1.0, 0.5, 0.2], [0.5, 0.8, 0.9], path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# ----------------------------------------------------------- tapir.nn and params


def test_linear_layer_matches_numpy():
    store = tapir.ParamStore("float64")
    lin = tapir.nn.Linear(store, "fc", 4, 3, rng=np.random.default_rng(0))
    assert store.keys() == ["fc.weight", "fc.bias"]
    w, b = store["fc.weight"], store["fc.bias"]
    assert w.shape == (4, 3) and b.shape == (3,)
    assert np.all(np.abs(w) <= 0.5) and np.all(np.abs(b) <= 0.5)  # uniform in ±1/√fan_in
    x = np.random.default_rng(1).standard_normal((5, 4))
    r = np.random.default_rng(2).standard_normal((5, 3))
    g = tapir.Graph("float64")
    grads = store.zeros_like()
    with g.scope() as s:
        y = lin(s, s.input(x))
        np.testing.assert_allclose(y.numpy(), x @ w + b, rtol=1e-13)
        # L = Σ r ⊙ (x w + b): dL/dw = xᵀ r, dL/db = Σ_rows r.
        s.backward_into((y * s.input(r)).sum(), grads)
    np.testing.assert_allclose(grads["fc.weight"], x.T @ r, rtol=1e-12)
    np.testing.assert_allclose(grads["fc.bias"], r.sum(axis=0), rtol=1e-12)
    nobias = tapir.nn.Linear(store, "nb", 4, 2, rng=np.random.default_rng(0), bias=False)
    assert "nb.bias" not in store
    with g.scope() as s:
        np.testing.assert_allclose(nobias(s, s.input(x)).numpy(), x @ store["nb.weight"], rtol=1e-13)


def test_mlp_structure_and_activation():
    store = tapir.ParamStore("float64")
    mlp = tapir.nn.MLP(store, [3, 5, 2], rng=np.random.default_rng(0), activation="tanh", name="net")
    assert store.keys() == ["net.0.weight", "net.0.bias", "net.1.weight", "net.1.bias"]
    x = np.random.default_rng(1).standard_normal((4, 3))
    expected = np.tanh(x @ store["net.0.weight"] + store["net.0.bias"]) @ store["net.1.weight"] + store["net.1.bias"]
    g = tapir.Graph("float64")
    with g.scope() as s:
        np.testing.assert_allclose(mlp(s, s.input(x)).numpy(), expected, rtol=1e-13)


def test_param_store_basics():
    store = tapir.ParamStore()
    assert len(store) == 0 and store.dtype == "float32"
    store.add("w", np.ones((2, 3), np.float32))
    store.add("b", [1.0, 2.0])
    assert store.keys() == ["w", "b"] and len(store) == 2 and "w" in store and "x" not in store
    assert store.numel() == 8
    with pytest.raises(tapir.ParamError) as e:
        store["x"]
    assert isinstance(e.value, KeyError) and "x" in str(e.value)
    with pytest.raises(tapir.ParamError):
        store["x"] = np.ones(1, np.float32)
    with pytest.raises(tapir.ArgumentError):
        store.add("w", np.ones(1, np.float32))  # a name is added once
    with pytest.raises(tapir.ShapeError):
        store["w"] = np.ones((3, 2), np.float32)
    g = tapir.Graph()
    with g.scope() as s:
        with pytest.raises(tapir.ParamError):
            s.param(store, "nope")
    grads = store.zeros_like()
    np.testing.assert_array_equal(grads["w"], np.zeros((2, 3)))
    with pytest.raises(tapir.ParamError):
        grads["nope"]


def test_backward_into_accumulates():
    store = tapir.ParamStore("float64")
    store.add("w", np.array([1.0, -2.0, 3.0]))
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    for k in range(1, 4):
        with g.scope() as s:
            w = s.param(store, "w")
            s.backward_into((w * w).sum() * float(k), grads)  # += 2k·w
    np.testing.assert_allclose(grads["w"], 2 * (1 + 2 + 3) * np.array([1.0, -2.0, 3.0]), rtol=1e-15)
    grads.zero()
    np.testing.assert_array_equal(grads["w"], np.zeros(3))
    # A buffer of the other dtype is refused.
    g32 = tapir.Graph("float32")
    s32 = tapir.ParamStore("float32")
    s32.add("w", np.ones(3, np.float32))
    with g32.scope() as s:
        w = s.param(s32, "w")
        with pytest.raises(tapir.DTypeError):
            s.backward_into(w.sum(), grads)


# -------------------------------------------------------------------- optimizers


def run_steps(make_opt, grads_seq, w0):
    """Applies `make_opt(store)`'s steps for the gradients `grads_seq` (each fed through a
    scope as L = Σ c ⊙ w, so ∂L/∂w = c); returns the parameter after each step."""
    store = tapir.ParamStore("float64")
    store.add("w", w0)
    opt = make_opt(store)
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    out = []
    for c in grads_seq:
        grads.zero()
        with g.scope() as s:
            s.backward_into((s.param(store, "w") * s.input(c)).sum(), grads)
        np.testing.assert_array_equal(grads["w"], c)
        opt.step(store, grads)
        out.append(store["w"])
    return out, opt


W0 = np.array([0.5, -1.0, 2.0])
GRADS = [np.array([0.1, -0.3, 0.2]), np.array([-0.2, 0.4, 0.0]), np.array([0.3, 0.1, -0.5]), np.array([0.0, 0.2, 0.1])]


@pytest.mark.parametrize("momentum, nesterov, wd", [(0.0, False, 0.0), (0.9, False, 0.0), (0.9, True, 0.0),
                                                    (0.5, False, 0.1), (0.0, False, 0.01)])
def test_sgd_step_matches_closed_form(momentum, nesterov, wd):
    lr = 0.1
    got, opt = run_steps(lambda st: tapir.optim.SGD(st, lr, momentum=momentum, nesterov=nesterov, weight_decay=wd),
                         GRADS, W0)
    assert isinstance(opt, tapir.Optimizer) and opt.lr == lr
    w, b = W0.copy(), None
    for c, step in zip(GRADS, got):
        d = c + wd * w
        if momentum:
            b = d if b is None else momentum * b + d
            d = d + momentum * b if nesterov else b
        w = w - lr * d
        np.testing.assert_allclose(step, w, rtol=1e-14, atol=1e-15)


def _adam_reference(w, grads_seq, lr, b1, b2, eps, wd, decoupled):
    m, v, out = np.zeros_like(w), np.zeros_like(w), []
    for t, c in enumerate(grads_seq, start=1):
        if decoupled:
            w = w - lr * wd * w
        else:
            c = c + wd * w
        m = b1 * m + (1 - b1) * c
        v = b2 * v + (1 - b2) * c * c
        w = w - lr * (m / (1 - b1**t)) / (np.sqrt(v / (1 - b2**t)) + eps)
        out.append(w)
    return out


@pytest.mark.parametrize("wd", [0.0, 0.1])
def test_adam_steps_match_closed_form(wd):
    got, _ = run_steps(lambda st: tapir.optim.Adam(st, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=wd),
                       GRADS, W0)
    for a, b in zip(got, _adam_reference(W0, GRADS, 0.01, 0.8, 0.99, 1e-6, wd, decoupled=False)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    got, _ = run_steps(lambda st: tapir.optim.Adam(st), GRADS, W0)  # defaults: torch's
    for a, b in zip(got, _adam_reference(W0, GRADS, 1e-3, 0.9, 0.999, 1e-8, 0.0, decoupled=False)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_adamw_steps_match_closed_form():
    got, _ = run_steps(lambda st: tapir.optim.AdamW(st, lr=0.01, weight_decay=0.1), GRADS, W0)
    for a, b in zip(got, _adam_reference(W0, GRADS, 0.01, 0.9, 0.999, 1e-8, 0.1, decoupled=True)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)
    got, _ = run_steps(lambda st: tapir.optim.AdamW(st), GRADS, W0)  # default weight decay 0.01
    for a, b in zip(got, _adam_reference(W0, GRADS, 1e-3, 0.9, 0.999, 1e-8, 0.01, decoupled=True)):
        np.testing.assert_allclose(a, b, rtol=1e-13, atol=1e-15)


def test_learning_rate_can_be_changed_between_steps():
    def make(st):
        return tapir.optim.SGD(st, 0.1)

    store = tapir.ParamStore("float64")
    store.add("w", np.array([1.0]))
    opt = make(store)
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    for lr in (0.1, 0.5):
        opt.lr = lr
        assert opt.lr == lr
        grads.zero()
        with g.scope() as s:
            s.backward_into(s.param(store, "w").sum(), grads)  # gradient 1
        opt.step(store, grads)
    assert store["w"][0] == pytest.approx(1.0 - 0.1 - 0.5, abs=1e-15)


@pytest.mark.parametrize("bad", [lambda st: tapir.optim.SGD(st, -1.0), lambda st: tapir.optim.SGD(st, float("nan")),
                                 lambda st: tapir.optim.Adam(st, betas=(1.0, 0.9)),
                                 lambda st: tapir.optim.SGD(st, 0.1, nesterov=True)])
def test_optimizer_arguments_are_checked(bad):
    store = tapir.ParamStore()
    store.add("w", np.ones(2, np.float32))
    with pytest.raises(tapir.ArgumentError):
        bad(store)


def test_an_optimizer_refuses_another_store():
    a, b = tapir.ParamStore(), tapir.ParamStore()
    for st in (a, b):
        st.add("w", np.ones(2, np.float32))
    opt = tapir.optim.Adam(a)
    with pytest.raises(tapir.TapirError):
        opt.step(b, b.zeros_like())
    np.testing.assert_array_equal(b["w"], [1.0, 1.0])
    with pytest.raises(tapir.DTypeError):
        opt.step(a, tapir.ParamStore("float64").zeros_like())


def test_clip_grad_norm_matches_closed_form():
    store = tapir.ParamStore("float64")
    store.add("a", np.zeros(2))
    store.add("b", np.zeros((1, 2)))
    grads = store.zeros_like()
    g = tapir.Graph("float64")
    with g.scope() as s:
        a, b = s.param(store, "a"), s.param(store, "b")
        s.backward_into((a * s.input([3.0, 4.0])).sum() + (b * s.input([[12.0, 0.0]])).sum(), grads)
    # ‖(3, 4, 12, 0)‖ = 13; clipped to 6.5 the scale is 6.5/(13 + 1e-6) (torch's epsilon).
    norm = tapir.optim.clip_grad_norm(store, grads, 6.5)
    assert norm == pytest.approx(13.0, rel=1e-15)
    scale = 6.5 / (13.0 + 1e-6)
    np.testing.assert_allclose(grads["a"], np.array([3.0, 4.0]) * scale, rtol=1e-14)
    np.testing.assert_allclose(grads["b"], np.array([[12.0, 0.0]]) * scale, rtol=1e-14)
    # Under the bound nothing changes.
    before = grads["a"].copy()
    assert tapir.optim.clip_grad_norm(store, grads, 100.0) == pytest.approx(6.5, rel=1e-6)
    np.testing.assert_array_equal(grads["a"], before)
    with pytest.raises(tapir.ArgumentError):
        tapir.optim.clip_grad_norm(store, grads, 0.0)


def test_init_threads_in_a_fresh_process():
    code = (
        "import numpy as np, tapir\n"
        "print(tapir.init_threads(2))\n"
        "g = tapir.Graph()\n"
        "with g.scope() as s:\n"
        "    x = s.leaf(np.ones((128, 128), np.float32))\n"
        "    print((x @ x).sum().item())\n"
        "try:\n"
        "    tapir.init_threads(3)\n"
        "except tapir.ArgumentError as e:\n"
        "    print('again:', type(e).__name__)\n"
        "import os\n"
        "print(tapir.set_spin_wait(False) == (2 <= len(os.sched_getaffinity(0))))\n"
        "with g.scope() as s:\n"
        "    x = s.leaf(np.ones((128, 128), np.float32))\n"
        "    print((x @ x).sum().item())\n"
        "print(tapir.set_spin_wait(True))\n"
    )
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.split("\n")
    assert lines[:3] == ["2", str(128.0**3), "again: ArgumentError"]
    # init_threads turned spin-waiting on where 2 threads fit the cores; off, same result.
    assert lines[3:6] == ["True", str(128.0**3), "False"]


def test_gpt_example_learns():
    gpt = importlib.import_module("gpt_step")
    losses = gpt.train(steps=25, log=lambda *_: None, threads=1)
    # Uniform guesses at first (embeddings are small), and learning from there.
    assert abs(losses[0] - np.log(gpt.VOCAB)) < 0.3, losses[0]
    assert np.mean(losses[-5:]) < losses[0] - 1.0, losses
