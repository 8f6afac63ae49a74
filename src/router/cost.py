"""Tool cost of one trajectory, the quantity the router's budget constrains.

Each cost is a pure function of a :class:`ToolUsage` and scalar weights, registered by name:

    any_tool    c_tool · [a tool-call block is present]
    per_family  c_search · used_search + c_calculate · used_calculate + c_other · used_other
    per_call    min(c_call · n_calls, cap)   (no cap when cap is None)

``used_other`` includes calls whose JSON could not be read (see ``tool_usage``), so failed
attempts are charged as "other" tools. ``make_cost_fn("per_family", c_search=1, c_other=0.5)``
binds the weights and checks their names.
"""

from __future__ import annotations

import functools
import inspect
import math
import numbers
from collections.abc import Callable, Iterable

from src.router.usage import ToolUsage

__all__ = [
    "COST_FUNCTIONS",
    "any_tool",
    "batch_cost",
    "make_cost_fn",
    "max_cost",
    "per_call",
    "per_family",
    "register_cost",
]

CostFn = Callable[[ToolUsage], float]
COST_FUNCTIONS: dict[str, Callable[..., float]] = {}


def register_cost(name: str) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Decorator adding a cost function ``fn(usage, **weights) -> float`` under ``name``."""

    def add(fn: Callable[..., float]) -> Callable[..., float]:
        if name in COST_FUNCTIONS:
            raise ValueError(f"cost function {name!r} is already registered")
        COST_FUNCTIONS[name] = fn
        return fn

    return add


@register_cost("any_tool")
def any_tool(usage: ToolUsage, c_tool: float = 1.0) -> float:
    """c_tool when the response holds any tool-call block, else 0."""
    return float(c_tool) if usage.used_any_tool else 0.0


@register_cost("per_family")
def per_family(
    usage: ToolUsage, c_search: float = 1.0, c_calculate: float = 1.0, c_other: float = 1.0
) -> float:
    """Weighted sum of the families used (each family counted once, however many calls)."""
    return (
        c_search * float(usage.used_search)
        + c_calculate * float(usage.used_calculate)
        + c_other * float(usage.used_other)
    )


@register_cost("per_call")
def per_call(usage: ToolUsage, c_call: float = 1.0, cap: float | None = None) -> float:
    """c_call per call, clipped at ``cap`` when given."""
    cost = c_call * usage.n_calls
    return float(cost if cap is None else min(cost, cap))


def make_cost_fn(name: str, **weights: float) -> CostFn:
    """The registered cost ``name`` with its weights bound: ``usage -> float``.

    Raises ValueError for an unknown name, an unknown weight, or a non-finite weight.
    """
    if name not in COST_FUNCTIONS:
        raise ValueError(f"unknown tool cost {name!r}; registered: {sorted(COST_FUNCTIONS)}")
    fn = COST_FUNCTIONS[name]
    params = {k: p for k, p in inspect.signature(fn).parameters.items() if k != "usage"}
    for key, value in weights.items():
        if key not in params:
            raise ValueError(f"tool cost {name!r} has no weight {key!r}; its weights: {list(params)}")
        if value is None and params[key].default is None:
            continue  # an optional weight such as per_call's cap
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"tool cost {name!r}: weight {key}={value!r} is not a finite number")
    return functools.partial(fn, **weights)


def max_cost(name: str, weights: dict[str, float]) -> float:
    """The largest cost one rollout can have: the bound cost of a response that uses every family
    and makes unboundedly many calls (inf when nothing caps it). ValueError as ``make_cost_fn``."""
    worst = ToolUsage(True, True, True, True, n_calls=math.inf)
    top = make_cost_fn(name, **weights)(worst)
    return 0.0 if math.isnan(top) else float(top)  # a zero per-call weight: 0 · inf


def batch_cost(usages: Iterable[ToolUsage], cost_fn: CostFn) -> list[float]:
    """One cost per trajectory, in order."""
    return [cost_fn(usage) for usage in usages]
