"""The router demo's recomputations: per-label recall in last_steps_check, reward per request class."""

from __future__ import annotations

import pandas as pd
import pytest

from src.analysis import last_steps_check, reward_by_request_class
from src.datamodules.synthetic import SyntheticOptions, write_synthetic_rlla
from src.datamodules.synthetic_text import request_class


def test_last_steps_check_reports_per_label_recall_beside_family_accuracy():
    rows = [
        {"step": s, "weak_label": lab, "route": route, "cost": float(route != "answer"),
         "reward_format": 1.0, "reward_task": 0.0}
        for s in range(4)
        for lab, route in (("SEARCH", "search"), ("SEARCH", "answer"), ("ANSWER", "answer"), ("CALCULATE", "search"))
    ]  # fmt: skip
    out = last_steps_check(pd.DataFrame(rows), budget=0.5, n_steps=2)
    assert out["route_acc_family"] == pytest.approx(0.5)  # answer-routed SEARCH rows do not count
    assert out["recall_search"] == pytest.approx(0.5) and out["recall_calculate"] == 0.0
    assert out["recall_answer"] == 1.0 and out["cost_mean"] == 0.5


def test_reward_by_request_class_reads_each_uid_class_from_the_files(tmp_path):
    paths = write_synthetic_rlla(
        tmp_path,
        60,
        20,
        seed=1,
        options=SyntheticOptions(p_search=0.3, p_calculate=0.3, p_answer=0.4, low_gain=0.5),
    )
    train = pd.read_parquet(paths["train"])
    uids = [int(e["index"]) for e in train["extra_info"]]
    want = {}
    for e, gt in zip(train["extra_info"], train["reward_model"]):
        tool = "<tool_call>" in gt["ground_truth"]
        want[int(e["index"])] = (
            ("vague" if request_class(e["input"]) == "vague" else "exact") if tool else "answer"
        )
    rollouts = pd.DataFrame(
        {
            "uid": uids,
            "route": ["search"] * 60,
            "reward_task": [float(u % 7) for u in uids],
            "used_tool": [True] * 60,
        }
    )
    table = reward_by_request_class(rollouts, [paths["train"], paths["test"]]).set_index("request_class")
    for cls in ("answer", "exact", "vague"):
        mine = [float(u % 7) for u in uids if want[u] == cls]
        assert table.loc[cls, "n"] == len(mine) > 0
        assert table.loc[cls, "reward_task"] == pytest.approx(sum(mine) / len(mine))
    with pytest.raises(ValueError, match="uids"):
        reward_by_request_class(rollouts.assign(uid=10_000), [paths["train"]])
