"""Optimizers over a ``ParamStore``: ``opt.step(store, grads)`` after the scope's
``with`` block (inside it the store is borrowed and ``step`` raises ``ScopeError``).

Learning-rate schedules set ``opt.lr`` from the step count, as PyTorch's
``torch.optim.lr_scheduler``: made after the optimizer (which sets the rate of step 0),
then ``sched.step()`` after each ``opt.step(...)``:

    opt = tapir.optim.AdamW(store, lr=3e-3)
    sched = tapir.optim.CosineAnnealingLR(opt, T_max=1000, warmup=100)
    for step in range(1000):
        ...
        opt.step(store, grads)
        sched.step()
"""

import math
from collections import abc as _abc

from . import _errors
from ._tapir import SGD, Adam, AdamW, Optimizer, clip_grad_norm

__all__ = [
    "SGD",
    "Adam",
    "AdamW",
    "Optimizer",
    "clip_grad_norm",
    "LRScheduler",
    "LambdaLR",
    "StepLR",
    "LinearLR",
    "CosineAnnealingLR",
]


class LRScheduler:
    """The base of the schedules: the rate of step ``t`` is ``lr_at(t)``, a closed form of
    ``base_lr`` (``opt.lr`` when the schedule was made) and ``t``.

    The constructor sets ``opt.lr = lr_at(0)``; ``step()`` advances ``last_step`` by one,
    sets ``opt.lr = lr_at(last_step)`` and returns it.
    """

    def __init__(self, opt: Optimizer) -> None:
        self.optimizer = opt
        self.base_lr: float = opt.lr
        self.last_step = 0
        opt.lr = self.lr_at(0)

    def lr_at(self, step: int) -> float:
        """The learning rate of step ``step`` (0 for the first)."""
        raise NotImplementedError(f"{type(self).__name__} does not define lr_at")

    def step(self) -> float:
        """Moves to the next step and sets the optimizer's rate; returns it."""
        self.last_step += 1
        lr = self.lr_at(self.last_step)
        self.optimizer.lr = lr
        return lr


def _count(sched: str, what: str, v, minimum: int = 1) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        kind = "a positive" if minimum == 1 else "a non-negative"
        raise _errors.ArgumentError(f"{sched}: {what} {v!r} must be {kind} integer")
    return v


def _finite(sched: str, what: str, v, lo: float = -math.inf, hi: float = math.inf, low_open: bool = False) -> float:
    ok = isinstance(v, (int, float)) and math.isfinite(v) and (lo < v if low_open else lo <= v) and v <= hi
    if not ok:
        bounds = f"in {'(' if low_open else '['}{lo}, {hi}]" if math.isfinite(hi) else f">= {lo}"
        raise _errors.ArgumentError(f"{sched}: {what} {v!r} must be finite and {bounds}")
    return float(v)


class LambdaLR(LRScheduler):
    """``lr = base_lr · lr_lambda(step)``, as ``torch.optim.lr_scheduler.LambdaLR``."""

    def __init__(self, opt: Optimizer, lr_lambda: _abc.Callable[[int], float]) -> None:
        if not callable(lr_lambda):
            raise _errors.ArgumentError(f"LambdaLR: lr_lambda {lr_lambda!r} must be callable")
        self.lr_lambda = lr_lambda
        super().__init__(opt)

    def lr_at(self, step: int) -> float:
        return self.base_lr * float(self.lr_lambda(step))


class StepLR(LRScheduler):
    """``lr = base_lr · gamma^⌊step/step_size⌋``, as ``torch.optim.lr_scheduler.StepLR``."""

    def __init__(self, opt: Optimizer, step_size: int, gamma: float = 0.1) -> None:
        self.step_size = _count("StepLR", "step_size", step_size)
        self.gamma = _finite("StepLR", "gamma", gamma, lo=0.0)
        super().__init__(opt)

    def lr_at(self, step: int) -> float:
        return self.base_lr * self.gamma ** (step // self.step_size)


class LinearLR(LRScheduler):
    """The factor of ``base_lr`` moves linearly from ``start_factor`` to ``end_factor``
    over ``total_iters`` steps and stays there: ``lr = base_lr·(start + (end −
    start)·min(step, total_iters)/total_iters)``, as ``torch.optim.lr_scheduler.LinearLR``
    (same defaults). A linear warm-up is ``LinearLR(opt, start_factor=0.01,
    total_iters=warmup)``."""

    def __init__(self, opt: Optimizer, start_factor: float = 1.0 / 3, end_factor: float = 1.0,
                 total_iters: int = 5) -> None:
        self.start_factor = _finite("LinearLR", "start_factor", start_factor, lo=0.0, hi=1.0, low_open=True)
        self.end_factor = _finite("LinearLR", "end_factor", end_factor, lo=0.0, hi=1.0)
        self.total_iters = _count("LinearLR", "total_iters", total_iters)
        super().__init__(opt)

    def lr_at(self, step: int) -> float:
        done = min(step, self.total_iters) / self.total_iters
        return self.base_lr * (self.start_factor + (self.end_factor - self.start_factor) * done)


class CosineAnnealingLR(LRScheduler):
    """A half cosine from ``base_lr`` down to ``eta_min`` at step ``T_max``, then
    ``eta_min``, after an optional linear warm-up of ``warmup`` steps:

        step < warmup:          lr = base_lr·(step + 1)/warmup
        warmup ≤ step ≤ T_max:  lr = eta_min + (base_lr − eta_min)·(1 + cos(π·d))/2,
                                d = (step − warmup)/(T_max − warmup)
        step > T_max:           lr = eta_min

    With ``warmup=0`` this is the closed form of ``torch.optim.lr_scheduler.CosineAnnealingLR``
    up to ``T_max``; PyTorch's rate rises again after ``T_max``, this one stays at ``eta_min``.
    """

    def __init__(self, opt: Optimizer, T_max: int, eta_min: float = 0.0, warmup: int = 0) -> None:  # noqa: N803
        self.T_max = _count("CosineAnnealingLR", "T_max", T_max)
        self.warmup = _count("CosineAnnealingLR", "warmup", warmup, minimum=0)
        if self.warmup >= self.T_max:
            raise _errors.ArgumentError(f"CosineAnnealingLR: warmup {warmup} must be less than T_max {T_max}")
        self.eta_min = _finite("CosineAnnealingLR", "eta_min", eta_min, lo=0.0)
        super().__init__(opt)

    def lr_at(self, step: int) -> float:
        if step < self.warmup:
            return self.base_lr * (step + 1) / self.warmup
        done = min(step - self.warmup, self.T_max - self.warmup) / (self.T_max - self.warmup)
        return self.eta_min + (self.base_lr - self.eta_min) * 0.5 * (1.0 + math.cos(math.pi * done))
