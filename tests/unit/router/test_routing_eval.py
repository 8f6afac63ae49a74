"""Router-alone metrics against plain loops, the AUC against pairwise counting, and the budget
threshold: at most B of the calibration prompts routed to a tool, and as many as ties allow."""

from __future__ import annotations

import random

import pytest
import torch

from src.router.routing_eval import (
    answer_vs_tool_auc,
    budget_route_probs,
    budget_routes,
    budgeted_scalars,
    calibrate_tool_threshold,
    route_shares,
    routing_metrics,
)

LABELS = ("ANSWER", "SEARCH", "CALCULATE", "MIXED")


def _random(n: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    probs = torch.softmax(2 * torch.randn(n, 3, generator=g, dtype=torch.float64), dim=-1)
    rng = random.Random(seed)
    return probs, [rng.choice(LABELS) for _ in range(n)]


def _reference(probs, labels, greedy):
    """Plain loop: weights per (prompt, route), then the module doc's ratios."""
    idx = {"ANSWER": 0, "SEARCH": 1, "CALCULATE": 2}
    w = []
    for row in probs.tolist():
        if greedy:
            best = max(range(3), key=lambda r: row[r])
            w.append([1.0 if r == best else 0.0 for r in range(3)])
        else:
            w.append(row)
    out = {"tool_rate": sum(x[1] + x[2] for x in w) / len(w)}
    for r, name in enumerate(("answer", "search", "calculate")):
        hit = sum(x[r] for x, lab in zip(w, labels) if idx.get(lab) == r)
        n_lab = sum(idx.get(lab) == r for lab in labels)
        n_routed = sum(x[r] for x in w)
        if n_lab:
            out[f"recall_{name}"] = hit / n_lab
        if n_routed:
            out[f"precision_{name}"] = hit / n_routed
    out["route_acc_answer"] = out["recall_answer"]
    tool = sum(x[1] + x[2] for x in w)
    right = sum(x[idx[lab]] for x, lab in zip(w, labels) if lab in ("SEARCH", "CALCULATE"))
    out["route_acc_family"] = right / tool
    return out


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("greedy", [True, False])
def test_metrics_match_plain_loop(seed, greedy):
    probs, labels = _random(60, seed)
    got = routing_metrics(probs, labels, greedy)
    want = _reference(probs, labels, greedy)
    assert set(got) == set(want)
    for k in want:
        assert got[k] == pytest.approx(want[k], abs=1e-9), k


def test_family_accuracy_ignores_tool_labelled_prompts_sent_to_answer_but_recall_sees_them():
    probs = torch.tensor([[0.1, 0.8, 0.1], [0.9, 0.05, 0.05], [0.9, 0.05, 0.05], [0.8, 0.1, 0.1]])
    labels = ["SEARCH", "SEARCH", "SEARCH", "ANSWER"]
    m = routing_metrics(probs, labels, greedy=True)
    assert m["route_acc_family"] == 1.0 and m["recall_search"] == pytest.approx(1 / 3)
    assert m["tool_rate"] == 0.25 and m["precision_answer"] == pytest.approx(1 / 3)
    shares = route_shares(probs, labels, greedy=True)
    assert shares["SEARCH"] == {
        "n": 3,
        "answer": pytest.approx(2 / 3),
        "search": pytest.approx(1 / 3),
        "calculate": 0.0,
    }


@pytest.mark.parametrize("seed", range(3))
def test_auc_is_pairwise_share(seed):
    probs, labels = _random(40, seed)
    probs[:5, 0] = probs[5:10, 0]  # some ties
    p_tool = (1 - probs[:, 0]).tolist()
    pos = [p for p, lab in zip(p_tool, labels) if lab in ("SEARCH", "CALCULATE")]
    neg = [p for p, lab in zip(p_tool, labels) if lab == "ANSWER"]
    want = sum((a > b) + 0.5 * (a == b) for a in pos for b in neg) / (len(pos) * len(neg))
    assert answer_vs_tool_auc(probs, labels) == pytest.approx(want)
    assert answer_vs_tool_auc(probs, ["ANSWER"] * 40) is None


@pytest.mark.parametrize("budget", [0.0, 0.1, 0.3, 0.5, 0.97, 1.0])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_threshold_routes_at_most_budget_and_no_fewer_without_ties(budget, dtype):
    probs = _random(200, 5)[0].to(dtype)
    t = calibrate_tool_threshold(probs, budget)
    routes = budget_routes(probs, t)
    n_tool = int((routes != 0).sum())
    assert n_tool == int(budget * 200 + 1e-9)  # continuous p_route: no ties, exactly floor(B·N)
    family = 1 + probs[:, 1:].argmax(dim=-1)
    assert torch.equal(routes[routes != 0], family[routes != 0])
    with pytest.raises(ValueError, match="budget"):
        calibrate_tool_threshold(probs, 1.5)
    # the same prompts read again in another batch layout: p_route moves by float noise only
    jitter = probs * (
        1 + 1e-6 * torch.randn(probs.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    )
    assert torch.equal(budget_routes(jitter / jitter.sum(-1, keepdim=True), t), routes)
    # as one-hot rows (what the metrics read): one 1 per row, at the budget route, in probs' dtype
    onehot = budget_route_probs(probs, t)
    assert onehot.dtype == dtype and torch.equal(onehot.sum(-1), torch.ones(200, dtype=dtype))
    assert torch.equal(onehot.argmax(-1), routes)


def test_budget_ranks_prompts_by_the_probability_of_the_route_they_would_take():
    """The first prompt has the most tool mass (p_tool 0.6) but splits it: the search route it would
    take has 0.3. The second would take search with 0.55: the one tool the budget allows is its."""
    probs = torch.tensor([[0.40, 0.30, 0.30], [0.45, 0.55, 0.00], [0.90, 0.04, 0.06]], dtype=torch.float64)
    t = calibrate_tool_threshold(probs, 1 / 3)
    assert budget_routes(probs, t).tolist() == [0, 1, 0]
    assert budget_routes(probs, calibrate_tool_threshold(probs, 2 / 3)).tolist() == [1, 1, 0]


def test_budgeted_scalars_route_held_out_prompts_with_a_threshold_set_elsewhere():
    """The threshold comes from the calibration prompts; the held-out tool rate is whatever it
    realises there (a plain count), not B by construction."""
    calib, _ = _random(400, 11)
    held_out, labels = _random(300, 12)
    held_out[:, 0] = held_out[:, 0] ** 0.5  # the held-out prompts lean to answer: fewer pass the cut
    held_out = held_out / held_out.sum(-1, keepdim=True)
    t = calibrate_tool_threshold(calib, 0.3)
    got = budgeted_scalars(held_out.log(), labels, t, "val")
    p_route = [max(row[1], row[2]) for row in held_out.tolist()]
    rate = sum(p >= t for p in p_route) / len(p_route)
    assert got["val/routing_budgeted/threshold"] == t
    assert got["val/routing_budgeted/tool_rate"] == pytest.approx(rate, abs=1e-12)
    assert rate < 0.28  # calibrated elsewhere: not 0.3 by construction
    assert got["val/routing_budgeted/route_acc_answer"] == pytest.approx(
        routing_metrics(budget_route_probs(held_out, t), labels, True)["route_acc_answer"]
    )
