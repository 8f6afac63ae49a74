"""The few lines a run's log ends with, from the run's own files (``src.analysis.run_summary``)."""

from __future__ import annotations

import pandas as pd

from src.analysis import run_summary


def _write_steps(run_dir, rows_of_step) -> None:
    (run_dir / "rollouts").mkdir(parents=True)
    for step in range(4):
        pd.DataFrame(rows_of_step(step)).to_parquet(run_dir / "rollouts" / f"step_{step:08d}.parquet")


def test_router_run_summary_reads_cost_against_the_budget_and_the_held_out_routes(tmp_path):
    def rows(step):
        return [
            {"step": step, "reward_task": float(step), "cost": 0.5, "route": "search", "weak_label": "SEARCH",
             "reward_format": 1.0},
            {"step": step, "reward_task": float(step), "cost": 0.0, "route": "answer", "weak_label": "ANSWER",
             "reward_format": 0.0},
        ]

    _write_steps(tmp_path, rows)
    (tmp_path / "rollouts" / "val").mkdir()
    routes = pd.DataFrame(
        {"weak_label": ["ANSWER", "SEARCH"], "p_answer": [0.9, 0.1], "p_search": [0.05, 0.8], "p_calculate": [0.05, 0.1]}
    )
    routes.to_parquet(tmp_path / "rollouts" / "val" / "routes_00000004.parquet")
    lines = run_summary(tmp_path, 0.3, "python scripts/train.py resume=true", n_steps=2)
    text = "\n".join(lines)
    assert f"run dir: {tmp_path}" in lines[0]
    assert "task reward 2.500 (first 2: 0.500)" in text  # steps 2-3 against steps 0-1
    assert "Ê[cost] 0.250 vs B 0.300" in text and "route accuracy answer 1.000, family 1.000" in text
    assert "held-out routing at step 4" in text and "tool_rate 0.500" in text
    assert lines[-1].endswith("python scripts/train.py resume=true")


def test_plain_run_summary_has_no_router_lines(tmp_path):
    _write_steps(tmp_path, lambda step: [{"step": step, "reward_task": 1.0}])
    text = "\n".join(run_summary(tmp_path, None, "cmd", n_steps=2))
    assert "task reward 1.000" in text and "Ê[cost]" not in text and "held-out" not in text


def test_router_run_summary_reports_the_budget_held_on_prompts_the_threshold_never_saw(tmp_path):
    """A routes table with ``route_budgeted`` (a calibration split was set): the realised tool rate."""
    _write_steps(tmp_path, lambda step: [{"step": step, "reward_task": 0.0, "cost": 0.0, "route": "answer",
                                          "weak_label": "ANSWER", "reward_format": 1.0}])  # fmt: skip
    (tmp_path / "rollouts" / "val").mkdir()
    routes = pd.DataFrame(
        {"weak_label": ["ANSWER"] * 4, "p_answer": [0.9] * 4, "p_search": [0.05] * 4, "p_calculate": [0.05] * 4,
         "route_budgeted": ["answer", "search", "answer", "answer"]}  # fmt: skip
    )
    routes.to_parquet(tmp_path / "rollouts" / "val" / "routes_00000004.parquet")
    text = "\n".join(run_summary(tmp_path, 0.3, "resume", n_steps=2))
    assert "held-out tool rate under B 0.300, threshold calibrated on the calibration split: 0.250 (4 prompts)" in text
