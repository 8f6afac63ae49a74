"""Frontier policies against plain per-prompt loops on random route tables; bootstrap intervals."""

from __future__ import annotations

import itertools
import random

import numpy as np
import pandas as pd
import pytest

from src.frontier import (
    POLICIES,
    bootstrap_mean_ci,
    frontier_points,
    gain_share,
    policy_values,
    routes_under_budget,
)

ROUTES = ("answer", "search", "calculate")


def _table(seed: int, n: int = 30) -> pd.DataFrame:
    rng = random.Random(seed)
    return pd.DataFrame(
        {
            "uid": range(n),
            "weak_label": [rng.choice(["ANSWER", "SEARCH", "CALCULATE", "MIXED"]) for _ in range(n)],
            "learned_route": [rng.choice(ROUTES) for _ in range(n)],
            **{f"reward_{r}": [rng.uniform(-3, 4) for _ in range(n)] for r in ROUTES},
            **{f"cost_{r}": [rng.choice([0.0, 1.0]) for _ in range(n)] for r in ROUTES},
            "request_class": [rng.choice(["exact", "vague", "answer"]) for _ in range(n)],
            "named_tool": [rng.choice(["web_search", "calculator", ""]) for _ in range(n)],
        }
    )


def _readable_reference(rows: list[dict], key: str) -> list[float]:
    """Plain loop: group by (label, class, tool if exact), rank groups, fill k prompts."""
    k = round(sum(r["learned_route"] != "answer" for r in rows) / len(rows) * len(rows))
    groups: dict = {}
    for i, r in enumerate(rows):
        tool = r["named_tool"] if r["request_class"] == "exact" else ""
        groups.setdefault((r["weak_label"], r["request_class"], tool), []).append(i)
    ranked = []
    for g, idx in groups.items():
        mean = {route: sum(rows[i][f"reward_{route}"] for i in idx) / len(idx) for route in ROUTES}
        family = "calculate" if mean["calculate"] > mean["search"] else "search"
        ranked.append((mean[family] - mean["answer"], "|".join(g), family, idx))
    ranked.sort(key=lambda t: (-t[0], t[1]))
    p, fam = [0.0] * len(rows), ["search"] * len(rows)
    for gain, _, family, idx in ranked:
        if gain <= 0 or k <= 0:
            break
        take = min(k, len(idx))
        for i in idx:
            p[i], fam[i] = take / len(idx), family
        k -= take
    return [(1 - p[i]) * r[f"{key}_answer"] + p[i] * r[f"{key}_{fam[i]}"] for i, r in enumerate(rows)]


def _reference(table: pd.DataFrame, policy: str, key: str) -> list[float]:
    rows = table.to_dict("records")
    q = sum(r["learned_route"] != "answer" for r in rows) / len(rows)
    n_tool = sum(r["weak_label"] in ("SEARCH", "CALCULATE") for r in rows)
    p = min(1.0, q * len(rows) / n_tool) if n_tool else 0.0
    out = []
    for r in rows:
        ans, s, c = r[f"{key}_answer"], r[f"{key}_search"], r[f"{key}_calculate"]
        if policy == "learned":
            out.append(r[f"{key}_{r['learned_route']}"])
        elif policy == "always_answer":
            out.append(ans)
        elif policy == "always_tool":
            out.append(0.5 * s + 0.5 * c)
        elif policy == "matched_random":
            out.append((1 - q) * ans + q * 0.5 * (s + c))
        elif policy == "best":  # checked against every allocation by test_best_is_the_best_allocation
            return list(policy_values(table, "best")[0 if key == "reward" else 1])
        elif policy == "readable":
            return _readable_reference(rows, key)
        else:  # oracle at the learned tool rate
            label = r["weak_label"]
            own = s if label == "SEARCH" else c if label == "CALCULATE" else None
            out.append(ans if own is None else (1 - p) * ans + p * own)
    return out


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("policy", POLICIES)
def test_policy_values_match_plain_loops(seed, policy):
    table = _table(seed)
    reward, cost = policy_values(table, policy)
    assert reward == pytest.approx(_reference(table, policy, "reward"))
    assert cost == pytest.approx(_reference(table, policy, "cost"))


def test_matched_random_spends_what_the_learned_router_spends_when_tools_cost_one():
    table = _table(1)
    for r in ROUTES:
        table[f"cost_{r}"] = float(r != "answer")
    points = frontier_points(table, n_boot=100).set_index("policy")
    assert points.loc["matched_random", "cost"] == pytest.approx(points.loc["learned", "cost"])
    # the oracle spends the same unless fewer prompts are labelled for a tool than the router uses one
    labelled = table["weak_label"].isin(["SEARCH", "CALCULATE"]).mean()
    assert points.loc["oracle", "cost"] == pytest.approx(min(points.loc["learned", "cost"], labelled))
    assert (points["reward_lo"] <= points["reward"]).all() and (points["reward"] <= points["reward_hi"]).all()


def test_bootstrap_interval_covers_the_mean_and_shrinks_with_n():
    rng = np.random.default_rng(0)
    small, large = rng.normal(size=20), rng.normal(size=2000)
    m, lo, hi = bootstrap_mean_ci(small)
    assert lo <= m <= hi
    _, lo2, hi2 = bootstrap_mean_ci(large)
    assert hi2 - lo2 < hi - lo


