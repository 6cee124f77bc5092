#!/usr/bin/env python3
"""Reference values for the f64 kernel accuracy test (crates/tapir/src/kernels/accuracy.rs).

Each function is evaluated with mpmath at 50 significant digits on a dense grid over its
useful range (half the points evenly spaced, half spaced evenly in log|x|, so that
tiny and huge arguments are covered) and rounded to the nearest f64. One line per point:
`name x_bits y_bits` in hex. The derivatives use their closed forms.

Run: python3 tools/f64_reference.py > crates/tapir/tests/data/f64_reference.txt
"""
import math
import struct

import mpmath as mp

mp.mp.dps = 50
N = 600  # points per function; 17 functions


def bits(v):
    return struct.unpack("<Q", struct.pack("<d", v))[0]


def sig(x):
    return 1 / (1 + mp.exp(-x))


def cdf(x):
    return mp.erfc(-x / mp.sqrt(2)) / 2


def pdf(x):
    return mp.exp(-x * x / 2) / mp.sqrt(2 * mp.pi)


K = mp.sqrt(2 / mp.pi)


def gt_u(x):
    return K * (x + mp.mpf("0.044715") * x**3)


FUNCS = {
    "exp": (mp.exp, -745.0, 709.0),
    "expm1": (mp.expm1, -40.0, 709.0),
    "log": (mp.log, 1e-300, 1e300),
    "log1p": (mp.log1p, -0.999999, 1e300),
    "tanh": (mp.tanh, -20.0, 20.0),
    "tanh'": (lambda x: 1 / mp.cosh(x) ** 2, -300.0, 300.0),
    "erf": (mp.erf, -6.0, 6.0),
    "erf'": (lambda x: 2 / mp.sqrt(mp.pi) * mp.exp(-x * x), -27.0, 27.0),
    "sigmoid": (sig, -700.0, 37.0),
    "sigmoid'": (lambda x: sig(x) * sig(-x), -700.0, 700.0),
    "softplus": (lambda x: mp.log1p(mp.exp(x)), -700.0, 1e6),
    "silu": (lambda x: x * sig(x), -700.0, 1e6),
    "silu'": (lambda x: sig(x) * (1 + x * sig(-x)), -700.0, 1e6),
    "gelu": (lambda x: x * cdf(x), -38.0, 1e6),
    "gelu'": (lambda x: cdf(x) + x * pdf(x), -38.0, 1e6),
    "gelu_tanh": (lambda x: x * sig(2 * gt_u(x)), -26.0, 1e6),
    "gelu_tanh'": (
        lambda x: sig(2 * gt_u(x))
        + x * 2 * sig(2 * gt_u(x)) * sig(-2 * gt_u(x)) * K * (1 + 3 * mp.mpf("0.044715") * x * x),
        -26.0,
        1e6,
    ),
}


def grid(lo, hi, n):
    pts = set()
    for i in range(n // 2):
        pts.add(lo + (hi - lo) * (i + 0.5) / (n // 2))
    # log-spaced magnitudes, both signs where the range allows
    for i in range(n // 2):
        t = (i + 0.5) / (n // 2)
        m = 10 ** (-300 + t * (math.log10(max(abs(lo), abs(hi))) + 300))
        x = m if i % 2 == 0 else -m
        if lo <= x <= hi:
            pts.add(x)
    return sorted(pts)


print("# name x y: mpmath (50 digits) rounded to f64; tools/f64_reference.py")
for name, (f, lo, hi) in FUNCS.items():
    for x in grid(lo, hi, N):
        y = float(f(mp.mpf(x)))
        print(f"{name} {bits(x):016x} {bits(y):016x}")
