"""Registered tool-cost functions on ToolUsage values."""

from __future__ import annotations

import random

import pytest

from src.router.usage import COST_FUNCTIONS, ToolUsage, batch_cost, make_cost_fn, register_cost

NONE = ToolUsage()
SEARCH2 = ToolUsage(True, True, False, False, 2, {"search": 2}, ["a", "b"])
BOTH3 = ToolUsage(True, True, True, False, 3, {"search": 1, "calculate": 2}, ["a", "c", "d"])
BROKEN = ToolUsage(True, False, False, True, 1, {"unknown": 1}, [None], parse_ok=False)
EMPTY_BLOCK = ToolUsage(True, parse_ok=False)


def test_registry_names():
    assert {"any_tool", "per_family", "per_call"} <= set(COST_FUNCTIONS)
    with pytest.raises(ValueError, match="already registered"):
        register_cost("any_tool")(lambda usage: 0.0)


def test_any_tool():
    fn = make_cost_fn("any_tool")
    assert [fn(u) for u in (NONE, SEARCH2, BOTH3, BROKEN, EMPTY_BLOCK)] == [0, 1, 1, 1, 1]
    assert make_cost_fn("any_tool", c_tool=0.5)(SEARCH2) == 0.5


def test_per_family():
    fn = make_cost_fn("per_family", c_search=1.0, c_calculate=2.0, c_other=4.0)
    assert [fn(u) for u in (NONE, SEARCH2, BOTH3, BROKEN)] == [0.0, 1.0, 3.0, 4.0]


def test_per_call_with_cap():
    assert [make_cost_fn("per_call", c_call=0.5)(u) for u in (NONE, SEARCH2, BOTH3)] == [0.0, 1.0, 1.5]
    capped = make_cost_fn("per_call", c_call=0.5, cap=1.2)
    assert [capped(u) for u in (NONE, SEARCH2, BOTH3)] == [0.0, 1.0, 1.2]
    assert make_cost_fn("per_call", cap=None)(BOTH3) == 3.0


def test_make_cost_fn_errors():
    with pytest.raises(ValueError, match="unknown tool cost 'nope'"):
        make_cost_fn("nope")
    with pytest.raises(ValueError, match="has no weight 'c_search'"):
        make_cost_fn("any_tool", c_search=1.0)
    with pytest.raises(ValueError, match="c_call=nan"):
        make_cost_fn("per_call", c_call=float("nan"))
    with pytest.raises(ValueError, match="c_search=None"):
        make_cost_fn("per_family", c_search=None)


def test_batch_matches_loop_on_random_usages():
    rng = random.Random(0)
    usages = []
    for _ in range(200):
        s, c, o = (rng.randint(0, 2) for _ in range(3))
        n = s + c + o
        usages.append(ToolUsage(n > 0 or rng.random() < 0.1, s > 0, c > 0, o > 0, n, {}, []))
    w = {"c_search": 0.3, "c_calculate": 0.7, "c_other": 1.1}
    got = batch_cost(usages, make_cost_fn("per_family", **w))
    ref = [
        w["c_search"] * u.used_search + w["c_calculate"] * u.used_calculate + w["c_other"] * u.used_other
        for u in usages
    ]
    assert got == pytest.approx(ref)
    assert batch_cost(usages, make_cost_fn("per_call", c_call=0.25, cap=0.6)) == pytest.approx(
        [min(0.25 * u.n_calls, 0.6) for u in usages]
    )
