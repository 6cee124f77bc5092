"""Optimizers over a ``ParamStore``: ``opt.step(store, grads)`` after the scope's
``with`` block (inside it the store is borrowed and ``step`` raises ``ScopeError``)."""

from ._tapir import SGD, Adam, AdamW, Optimizer, clip_grad_norm

__all__ = ["SGD", "Adam", "AdamW", "Optimizer", "clip_grad_norm"]
