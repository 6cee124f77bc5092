"""NumPy reference implementations (float64) and central finite differences, written
independently of tapir: the tests compare tapir's values and gradients with these."""

import math

import numpy as np

_erf = np.vectorize(math.erf, otypes=[np.float64])


def erf(x):
    return _erf(x)


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    return np.logaddexp(0.0, x)


def gelu(x):
    return 0.5 * x * (1.0 + erf(x / math.sqrt(2.0)))


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def logsumexp(x, axis=-1, keepdims=False):
    m = np.max(x, axis=axis, keepdims=True)
    out = m + np.log(np.sum(np.exp(x - m), axis=axis, keepdims=True))
    return out if keepdims else np.squeeze(out, axis=axis)


def softmax(x, axis=-1):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


def log_softmax(x, axis=-1):
    return x - logsumexp(x, axis=axis, keepdims=True)


def cross_entropy(x, labels):
    labels = np.asarray(labels)
    return np.mean(logsumexp(x, axis=-1) - x[np.arange(len(labels)), labels])


def nll_loss(x, labels):
    labels = np.asarray(labels)
    return -np.mean(x[np.arange(len(labels)), labels])


def layer_norm(x, w, b, eps=1e-5):
    mu = x.mean(axis=-1, keepdims=True)
    var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * w + b


def conv2d(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    """Cross-correlation, as PyTorch's conv2d: x [N, C, H, W], w [O, C/groups, kh, kw].
    Kernel tap (a, b) of output (i, j) reads padded row i·sh + a·dh, column j·sw + b·dw;
    output channel block k (O/groups channels) sees input channel block k only."""
    n, c, h, wd = x.shape
    o, cg, kh, kw = w.shape
    assert c % groups == 0 and o % groups == 0 and cg == c // groups
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    og = o // groups
    out = np.zeros((n, o, oh, ow))
    for i in range(oh):
        for j in range(ow):
            # The dilated window: kh×kw taps dh and dw apart, [N, C, kh, kw].
            patch = xp[:, :, i * sh : i * sh + dh * (kh - 1) + 1 : dh, j * sw : j * sw + dw * (kw - 1) + 1 : dw]
            for k in range(groups):
                block = patch[:, k * cg : (k + 1) * cg]
                out[:, k * og : (k + 1) * og, i, j] = np.einsum("nckl,ockl->no", block, w[k * og : (k + 1) * og])
    return out


def _pool(x, kernel, stride, padding, fill, reduce, dilation=(1, 1)):
    n, c, h, wd = x.shape
    (kh, kw), (sh, sw), (ph, pw), (dh, dw) = kernel, stride, padding, dilation
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)), constant_values=fill)
    oh = (h + 2 * ph - dh * (kh - 1) - 1) // sh + 1
    ow = (wd + 2 * pw - dw * (kw - 1) - 1) // sw + 1
    out = np.zeros((n, c, oh, ow))
    for i in range(oh):
        for j in range(ow):
            window = xp[:, :, i * sh : i * sh + dh * (kh - 1) + 1 : dh, j * sw : j * sw + dw * (kw - 1) + 1 : dw]
            out[:, :, i, j] = reduce(window, axis=(2, 3))
    return out


def max_pool2d(x, kernel, stride=None, padding=(0, 0), dilation=(1, 1)):
    """Padding never wins: it is -inf. Taps `dilation` apart, as PyTorch's max_pool2d."""
    return _pool(x, kernel, stride or kernel, padding, -np.inf, np.max, dilation)


def avg_pool2d(x, kernel, stride=None, padding=(0, 0)):
    """Padding counts as zeros; the divisor is always kh·kw (PyTorch's count_include_pad)."""
    kh, kw = kernel
    return _pool(x, kernel, stride or kernel, padding, 0.0, np.sum) / (kh * kw)


def attention_weights(qkv, heads, causal=True):
    """qkv [B, T, 3C]: softmax_j(q_i·k_j/√D) per head, [B, H, T, T]; causal rows see j ≤ i,
    the others are exactly 0."""
    b, t, c3 = qkv.shape
    c = c3 // 3
    d = c // heads
    q = qkv[:, :, :c].reshape(b, t, heads, d).transpose(0, 2, 1, 3)
    k = qkv[:, :, c : 2 * c].reshape(b, t, heads, d).transpose(0, 2, 1, 3)
    scores = q @ k.transpose(0, 1, 3, 2) / math.sqrt(d)
    if causal:
        mask = np.tril(np.ones((t, t), dtype=bool))
        scores = np.where(mask, scores, -np.inf)
    return softmax(scores, axis=-1)


def attend(p, qkv):
    """p [B, H, T, T] applied to the value block of qkv [B, T, 3C]: [B, T, C]."""
    b, h, t, _ = p.shape
    c = qkv.shape[2] // 3
    d = c // h
    v = qkv[:, :, 2 * c :].reshape(b, t, h, d).transpose(0, 2, 1, 3)  # [B, H, T, D]
    out = p @ v  # [B, H, T, D]
    return out.transpose(0, 2, 1, 3).reshape(b, t, c)


def central_differences(loss, arrays, which, rel_step=1e-6):
    """∂loss/∂arrays[k] for each k in `which`, by central differences in float64 with
    step h = rel_step·max(1, |x|) per element."""
    arrays = [np.array(a, dtype=np.float64, copy=True) for a in arrays]
    grads = []
    for k in which:
        a = arrays[k]
        g = np.zeros_like(a)
        flat, gflat = a.reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            x0 = flat[i]
            h = rel_step * max(1.0, abs(x0))
            flat[i] = x0 + h
            up = loss(*arrays)
            flat[i] = x0 - h
            down = loss(*arrays)
            flat[i] = x0
            gflat[i] = (up - down) / (2.0 * h)
        grads.append(g)
    return grads


def close(analytic, numeric, atol, rtol):
    """Elementwise |a − n| ≤ atol + rtol·max(|a|, |n|); returns the worst excess (≤ 0: ok)."""
    analytic, numeric = np.asarray(analytic, np.float64), np.asarray(numeric, np.float64)
    bound = atol + rtol * np.maximum(np.abs(analytic), np.abs(numeric))
    return np.max(np.abs(analytic - numeric) - bound, initial=-np.inf)
