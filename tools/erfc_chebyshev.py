#!/usr/bin/env python3
"""Chebyshev coefficients for the erfc tail used by crates/tapir/src/kernels/vmath.rs.

For z >= 1/2, erfc(z) = exp(-z^2) * h(t) * t with t = 1/z in (0, 2] and
h(t) = z * exp(z^2) * erfc(z), which tends to 1/sqrt(pi) as t -> 0. h is smooth on
[0, 2]; its Chebyshev series in u = t - 1 is evaluated with Clenshaw's recurrence,
which stays accurate where a monomial form would cancel (its coefficients reach 3e7).

Run: python3 tools/erfc_chebyshev.py   (needs mpmath; prints Rust arrays)
"""
import mpmath as mp

mp.mp.dps = 60


def h(t):
    if t == 0:
        return 1 / mp.sqrt(mp.pi)
    z = 1 / t
    return mp.erfc(z) * mp.exp(z * z) * z


def chebyshev(f, n, m=240):
    """The first n coefficients of f on [0, 2] by m-point Chebyshev interpolation."""
    nodes = [mp.cos(mp.pi * (j + mp.mpf(1) / 2) / m) for j in range(m)]
    vals = [f(u + 1) for u in nodes]
    cs = []
    for k in range(n):
        s = mp.fsum(vals[j] * mp.cos(k * mp.pi * (j + mp.mpf(1) / 2) / m) for j in range(m))
        cs.append(2 * s / m)
    cs[0] /= 2
    return cs


for name, n in [("f32", 21), ("f64", 49)]:
    cs = chebyshev(h, n)
    tail = mp.fsum(abs(c) for c in chebyshev(h, n + 12)[n:])
    print(f"// {name}: {n} terms, dropped tail {mp.nstr(tail, 3)} (h >= 0.30)")
    print(f"const ERFC_CHEB: [{name}; {n}] = [")
    for c in cs:
        v = float(c)
        print(f"    {v!r},")
    print("];")
