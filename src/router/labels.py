"""Weak router labels: what the ground truth's tool calls say the route should be."""

from __future__ import annotations

from collections.abc import Mapping

from src.router.families import CALCULATE, SEARCH, ToolFamilies
from src.router.routes import WeakLabel
from src.router.usage import tool_usage


def weak_label(
    ground_truth: str,
    families: ToolFamilies,
    fmt: str = "xml",
    descriptions: Mapping[str, str] | None = None,
) -> str:
    """Weak router label of an example from its ground-truth tool calls.

    No call -> "ANSWER"; every call a search tool -> "SEARCH"; every call a calculate tool ->
    "CALCULATE"; anything else (both families, any "other" tool, or a call whose JSON cannot be
    read so its family is unknown) -> "MIXED". ``descriptions`` (tool name -> description, e.g.
    from ``tool_descriptions(system prompt)``) sharpens the heuristic for unlabelled names.
    ``fmt`` is "xml" (``rlla``) or "harmony" (``rlla_gpt``).
    """
    usage = tool_usage(ground_truth, families, fmt=fmt, descriptions=descriptions)
    if usage.n_calls == 0 and not usage.used_any_tool:
        return WeakLabel.ANSWER.value
    per = usage.calls_per_family
    if usage.n_calls > 0 and per.get(SEARCH, 0) == usage.n_calls:
        return WeakLabel.SEARCH.value
    if usage.n_calls > 0 and per.get(CALCULATE, 0) == usage.n_calls:
        return WeakLabel.CALCULATE.value
    return WeakLabel.MIXED.value