def test_bad_tables_are_named():
    with pytest.raises(ValueError, match="lacks columns"):
        policy_values(pd.DataFrame({"uid": [1]}), "learned")
    table = _table(0)
    table.loc[0, "learned_route"] = "web"
    with pytest.raises(ValueError, match="unknown learned_route"):
        policy_values(table, "learned")


@pytest.mark.parametrize("seed", range(6))
def test_best_is_the_best_allocation(seed):
    """Every way of sending at most round(q·N) prompts to one of their tool routes (the rest
    ANSWER): none earns more than ``best``, which uses at most that many tool routes."""
    table = _table(seed, n=7)
    q = (table["learned_route"] != "answer").mean()
    k = round(q * len(table))
    rows = table.to_dict("records")
    top = -np.inf
    for choice in itertools.product(ROUTES, repeat=len(rows)):
        if sum(c != "answer" for c in choice) <= k:
            top = max(top, sum(r[f"reward_{c}"] for r, c in zip(rows, choice, strict=True)))
    reward, _ = policy_values(table, "best")
    assert reward.sum() == pytest.approx(top)
    assert reward.sum() >= policy_values(table, "learned")[0].sum() - 1e-9


@pytest.mark.parametrize("seed", range(6))
def test_readable_is_no_better_than_best_and_equal_on_groups_that_do_not_vary(seed):
    """Within a group every prompt looks the same to a reader of the request: if their rewards are
    the same too, the best allocation can do no better than whole groups (the last in part)."""
    table = _table(seed, n=40)
    readable, best = policy_values(table, "readable")[0].sum(), policy_values(table, "best")[0].sum()
    assert readable <= best + 1e-9
    exact = table["request_class"] == "exact"
    group = table["weak_label"] + table["request_class"] + table["named_tool"].where(exact, "")
    for r in ROUTES:
        table[f"reward_{r}"] = table.groupby(group)[f"reward_{r}"].transform("first")
    readable, best = policy_values(table, "readable")[0].sum(), policy_values(table, "best")[0].sum()
    assert readable == pytest.approx(best)


def test_tables_without_the_request_columns_have_no_readable_row():
    table = _table(2).drop(columns=["request_class", "named_tool"])
    points = frontier_points(table, n_boot=10)
    assert "readable" not in set(points["policy"]) and points["readable_share"].isna().all()
    with pytest.raises(ValueError, match="lacks columns"):
        policy_values(table, "readable")


def test_gain_share_reads_the_learned_routers_share_of_the_best_gain():
    table = _table(3, n=40)
    points = frontier_points(table, n_boot=10)
    r = points.set_index("policy")["reward"]
    assert points["gain_share"].iloc[0] == pytest.approx(
        (r["learned"] - r["always_answer"]) / (r["best"] - r["always_answer"])
    )
    # a router that routes as the best allocation reaches all of its gain
    best_routes = []
    for row in table.to_dict("records"):
        tool = "calculate" if row["reward_calculate"] > row["reward_search"] else "search"
        best_routes.append(tool if row[f"reward_{tool}"] > row["reward_answer"] else "answer")
    table["learned_route"] = best_routes
    assert gain_share(frontier_points(table, n_boot=10)) == pytest.approx(1.0)


def _with_probs(table: pd.DataFrame, seed: int) -> pd.DataFrame:
    rng = random.Random(seed)
    weights = [[rng.uniform(0.05, 1.0) for _ in ROUTES] for _ in range(len(table))]
    for i, r in enumerate(ROUTES):
        table[f"p_{r}"] = [w[i] / sum(w) for w in weights]
    return table


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("budget", [0.0, 0.1, 0.3, 0.5, 1.0])
def test_routes_under_budget_match_a_plain_loop(seed, budget):
    """The floor(B·N) prompts with the highest p_route = max(p_search, p_calculate) take that tool
    family, the rest ANSWER, whatever the argmax said."""
    table = _with_probs(_table(seed, n=40), seed)
    rows = table.to_dict("records")
    ranked = sorted(range(len(rows)), key=lambda i: -max(rows[i]["p_search"], rows[i]["p_calculate"]))
    expected = ["answer"] * len(rows)
    for i in ranked[: int(budget * len(rows) + 1e-9)]:
        expected[i] = "calculate" if rows[i]["p_calculate"] > rows[i]["p_search"] else "search"
    assert list(routes_under_budget(table, budget)["learned_route"]) == expected
    assert list(table["learned_route"]) == [r["learned_route"] for r in rows]  # the input is left alone


def test_frontier_under_a_budget_compares_every_policy_at_the_budgets_tool_rate():
    table = _with_probs(_table(5, n=40), 5)
    argmax = frontier_points(table, n_boot=20)
    under = frontier_points(table, n_boot=20, budget=0.3)
    assert set(argmax["routing"]) == {"argmax"} and set(under["routing"]) == {"budget"}
    assert under["learned_tool_rate"].iloc[0] == pytest.approx(12 / 40)
    assert argmax["learned_tool_rate"].iloc[0] == pytest.approx((table["learned_route"] != "answer").mean())
    rerouted = frontier_points(routes_under_budget(table, 0.3), n_boot=20)
    pd.testing.assert_frame_equal(under.drop(columns="routing"), rerouted.drop(columns="routing"))
    with pytest.raises(ValueError, match="routing under a budget"):
        frontier_points(table.drop(columns="p_search"), budget=0.3)
