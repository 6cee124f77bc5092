"""Trains an MLP (64-256-128-10, ReLU) with Adam on scikit-learn's 8×8 handwritten digits,
shipped in the repository (crates/tapir-nn/data/digits.csv.gz), and prints the loss curve
and the test accuracy. Pixels are standardized with the training set's statistics (97.5-98%
test accuracy over seeds 0-4, against 97.0-97.2% for raw pixels). The learning rate warms up linearly over the first epoch to 3e-3,
then follows a cosine down to 1e-5, as in the Rust example.

    python crates/tapir-py/examples/train_digits.py [--epochs N] [--seed N] [--out DIR]

The split is the Rust example's (crates/tapir-nn/examples/train_digits.rs): every fifth
image (index ≡ 4 mod 5) is a test image, giving 1,438 training and 359 test images.
With matplotlib installed it also saves the loss curve as DIR/digits_mlp.png.
"""

import argparse
import gzip
import math
import time
from pathlib import Path

import numpy as np

import tapir

DATA = Path(__file__).resolve().parents[2] / "tapir-nn" / "data" / "digits.csv.gz"
BATCH = 32


def load_digits(path=DATA):
    """((x_train, y_train), (x_test, y_test)): pixels scaled to [0, 1] as float32 `[n, 64]`,
    labels int64 `[n]`; the split of the Rust example."""
    with gzip.open(path, "rt") as f:
        table = np.loadtxt(f, delimiter=",", dtype=np.int64)
    if table.shape[1] != 65 or table[:, 0].max() > 9 or table[:, 1:].max() > 16 or table.min() < 0:
        raise ValueError(f"{path}: expected a label 0-9 and 64 pixels 0-16 per line")
    x = (table[:, 1:] / 16.0).astype(np.float32)
    y = table[:, 0]
    test = np.arange(len(y)) % 5 == 4
    return (x[~test], y[~test]), (x[test], y[test])


def standardize(x_train, x_test):
    """Each pixel shifted and scaled by the training set's mean and standard deviation (+0.1,
    for the border pixels that are almost always 0)."""
    mu, sd = x_train.mean(axis=0), x_train.std(axis=0) + 0.1
    return ((x_train - mu) / sd).astype(np.float32), ((x_test - mu) / sd).astype(np.float32)


def accuracy(g, mlp, x, y):
    """The fraction of `x` that `mlp` classifies as `y` (one scope, no gradient)."""
    with g.scope() as s:
        logits = mlp(s, s.input(x)).numpy()
    return float(np.mean(np.argmax(logits, axis=1) == y))


def train(epochs=40, seed=0, lr=3e-3, sizes=(64, 256, 128, 10), log=print):
    """Trains a fresh MLP; returns a dict with the per-epoch mean training loss (`losses`),
    the per-epoch test accuracy (`test_accuracy`), the final `train_accuracy` and the model
    (`mlp`, `store`, `graph`)."""
    (x_train, y_train), (x_test, y_test) = load_digits()
    x_train, x_test = standardize(x_train, x_test)
    rng = np.random.default_rng(seed)
    store = tapir.ParamStore()
    mlp = tapir.nn.MLP(store, list(sizes), rng=rng)
    steps_per_epoch = math.ceil(len(y_train) / BATCH)
    opt = tapir.optim.Adam(store, lr=lr)
    # Linear warm-up over the first epoch, then a cosine down to 1e-5 at the last step.
    schedule = tapir.optim.CosineAnnealingLR(opt, T_max=steps_per_epoch * epochs, eta_min=1e-5, warmup=steps_per_epoch)
    grads = store.zeros_like()  # allocated once, zeroed each step
    g = tapir.Graph(threads=1)  # these matrices are too small to share out
    losses, test_acc = [], []
    for epoch in range(epochs):
        order = rng.permutation(len(y_train))
        total, t0 = 0.0, time.perf_counter()
        for start in range(0, len(order), BATCH):
            idx = order[start : start + BATCH]
            grads.zero()
            with g.scope() as s:
                loss = mlp(s, s.input(x_train[idx])).cross_entropy(y_train[idx])
                s.backward_into(loss, grads)
                total += loss.item() * len(idx)
            opt.step(store, grads)  # after the block: the store is free again
            schedule.step()
        losses.append(total / len(order))
        test_acc.append(accuracy(g, mlp, x_test, y_test))
        log(
            f"epoch {epoch + 1:3d}  loss {losses[-1]:.4f}  test accuracy {100 * test_acc[-1]:.2f}%  "
            f"({time.perf_counter() - t0:.2f} s)"
        )
    return {
        "losses": losses,
        "test_accuracy": test_acc,
        "train_accuracy": accuracy(g, mlp, x_train, y_train),
        "mlp": mlp,
        "store": store,
        "graph": g,
    }


def plot(losses, test_accuracy, path):
    """Saves the loss and accuracy curves to `path`; returns False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, ax = plt.subplots(figsize=(6, 4))
    epochs = np.arange(1, len(losses) + 1)
    ax.plot(epochs, losses, label="training loss")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    ax2.plot(epochs, 100 * np.asarray(test_accuracy), color="tab:orange", label="test accuracy")
    ax2.set_ylabel("test accuracy (%)")
    fig.legend(loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("target/train_digits"))
    args = p.parse_args()
    result = train(args.epochs, args.seed)
    print("loss curve:", " ".join(f"{v:.3g}" for v in result["losses"]))
    print(f"train accuracy {100 * result['train_accuracy']:.2f}%, test accuracy {100 * result['test_accuracy'][-1]:.2f}%")
    args.out.mkdir(parents=True, exist_ok=True)
    png = args.out / "digits_mlp.png"
    if plot(result["losses"], result["test_accuracy"], png):
        print(f"wrote {png}")
    else:
        print("matplotlib is not installed: no plot")


if __name__ == "__main__":
    main()
