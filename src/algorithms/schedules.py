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
