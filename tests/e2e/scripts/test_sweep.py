"""Budget sweep plumbing on tiny settings: Hydra multirun over router.budget, then
scripts/evaluate.py --sweep writes the per-budget frontier table, route tables and the figure."""

from __future__ import annotations

import subprocess
import sys

import pandas as pd
from jobhelpers import CACHE, REPO

TINY = [
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=8",
    "trainer.max_steps=2",
    "trainer.save_freq=2",
]


def test_sweep_trains_one_run_per_budget_and_evaluates_a_frontier(tmp_path):
    sweep = tmp_path / "sweep"
    train = subprocess.run(
        [
            sys.executable,
            "scripts/train.py",
            "-m",
            "experiment=router_sweep",
            "router.budget=0.2,0.6",
            f"cache_dir={CACHE}",
            f"hydra.sweep.dir={sweep}",
            *TINY,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    runs = sorted(p.name for p in sweep.glob("budget_*") if (p / "checkpoints" / "last.ckpt").is_file())
    assert runs == ["budget_0.2", "budget_0.6"]
    ev = subprocess.run(
        [
            sys.executable,
            "scripts/evaluate.py",
            "--sweep",
            str(sweep),
            "--limit",
            "4",
            "--max-new-tokens",
            "8",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert ev.returncode == 0, ev.stderr[-4000:]
    table = pd.read_csv(sweep / "sweep_frontier.csv")
    assert sorted(table["budget"].unique()) == [0.2, 0.6]
    assert set(table["policy"]) == {
        "learned",
        "matched_random",
        "always_answer",
        "always_tool",
        "oracle",
        "best",
        "readable",
    }
    assert "gain_share" in table.columns and "readable_share" in table.columns
    assert (table["n_prompts"] == 4).all()
    # each budget twice: the router's argmax routes, and its routes under B (floor(B·4) tool prompts)
    assert table.groupby(["budget", "routing"]).size().to_dict() == {
        (b, r): 7 for b in (0.2, 0.6) for r in ("argmax", "budget")
    }
    under = table[table["routing"] == "budget"].groupby("budget")["learned_tool_rate"].first()
    assert under.to_dict() == {0.2: 0.0, 0.6: 0.5}
    assert (sweep / "frontier.png").stat().st_size > 5000
    for budget in ("0.2", "0.6"):
        route_table = pd.read_csv(sweep / f"route_table_B{budget}.csv")
        assert len(route_table) == 4 and route_table["weak_label"].notna().all()
        assert set(route_table["request_class"]) <= {"exact", "vague", "answer"}
    assert "| 0.2 | argmax | learned |" in ev.stdout and "| 0.6 | budget | learned |" in ev.stdout
