"""How a step's metric shares combine over micro-batches and minibatches: a ``*_max`` metric keeps
the largest share, every other metric adds its (weighted) shares."""

from __future__ import annotations


def add_stat(stats: dict[str, float], key: str, value: float, weight: float = 1.0) -> None:
    """Fold one share of ``key`` into ``stats`` in place (max for ``*_max`` keys, else weighted sum)."""
    if key.endswith("_max"):
        stats[key] = max(stats.get(key, float("-inf")), float(value))
    else:
        stats[key] = stats.get(key, 0.0) + float(value) * weight
