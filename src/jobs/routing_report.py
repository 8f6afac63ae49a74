"""The router of a trained run on an RLLA parquet, without generating: probabilities, weak labels,
the metrics of ``src.router.routing_eval`` (greedy and sampled), and routing under a budget with a
threshold calibrated on held-out prompts. Used by ``scripts/evaluate.py --routing`` and
``scripts/infer.py --budget``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from src.router.routing_eval import (
    ROUTES,
    answer_vs_tool_auc,
    budget_route_probs,
    budget_routes,
    calibrate_tool_threshold,
    route_shares,
    routing_metrics,
)

__all__ = ["budget_threshold", "records_labels", "records_probs", "routing_report", "shares_markdown"]


def records_probs(policy, records: Sequence[Any], batch_size: int = 32) -> torch.Tensor:
    """Router probabilities [N, 3] of the records' original prompts, ``batch_size`` at a time."""
    chunks = [
        policy.route_probs([r.messages for r in records[i : i + batch_size]])
        for i in range(0, len(records), batch_size)
    ]
    return torch.cat(chunks).cpu() if chunks else torch.zeros(0, 3)


def records_labels(policy, records: Sequence[Any]) -> list[str]:
    """Weak label of each record from its ground truth and its prompt's tool descriptions."""
    from src.formats.tools_block import tool_descriptions
    from src.router.routes import weak_label

    out = []
    for r in records:
        fmt = "harmony" if r.data_source == "rlla_gpt" else "xml"
        system = r.messages[0]["content"] if r.messages and r.messages[0]["role"] == "system" else ""
        out.append(str(weak_label(r.ground_truth, policy.families, fmt, tool_descriptions(system))))
    return out


def budget_threshold(probs: torch.Tensor, budget: float) -> dict[str, float]:
    """{"budget", "threshold", "tool_rate"}: the calibrated threshold and the rate it realises on
    the prompts it was calibrated on."""
    threshold = calibrate_tool_threshold(probs, budget)
    rate = float((budget_routes(probs, threshold) != 0).double().mean())
    return {"budget": budget, "threshold": threshold, "tool_rate": rate}


def routing_report(
    probs: torch.Tensor, labels: Sequence[str], threshold: float | None = None
) -> dict[str, Any]:
    """Greedy and sampled metrics, route shares per label, the AUC; with ``threshold`` also the
    budgeted routing's metrics and shares (its routes are one-hot, read greedily)."""
    report: dict[str, Any] = {
        "n": len(labels),
        "auc_answer_vs_tool": answer_vs_tool_auc(probs, labels),
        "greedy": routing_metrics(probs, labels, greedy=True),
        "sampled": routing_metrics(probs, labels, greedy=False),
        "shares_greedy": route_shares(probs, labels, greedy=True),
        "shares_sampled": route_shares(probs, labels, greedy=False),
    }
    if threshold is not None:
        routed = budget_route_probs(probs, threshold)
        report["budgeted"] = routing_metrics(routed, labels, greedy=True)
        report["shares_budgeted"] = route_shares(routed, labels, greedy=True)
    return report


def shares_markdown(shares: dict[str, dict[str, float]], title: str) -> str:
    """A markdown table: one row per weak label (its count), one column per route (share)."""
    lines = [f"| {title} | n | " + " | ".join(ROUTES) + " |", "|---" * (len(ROUTES) + 2) + "|"]
    for label, row in shares.items():
        cells = " | ".join(f"{row[r]:.3f}" for r in ROUTES)
        lines.append(f"| {label} | {row['n']} | {cells} |")
    return "\n".join(lines)
