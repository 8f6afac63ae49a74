"""Route-accuracy scalars and the confusion table against a plain reference on random rollouts."""

from __future__ import annotations

import math
import random

import pytest

from src.rollout.metrics import confusion_markdown, rollout_metrics, route_accuracy, route_confusion

LABELS = ("ANSWER", "SEARCH", "CALCULATE", "MIXED")
ROUTES = ("answer", "search", "calculate")


def _reference(labels, routes):
    answer_rows = [r for lab, r in zip(labels, routes) if lab == "ANSWER"]
    acc_answer = sum(r == "answer" for r in answer_rows) / len(answer_rows) if answer_rows else None
    tool_rows = [(lab, r) for lab, r in zip(labels, routes) if r != "answer"]
    acc_family = sum(lab == r.upper() for lab, r in tool_rows) / len(tool_rows) if tool_rows else None
    return acc_answer, acc_family


@pytest.mark.parametrize("seed", range(20))
def test_route_accuracy_matches_plain_reference(seed):
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    labels = [rng.choice(LABELS) for _ in range(n)]
    routes = [rng.choice(ROUTES) for _ in range(n)]
    got, want = route_accuracy(labels, routes), _reference(labels, routes)
    for g, w in zip(got, want):
        assert (g is None and w is None) or g == pytest.approx(w)
    table = route_confusion(labels, routes)
    assert sum(sum(row.values()) for row in table.values()) == n
    for label in LABELS:
        for route in ROUTES:
            assert table[label][route] == sum(1 for a, b in zip(labels, routes) if (a, b) == (label, route))


def test_perfect_and_empty_cases():
    assert route_accuracy(["ANSWER", "SEARCH", "CALCULATE"], ["answer", "search", "calculate"]) == (1.0, 1.0)
    assert route_accuracy(["SEARCH"], ["answer"]) == (None, None)  # nothing to measure
    with pytest.raises(ValueError):
        route_accuracy(["ANSWER"], [])


def test_confusion_markdown_has_a_row_per_label():
    text = confusion_markdown(route_confusion(["ANSWER", "ANSWER"], ["answer", "search"]))
    lines = text.splitlines()
    assert lines[0].count("|") == 5 and len(lines) == 2 + len(LABELS)
    assert "| ANSWER | 1 (50%) | 1 (50%) | 0 (0%) |" in lines


def test_rollout_metrics_report_route_accuracy():
    import torch

    from src.rollout.batch import RolloutBatch

    rows = [
        {
            "reward_task": 1.0,
            "reward_format": 1.0,
            "reward_correctness": 0.0,
            "response_length": 5,
            "used_tool": False,
            "cost": 0.0,
            "route": route,
            "reward_router": 1.0,
            "weak_label": label,
        }
        for label, route in [
            ("ANSWER", "answer"),
            ("ANSWER", "search"),
            ("SEARCH", "search"),
            ("CALCULATE", "search"),
        ]
    ]
    rb = RolloutBatch(
        input_ids=torch.zeros(4, 3, dtype=torch.long),
        attention_mask=torch.ones(4, 3, dtype=torch.long),
        response_mask=torch.ones(4, 1),
        rewards=torch.zeros(4),
        uids=[0, 0, 1, 1],
        rollout_log_probs=torch.zeros(4, 1),
        rows=rows,
    )
    m = rollout_metrics(rb)
    assert m["train/route_acc_answer"] == pytest.approx(0.5)
    assert m["train/route_acc_family"] == pytest.approx(1 / 3)


def _batch(rows, width: int = 1):
    import torch

    from src.rollout.batch import RolloutBatch

    n = len(rows)
    return RolloutBatch(
        input_ids=torch.zeros(n, 3, dtype=torch.long),
        attention_mask=torch.ones(n, 3, dtype=torch.long),
        response_mask=torch.ones(n, width),
        rewards=torch.zeros(n),
        uids=list(range(n)),
        rollout_log_probs=torch.zeros(n, width),
        rows=rows,
    )


def test_metrics_without_data_are_omitted_not_nan():
    row = {
        "reward_task": 1.0,
        "reward_format": 1.0,
        "reward_correctness": 0.0,
        "response_length": 5,
        "used_tool": True,
        "cost": 1.0,
        "route": "search",
        "reward_router": 0.5,
        "weak_label": "SEARCH",
    }
    m = rollout_metrics(_batch([row]))
    assert "train/route_acc_answer" not in m and m["train/route_acc_family"] == 1.0  # no ANSWER row
    assert m["train/response_mask_frac"] == 1.0
    assert rollout_metrics(_batch([], width=0)) == {}  # no rollouts, empty mask: nothing to report
    episode = {
        "reward_task": 2.0,
        "reward_format": math.nan,
        "reward_correctness": math.nan,
        "response_length": 4,
        "episode_return": 2.0,
        "episode_steps": 3,
    }
    m = rollout_metrics(_batch([episode]), prefix="val")
    assert "val/reward_format_mean" not in m and m["val/episode_steps_mean"] == 3.0  # not scored: omitted
    assert all(math.isfinite(v) for v in m.values())


def test_a_real_nan_stays_in_the_metrics():
    from src.rollout.metrics import non_finite

    row = {"reward_task": math.nan, "reward_format": 1.0, "reward_correctness": 0.0, "response_length": 5}
    m = rollout_metrics(_batch([row]))
    assert math.isnan(m["train/reward_task_mean"])
    assert set(non_finite({**m, "x": math.inf, "n": 3})) == {"train/reward_task_mean", "x"}
