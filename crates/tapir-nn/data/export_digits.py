"""Exports scikit-learn's 8x8 handwritten digits to digits.csv.gz, once.

    pip install scikit-learn
    python3 crates/tapir-nn/data/export_digits.py

Each line is `label,p0,...,p63`: the class 0-9, then the 64 pixels of the 8x8 image in
row-major order, integers 0-16. The 1,797 lines keep scikit-learn's order. gzip's mtime
is fixed at 0 so the file is byte-for-byte reproducible.
"""

import gzip
from pathlib import Path

from sklearn.datasets import load_digits

HERE = Path(__file__).resolve().parent


def main():
    digits = load_digits()
    lines = []
    for label, pixels in zip(digits.target, digits.data):
        lines.append(",".join([str(int(label))] + [str(int(p)) for p in pixels]))
    data = ("\n".join(lines) + "\n").encode()
    with open(HERE / "digits.csv.gz", "wb") as raw:
        with gzip.GzipFile(filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9) as f:
            f.write(data)
    print(f"wrote {len(lines)} images to {HERE / 'digits.csv.gz'}")


if __name__ == "__main__":
    main()
