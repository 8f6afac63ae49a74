"""How a router run holds its budget, from its own files (rollout log, TensorBoard, validation route
tables): the figures ``docs/router_demo.md``'s comparison tables report for each run.

- Ê[cost] over the last 50 steps; over the last 100 the mean cost and its four 25-step windows;
- the settling step: the first step after which every 25-step (rolling) cost window stays within
  B ± ``band`` (None: the last window is outside);
- λ over the last 100 steps: range and coefficient of variation (std / mean);
- the router alone on the held-out split at the last validation (answer / family accuracy,
  per-family recall, tool rate), and the task reward of the last 50 steps;
- the verdicts the router demo is held to (``SETTLED``).

The per-step cost's sd is mostly how many tool-labelled prompts a batch happens to draw, so a 25-step
window carries about ±0.03 of noise: the bands sit near 3σ of it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from src.analysis import held_out_routing, load_manifest, load_rollouts, load_scalars

# the bounds a settled run meets over its last 100 steps: |mean cost − B|, every 25-step window's
# |cost − B|, and λ's coefficient of variation
SETTLED = {"mean_cost_band": 0.04, "window_band": 0.10, "lambda_cv": 0.2}
LAST, WINDOW = 100, 25


def settling_step(
    cost_by_step: pd.Series, budget: float, window: int = WINDOW, band: float = 0.10
) -> int | None:
    """cost_by_step: mean cost indexed by step (sorted). The first step s such that every rolling
    ``window``-step mean starting at s or later is within budget ± band; None when the last one is not."""
    rolling = cost_by_step.rolling(window).mean().dropna()  # indexed by each window's last step
    if rolling.empty or abs(rolling.iloc[-1] - budget) > band:
        return None
    steps = list(cost_by_step.index)
    outside = [i for i, v in enumerate(rolling.to_numpy()) if abs(v - budget) > band]
    return int(steps[0] if not outside else steps[outside[-1] + 1])  # the window after the last miss


def settling_figures(cost: pd.Series, lam: pd.Series, budget: float) -> dict[str, Any]:
    """cost: mean cost per step, lam: λ per step (both indexed by step, sorted). The last-100-step
    figures (mean cost, its 25-step windows, λ's range and coefficient of variation), the settling
    step, and ``settled``: all three ``SETTLED`` bounds met."""
    last = cost.iloc[-LAST:]
    windows = [float(last.iloc[i : i + WINDOW].mean()) for i in range(0, len(last) - WINDOW + 1, WINDOW)]
    lam = lam.iloc[-LAST:]
    lam_mean, lam_std = float(lam.mean()), float(lam.std(ddof=0))
    figures: dict[str, Any] = {
        "cost_last100": float(last.mean()),
        "cost_windows": windows,
        "settling_step": settling_step(cost, budget),
        "lambda_min": float(lam.min()),
        "lambda_max": float(lam.max()),
        "lambda_cv": lam_std / lam_mean if lam_mean > 0 else math.inf,
    }
    figures["settled"] = (
        abs(figures["cost_last100"] - budget) <= SETTLED["mean_cost_band"]
        and all(abs(w - budget) <= SETTLED["window_band"] for w in windows)
        and figures["lambda_cv"] <= SETTLED["lambda_cv"]
    )
    return figures


def budget_report(run_dir: str | Path, budget: float | None = None) -> dict[str, Any]:
    """The figures above for one run (``budget``: default the run's ``router.budget``)."""
    run_dir = Path(run_dir)
    config = load_manifest(run_dir).get("config", {})
    router = config.get("router", {})
    budget = float(router["budget"] if budget is None else budget)
    rollouts = load_rollouts(run_dir)
    cost = rollouts.groupby("step")["cost"].mean().sort_index()
    lam = load_scalars(run_dir)["train/lambda"].dropna().sort_index()
    settling = settling_figures(cost, lam, budget)
    steps = sorted(rollouts["step"].unique())
    last50 = rollouts[rollouts["step"].isin(steps[-50:])]
    report: dict[str, Any] = {
        "run": str(run_dir),
        "seed": config.get("seed"),
        "budget": budget,
        "advantage": router.get("advantage", "scalarized_reward"),
        "controller": router.get("lambda_update"),
        "steps": len(steps),
        "cost_last50": float(last50["cost"].mean()),
        **{k: v for k, v in settling.items() if k != "settled"},
        "reward_task_last50": float(last50["reward_task"].mean()),
    }
    routing = held_out_routing(run_dir)
    if not routing.empty:
        row = routing.iloc[-1]
        keys = ("route_acc_answer", "route_acc_family", "recall_search", "recall_calculate", "tool_rate")
        report.update({f"held_out_{k}": _float(row.get(k)) for k in keys})
    report["settled"] = settling["settled"]
    return report


def _float(value) -> float | None:
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else float(value)


COLUMNS = {
    "seed": "seed",
    "budget": "B",
    "advantage": "advantage",
    "controller": "λ ctrl",
    "cost_last50": "Ê[cost] last 50",
    "cost_last100": "last 100",
    "cost_windows": "25-step windows",
    "settling_step": "settles at",
    "lambda_min": "λ min",
    "lambda_max": "λ max",
    "lambda_cv": "λ CV",
    "held_out_route_acc_answer": "held-out acc answer",
    "held_out_route_acc_family": "family",
    "held_out_recall_search": "recall search",
    "held_out_recall_calculate": "recall calc",
    "reward_task_last50": "task reward last 50",
    "settled": "settled",
}


def markdown_table(reports: list[dict[str, Any]]) -> str:
    """One row per run, the columns of ``COLUMNS``."""

    def cell(value) -> str:
        if isinstance(value, bool) or value is None:
            return {True: "yes", False: "no", None: "–"}[value]
        if isinstance(value, float):
            return f"{value:.3f}"
        if isinstance(value, list):
            return " / ".join(f"{v:.2f}" for v in value)
        return str(value)

    lines = ["| " + " | ".join(COLUMNS.values()) + " |", "|" + "---|" * len(COLUMNS)]
    lines += ["| " + " | ".join(cell(r.get(k)) for k in COLUMNS) + " |" for r in reports]
    return "\n".join(lines)
