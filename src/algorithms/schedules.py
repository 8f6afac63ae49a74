"""Coefficient schedules, pure functions of the optimizer step."""

from __future__ import annotations


def linear_decay(step: int, start: float, end: float | None, decay_steps: int) -> float:
    """``start`` at step 0, straight down (or up) to ``end`` at ``decay_steps``, then ``end``.

    ``end=None`` or ``decay_steps<=0`` keeps ``start`` for the whole run.
    Args: step: optimizer steps taken (>= 0).
    """
    if end is None or decay_steps <= 0:
        return start
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + (end - start) * frac


def ema_warmup_decay(updates: int, decay: float) -> float:
    """An exponential moving average's decay at its ``updates``-th update (0-based):
    min(decay, (1 + t) / (10 + t)), so the first updates follow the averaged weights closely and the
    average is not held at their initial values.
    Args: updates: updates made so far (>= 0); decay: the final decay in [0, 1).
    """
    return min(float(decay), (1 + updates) / (10 + updates))
