"""notebooks/routing_analysis.ipynb executed headless on a real router run; src.analysis tables."""

from __future__ import annotations

import random

import pandas as pd
import pytest
from jobhelpers import REPO

NOTEBOOK = REPO / "notebooks" / "routing_analysis.ipynb"
FIGURES = {
    "route_mix",
    "lambda_cost",
    "reward_by_route",
    "route_vs_weak_label",
    "route_accuracy",
    "frontier",
    "sweep_confusion",
}


def _fake_sweep(out, budgets=(0.2, 0.5), n=24, seed=0):
    """An evaluated sweep as scripts/evaluate.py --sweep writes it, from random route tables."""
    from src.frontier import frontier_points

    rng = random.Random(seed)
    points = []
    for budget in budgets:
        table = _random_route_table(rng, n)
        table.to_csv(out / f"route_table_B{budget:g}.csv", index=False)
        for routing_budget in (None, budget):  # argmax rows, then the routes under B
            frontier = frontier_points(table, n_boot=50, budget=routing_budget)
            frontier.insert(0, "budget", budget)
            points.append(frontier)
    pd.concat(points).to_csv(out / "sweep_frontier.csv", index=False)
    return out


def _random_route_table(rng, n):
    routes = ("answer", "search", "calculate")
    weights = [[rng.uniform(0.1, 1.0) for _ in routes] for _ in range(n)]  # the router's probabilities
    return pd.DataFrame(
        {
            "uid": range(n),
            "weak_label": [rng.choice(["ANSWER", "SEARCH", "CALCULATE"]) for _ in range(n)],
            "learned_route": [rng.choice(routes) for _ in range(n)],
            **{f"reward_{r}": [rng.uniform(-3, 4) for _ in range(n)] for r in routes},
            **{f"cost_{r}": [float(r != "answer") for _ in range(n)] for r in routes},
            **{f"p_{r}": [w[i] / sum(w) for w in weights] for i, r in enumerate(routes)},
        }
    )


def test_notebook_runs_headless_and_draws_every_figure(router_run, tmp_path):
    import nbformat
    from nbclient import NotebookClient

    nb = nbformat.read(NOTEBOOK, as_version=4)
    assert "RUN_DIR" in nb.cells[0].source and "parameters" in nb.cells[0].metadata.get("tags", [])
    figures = tmp_path / "figures"
    sweep = _fake_sweep(tmp_path)
    nb.cells[
        0
    ].source = f"RUN_DIR = {str(router_run)!r}\nSAVE_DIR = {str(figures)!r}\nSWEEP_DIR = {str(sweep)!r}"
    NotebookClient(
        nb, timeout=240, kernel_name="python3", resources={"metadata": {"path": str(NOTEBOOK.parent)}}
    ).execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("image/png" in o.get("data", {}) for o in outputs) == len(FIGURES)
    assert {p.stem for p in figures.glob("*.png")} == FIGURES
    assert all(p.stat().st_size > 5000 for p in figures.glob("*.png"))
    text = "".join(o.get("text", "") for o in outputs if o.output_type == "stream")
    assert f"run: {router_run}" in text and "budget B: 0.3" in text
    # every rollout of the run got a weak label through the join with its training data
    n_rollouts = len(pd.concat([pd.read_parquet(p) for p in (router_run / "rollouts").glob("*.parquet")]))
    assert f"rollouts with a weak label: {n_rollouts}" in text


def test_run_artifacts_load_as_tables(router_run):
    from src import analysis as an

    rollouts = an.load_rollouts(router_run)
    scalars = an.load_scalars(router_run)
    assert sorted(rollouts["step"].unique()) == list(range(6)) and len(rollouts) == 6 * 2 * 4
    for tag in ("train/lambda", "train/cost_mean", "train/route_frac_answer"):
        assert tag in scalars.columns
    mix = an.route_mix_by_step(rollouts)
    assert list(mix.columns) == ["answer", "search", "calculate"]
    assert ((mix.sum(axis=1) - 1).abs() < 1e-9).all()
    # the logged route fractions agree with the rollout log
    for route in mix.columns:
        assert mix[route].to_numpy() == pytest.approx(
            scalars.loc[mix.index, f"train/route_frac_{route}"].to_numpy(), abs=1e-6
        )
    labels = an.weak_labels_for_run(an.load_manifest(router_run))
    assert set(rollouts["uid"]) <= set(labels)


def _random_rollouts(seed: int, n: int = 60) -> pd.DataFrame:
    rng = random.Random(seed)
    return pd.DataFrame(
        {
            "step": [rng.randint(0, 4) for _ in range(n)],
            "uid": [rng.randint(0, 9) for _ in range(n)],
            "route": [rng.choice(["answer", "search", "calculate"]) for _ in range(n)],
            "reward_task": [rng.uniform(-3, 4) for _ in range(n)],
            "weak_label": [rng.choice(["ANSWER", "SEARCH", "CALCULATE", "MIXED", None]) for _ in range(n)],
        }
    )


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_confusion_and_accuracy_match_a_plain_loop(seed):
    from src import analysis as an

    df = _random_rollouts(seed)
    table = an.confusion_table(df)
    counts = {}
    for label, route in zip(df["weak_label"], df["route"]):
        if not pd.isna(label):
            counts[(label, route)] = counts.get((label, route), 0) + 1
    for label in an.WEAK_LABELS:
        for route in an.ROUTES:
            assert table.loc[label, route] == counts.get((label, route), 0)
    pairs = [(lab, r) for lab, r in zip(df["weak_label"], df["route"]) if not pd.isna(lab) and lab != "MIXED"]
    accuracy, n = an.route_accuracy(table)
    assert n == len(pairs) and accuracy == pytest.approx(
        sum(lab.lower() == r for lab, r in pairs) / len(pairs)
    )


def test_weak_label_join_keeps_logged_labels_and_fills_missing_ones():
    from src import analysis as an

    df = pd.DataFrame({"uid": [1, 2, 3], "route": ["answer"] * 3, "weak_label": ["SEARCH", None, None]})
    out = an.with_weak_labels(df, {1: "ANSWER", 2: "CALCULATE"})
    assert out["weak_label"].tolist() == ["SEARCH", "CALCULATE", None]
    assert df["weak_label"].isna().tolist() == [False, True, True]  # input untouched
    assert an.route_accuracy(an.confusion_table(pd.DataFrame()))[0] is None
    assert an.weak_labels_for_run({}) == {}
    summary = an.evaluation_summary(pd.DataFrame())
    assert summary["n"] == 0 and summary["route_mix"] is None


def test_default_run_dir_is_the_newest_run_above_the_working_dir(tmp_path):
    from src import analysis as an

    runs = tmp_path / "outputs" / "router_grpo"
    for stamp, sub in [
        ("2026-01-01_00-00-00", "rollouts"),
        ("2026-02-01_00-00-00", "checkpoints"),
        ("2026-03-01_00-00-00", "notes"),
    ]:  # the last is not a run: no rollouts/checkpoints
        (runs / stamp / sub).mkdir(parents=True)
    (tmp_path / "notebooks").mkdir()
    assert an.default_run_dir(tmp_path / "notebooks") == runs / "2026-02-01_00-00-00"
    assert an.default_run_dir(tmp_path / "notebooks", experiment="grpo") is None
