#!/usr/bin/env python3
"""Reference values for the convolution tests (crates/tapir/tests/conv_fixtures.rs).

PyTorch in float64 computes, for each case, an op's output and the gradients of the
weighted sum `L = sum(out * r)` (a fixed random `r`, so that a transposed gradient cannot
hide behind a plain sum) with respect to its inputs. The ops are `F.conv2d` (groups 1, 2
and C_in, the last with one and two filters per channel; dilation 1 and 2; strides,
paddings, non-square inputs and kernels), `F.max_pool2d` with dilation, and `F.unfold`
(tapir's `im2col`) with dilation.

Output: one block per case. Its first line is `case OP key=value ...` (dims and window
arguments, comma-separated pairs); each following line is `NAME v v v ...` with the
tensor's values in row-major order, each printed by `repr` (the shortest text that reads
back as the same f64), for `x`, `w` (conv2d only), `r`, `out`, `dx` and `dw` (conv2d
only). Inputs are drawn here and stored, so the Rust test needs no Python and never skips.

Run: python3 tools/conv_fixtures.py > crates/tapir/tests/data/conv_fixtures.txt
(torch 2.15.0, CPU; any version gives the same values up to rounding.)
"""
import torch
import torch.nn.functional as F

torch.manual_seed(35)
DT = torch.float64


def pair(v):
    return f"{v[0]},{v[1]}"


def values(t):
    return " ".join(repr(float(v)) for v in t.detach().reshape(-1).tolist())


def rand(*dims):
    # Uniform in [-2, 2): continuous, so max pooling has no ties.
    return (torch.rand(*dims, dtype=DT) * 4 - 2).requires_grad_()


def emit(head, tensors):
    print(head)
    for name, t in tensors:
        print(name, values(t))


def conv(x_dims, w_dims, stride, padding, dilation, groups):
    x, w = rand(*x_dims), rand(*w_dims)
    out = F.conv2d(x, w, stride=stride, padding=padding, dilation=dilation, groups=groups)
    r = torch.rand(out.shape, dtype=DT) * 2 - 1
    (out * r).sum().backward()
    head = (
        f"case conv2d x={','.join(map(str, x_dims))} w={','.join(map(str, w_dims))} "
        f"stride={pair(stride)} padding={pair(padding)} dilation={pair(dilation)} groups={groups}"
    )
    emit(head, [("x", x), ("w", w), ("r", r), ("out", out), ("dx", x.grad), ("dw", w.grad)])


def window_case(op, x_dims, kernel, stride, padding, dilation):
    x = rand(*x_dims)
    if op == "max_pool2d":
        out = F.max_pool2d(x, kernel, stride=stride, padding=padding, dilation=dilation)
    else:
        out = F.unfold(x, kernel, dilation=dilation, padding=padding, stride=stride)
    r = torch.rand(out.shape, dtype=DT) * 2 - 1
    (out * r).sum().backward()
    head = (
        f"case {op} x={','.join(map(str, x_dims))} kernel={pair(kernel)} "
        f"stride={pair(stride)} padding={pair(padding)} dilation={pair(dilation)}"
    )
    emit(head, [("x", x), ("r", r), ("out", out), ("dx", x.grad)])


print("# conv2d, max_pool2d, unfold (im2col) in PyTorch float64: tools/conv_fixtures.py")
# x dims, w dims, stride, padding, dilation, groups
conv([2, 3, 5, 4], [4, 3, 3, 2], (1, 1), (0, 0), (1, 1), 1)
conv([2, 3, 9, 7], [2, 3, 3, 2], (2, 1), (1, 2), (2, 2), 1)
conv([1, 2, 8, 6], [3, 2, 2, 3], (1, 2), (2, 0), (2, 1), 1)
conv([2, 4, 6, 7], [6, 2, 3, 3], (2, 2), (1, 1), (1, 1), 2)
conv([1, 4, 8, 9], [4, 2, 2, 3], (1, 2), (2, 1), (2, 2), 2)
conv([2, 6, 7, 5], [2, 3, 3, 1], (1, 1), (0, 1), (1, 2), 2)
conv([2, 3, 5, 6], [3, 1, 3, 3], (1, 1), (1, 1), (1, 1), 3)
conv([2, 3, 9, 8], [6, 1, 3, 3], (2, 1), (2, 2), (2, 2), 3)
conv([1, 4, 7, 10], [4, 1, 2, 4], (1, 2), (0, 1), (2, 1), 4)
conv([1, 4, 6, 5], [8, 1, 1, 2], (3, 1), (1, 0), (1, 2), 4)
# op, x dims, kernel, stride, padding, dilation
window_case("max_pool2d", [2, 2, 7, 6], (3, 2), (1, 1), (1, 1), (2, 2))
window_case("max_pool2d", [1, 3, 6, 9], (2, 3), (2, 1), (1, 1), (1, 3))
window_case("max_pool2d", [1, 2, 7, 5], (3, 3), (2, 2), (1, 1), (1, 1))
window_case("max_pool2d", [2, 1, 8, 7], (2, 2), (1, 2), (0, 1), (3, 2))
window_case("im2col", [2, 2, 6, 5], (2, 3), (1, 1), (1, 2), (2, 1))
window_case("im2col", [1, 3, 7, 8], (3, 2), (2, 3), (0, 1), (2, 3))
