"""How a run holds its budget (``src.budget_report``), against plain loops over a run written here."""

from __future__ import annotations

import random

import pandas as pd
import pytest
import yaml

from src.budget_report import budget_report, markdown_table, settling_step


def _reference_settling(costs: list[float], budget: float, window: int, band: float):
    """The first s such that every window [t, t + window) with t >= s is within budget ± band."""
    starts = range(len(costs) - window + 1)
    inside = [abs(sum(costs[t : t + window]) / window - budget) <= band for t in starts]
    if not inside or not inside[-1]:
        return None
    for s in range(len(costs)):
        if all(inside[t] for t in starts if t >= s):
            return s
    return None


@pytest.mark.parametrize("seed", range(20))
def test_settling_step_equals_a_plain_loop(seed):
    rng = random.Random(seed)
    n = rng.randint(30, 120)
    drift = rng.uniform(0.0, 0.6)  # from far off the budget toward it, with noise
    costs = [0.3 + drift * max(0.0, 1 - i / (n * 0.6)) + rng.uniform(-0.15, 0.15) for i in range(n)]
    series = pd.Series(costs, index=range(n))
    assert settling_step(series, 0.3, 10, 0.1) == _reference_settling(costs, 0.3, 10, 0.1)


def test_settling_step_of_a_shifted_index_is_a_step_not_a_position():
    series = pd.Series([1.0] * 5 + [0.3] * 10, index=range(100, 115))
    assert settling_step(series, 0.3, 5, 0.1) == 105
    assert settling_step(pd.Series([0.3] * 10 + [1.0] * 5), 0.3, 5, 0.1) is None


def _write_run(run_dir, costs: list[float], lambdas: list[float], budget: float) -> None:
    from torch.utils.tensorboard import SummaryWriter

    (run_dir / "rollouts").mkdir(parents=True)
    for step, cost in enumerate(costs):
        rows = [{"step": step, "cost": cost, "reward_task": -cost}] * 2
        pd.DataFrame(rows).to_parquet(run_dir / "rollouts" / f"step_{step:08d}.parquet")
    writer = SummaryWriter(str(run_dir / "tensorboard"))
    for step, lam in enumerate(lambdas):
        writer.add_scalar("train/lambda", lam, step)
    writer.close()
    (run_dir / "checkpoints").mkdir()
    manifest = {"config": {"seed": 3, "router": {"budget": budget, "lambda_update": "pid"}}}
    (run_dir / "checkpoints" / "manifest.yaml").write_text(yaml.safe_dump(manifest))


def test_budget_report_recomputes_the_windows_lambda_and_verdict(tmp_path):
    rng = random.Random(0)
    costs = [0.8] * 50 + [0.3 + rng.uniform(-0.05, 0.05) for _ in range(150)]
    lambdas = [1.0 + 0.1 * rng.uniform(-1, 1) for _ in range(200)]
    _write_run(tmp_path, costs, lambdas, 0.3)
    report = budget_report(tmp_path)
    last = costs[-100:]
    assert report["budget"] == 0.3 and report["seed"] == 3 and report["steps"] == 200
    assert report["cost_last50"] == pytest.approx(sum(costs[-50:]) / 50)
    assert report["cost_last100"] == pytest.approx(sum(last) / 100)
    assert report["cost_windows"] == pytest.approx([sum(last[i : i + 25]) / 25 for i in range(0, 100, 25)])
    lam = pd.Series(lambdas[-100:])
    assert report["lambda_cv"] == pytest.approx(lam.std(ddof=0) / lam.mean(), rel=1e-5)
    assert report["lambda_min"] == pytest.approx(min(lambdas[-100:]), rel=1e-6)
    assert report["settling_step"] == _reference_settling(costs, 0.3, 25, 0.1)
    assert report["settled"] is True
    assert "| 3 | 0.300 |" in markdown_table([report])


def test_a_swinging_lambda_is_not_settled(tmp_path):
    _write_run(tmp_path, [0.3] * 120, [0.5, 3.0] * 60, 0.3)
    report = budget_report(tmp_path)
    assert report["lambda_cv"] > 0.2 and report["settled"] is False
