#!/usr/bin/env python3
"""Chebyshev coefficients for the erfc factor used by crates/tapir/src/kernels/vmath.rs.

For z >= 0, erfc(z) = exp(-z^2) * t * g(t) with t = 2/(2 + z) in (0, 1] and
g(t) = exp(z^2) * erfc(z) / t, which runs from 1 at z = 0 down to 1/(2 sqrt(pi)) as
z -> infinity (Numerical Recipes' change of variable, there applied to log g). g is smooth
on [0, 1] and its Chebyshev coefficients in u = 2t - 1 fall geometrically, so one series
covers the whole half-line: 29 terms for f64, the first 14 of them for f32, evaluated with Clenshaw's
recurrence. The 29 terms are printed; each precision's dropped tail is bounded by the sum of
the magnitudes of the coefficients after its last one (up to the 59th), against g >= 0.28.

Run: python3 tools/erfc_chebyshev.py   (needs mpmath; prints Rust arrays)
"""
import mpmath as mp

mp.mp.dps = 60


def g(t):
    if t == 0:
        return 1 / (2 * mp.sqrt(mp.pi))
    z = 2 / t - 2
    return mp.erfc(z) * mp.exp(z * z) / t


def chebyshev(f, n, m=240):
    """The first n coefficients of f on [0, 1] by m-point Chebyshev interpolation."""
    nodes = [mp.cos(mp.pi * (j + mp.mpf(1) / 2) / m) for j in range(m)]
    vals = [f((u + 1) / 2) for u in nodes]
    cs = []
    for k in range(n):
        s = mp.fsum(vals[j] * mp.cos(k * mp.pi * (j + mp.mpf(1) / 2) / m) for j in range(m))
        cs.append(2 * s / m)
    cs[0] /= 2
    return cs


cs = chebyshev(g, 29 + 30)
for name, n in [("f32", 14), ("f64", 29)]:
    tail = mp.fsum(abs(c) for c in cs[n:])
    print(f"// {name}: {n} terms, dropped tail {mp.nstr(tail, 3)} (g >= 0.28)")
# One table: the f64 kernels use all of it, the f32 kernels its first 14 terms rounded
# to f32 (vmath.rs's `erfc_cheb`); each coefficient does not depend on how many are kept.
print("const ERFC_CHEB: [f64; 29] = [")
for c in cs[:29]:
    print(f"    {float(c)!r},")
print("];")
