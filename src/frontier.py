"""The budget frontier: mean task reward against mean tool cost on held-out prompts, for the learned
router beside baselines at the same cost, with bootstrap 95% intervals over prompts.

Input is a *route table*: one row per held-out prompt with the reward and cost the run's actor
gets under each route (``reward_answer``, ``reward_search``, ``reward_calculate``, ``cost_*``),
the prompt's ``weak_label`` and the router's ``learned_route``. Every policy below is then a
per-prompt mixture of routes, so its per-prompt expected reward and cost are exact and the
bootstrap resamples prompts only:

    learned          the router's route (argmax)
    always_answer    ANSWER everywhere
    always_tool      a tool route everywhere, family chosen at random (prompt-independent)
    matched_random   prompt-independent at the learned router's tool rate q: a tool route with
                     probability q (family at random), else ANSWER
    oracle           the weak label's route at the same tool rate: labelled tool prompts get
                     their family with probability min(1, q·N / #labelled), the rest ANSWER
    best             the best allocation at the same tool rate from the measured rewards: the
                     round(q·N) prompts whose better tool route gains most over ANSWER (a gain
                     > 0 only) take that route, the rest ANSWER
    readable         (tables with ``request_class`` and ``named_tool``) the best allocation a router
                     reading only the request could make: prompts grouped by weak label, request
                     class and, for an exact request, the tool its ground truth calls (a vague
                     request names none: which listed tool its ground truth picked is not in the
                     text); each group's tool family the one with the higher mean reward, whole
                     groups take it in order of their mean gain over ANSWER (> 0 only) up to
                     round(q·N) prompts, the last group in part (each of its prompts with the same
                     probability). Group means are taken on the table itself: an upper bound.

``gain_share``: the share of ``best``'s reward gain over always-answer that the learned router
reaches, (learned − always_answer) / (best − always_answer); ``readable_share`` the same against
``readable`` (NaN without its columns).

Two routings of the learned router (column ``routing``): ``argmax``, the router's most probable
route, and ``budget`` (``frontier_points(..., budget=B)``), the router as deployed under a budget:
the threshold on p_route = max(p_search, p_calculate) calibrated on the table's own prompts
(``calibrate_tool_threshold``), so it uses a tool on ⌊B·N⌋ of them, each its more probable tool
family. Held near p_answer 0.5 the argmax underspends B; the budget routing spends it, and every
same-rate policy is compared at that rate.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

__all__ = [
    "POLICIES",
    "available_policies",
    "bootstrap_mean_ci",
    "frontier_points",
    "gain_share",
    "plot_frontier",
    "policy_values",
    "routes_under_budget",
]

ROUTES = ("answer", "search", "calculate")
POLICIES = ("learned", "matched_random", "always_answer", "always_tool", "oracle", "best", "readable")
READABLE_COLUMNS = ("request_class", "named_tool")
_FAMILY = {"SEARCH": "search", "CALCULATE": "calculate"}


def _check(table: pd.DataFrame) -> None:
    need = {"weak_label", "learned_route"} | {f"{k}_{r}" for k in ("reward", "cost") for r in ROUTES}
    missing = sorted(need - set(table.columns))
    if missing:
        raise ValueError(f"route table lacks columns {missing}")
    bad = sorted(set(table["learned_route"]) - set(ROUTES))
    if bad:
        raise ValueError(f"route table: unknown learned_route values {bad}")


def available_policies(table: pd.DataFrame) -> tuple[str, ...]:
    """``POLICIES`` less ``readable`` when the table lacks its columns (older route tables)."""
    has = all(c in table.columns for c in READABLE_COLUMNS)
    return tuple(p for p in POLICIES if p != "readable" or has)


def policy_values(table: pd.DataFrame, policy: str) -> tuple[np.ndarray, np.ndarray]:
    """Per-prompt expected (reward [N], cost [N]) of ``policy`` (one of ``POLICIES``)."""
    _check(table)
    col = {k: {r: table[f"{k}_{r}"].to_numpy(float) for r in ROUTES} for k in ("reward", "cost")}
    n = len(table)
    q = float((table["learned_route"] != "answer").mean()) if n else 0.0
    if policy == "best":
        return _best_allocation(col, round(q * n))
    if policy == "readable":
        return _readable_allocation(table, col, round(q * n))
    out = []
    for k in ("reward", "cost"):
        c = col[k]
        tool = (c["search"] + c["calculate"]) / 2
        if policy == "learned":
            routes = table["learned_route"].to_numpy()
            value = np.choose([ROUTES.index(r) for r in routes], [c[r] for r in ROUTES]) if n else np.zeros(0)
        elif policy == "always_answer":
            value = c["answer"]
        elif policy == "always_tool":
            value = tool
        elif policy == "matched_random":
            value = (1 - q) * c["answer"] + q * tool
        elif policy == "oracle":
            labels = table["weak_label"].to_numpy()
            tool_labelled = np.array([label in _FAMILY for label in labels])
            p = min(1.0, q * n / tool_labelled.sum()) if tool_labelled.any() else 0.0
            own = np.array(
                [c[_FAMILY[lab]][i] if lab in _FAMILY else c["answer"][i] for i, lab in enumerate(labels)]
            )
            value = np.where(tool_labelled, (1 - p) * c["answer"] + p * own, c["answer"])
        else:
            raise ValueError(f"unknown policy {policy!r}; expected one of {POLICIES}")
        out.append(np.asarray(value, float))
    return out[0], out[1]


def _best_allocation(col: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` prompts whose better tool route gains most over ANSWER (ties: the earlier prompt;
    gains <= 0 never) take that route: per-prompt (reward [N], cost [N])."""
    reward, cost = col["reward"], col["cost"]
    calc_better = reward["calculate"] > reward["search"]
    tool_reward = np.where(calc_better, reward["calculate"], reward["search"])
    tool_cost = np.where(calc_better, cost["calculate"], cost["search"])
    gain = tool_reward - reward["answer"]
    chosen = np.zeros(len(gain), bool)
    chosen[np.argsort(-gain, kind="stable")[:k]] = True
    chosen &= gain > 0
    return np.where(chosen, tool_reward, reward["answer"]), np.where(chosen, tool_cost, cost["answer"])


def _readable_allocation(table: pd.DataFrame, col: dict, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Whole request groups (weak label, class, and the named tool of an exact request) take their
    better family in order of mean gain over ANSWER until ``k`` prompts: per-prompt expected
    (reward [N], cost [N]); ties between groups go to the smaller group key."""
    missing = [c for c in READABLE_COLUMNS if c not in table.columns]
    if missing:
        raise ValueError(f"route table lacks columns {missing} (the readable allocation needs them)")
    klass = table["request_class"].astype(str).to_numpy()
    named = np.where(klass == "exact", table["named_tool"].fillna("").astype(str).to_numpy(), "")
    keys = [f"{label}|{c}|{tool}" for label, c, tool in zip(table["weak_label"].astype(str), klass, named)]
    reward, cost = col["reward"], col["cost"]
    groups: dict[str, list[int]] = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    ranked = []
    for key, idx in groups.items():
        family = "calculate" if reward["calculate"][idx].mean() > reward["search"][idx].mean() else "search"
        ranked.append((-(reward[family][idx].mean() - reward["answer"][idx].mean()), key, family, idx))
    p = np.zeros(len(keys))  # each prompt's probability of its group's family route
    family_of = np.full(len(keys), "search", dtype=object)
    left = k
    for neg_gain, _key, family, idx in sorted(ranked, key=lambda g: g[:2]):
        if neg_gain >= 0 or left <= 0:
            break
        take = min(len(idx), left)
        p[idx], family_of[idx] = take / len(idx), family
        left -= take
    tool_reward = np.where(family_of == "calculate", reward["calculate"], reward["search"])
    tool_cost = np.where(family_of == "calculate", cost["calculate"], cost["search"])
    return (1 - p) * reward["answer"] + p * tool_reward, (1 - p) * cost["answer"] + p * tool_cost


def gain_share(points: pd.DataFrame, against: str = "best") -> float:
    """points: ``frontier_points`` of one table -> (learned − always_answer) / (``against`` −
    always_answer) of the mean rewards (NaN when ``against`` is absent or gains nothing)."""
    r = points.set_index("policy")["reward"]
    if against not in r:
        return float("nan")
    gain = r[against] - r["always_answer"]
    return float((r["learned"] - r["always_answer"]) / gain) if gain > 0 else float("nan")


def bootstrap_mean_ci(
    values: np.ndarray, n_boot: int = 1000, seed: int = 0, level: float = 0.95
) -> tuple[float, float, float]:
    """(mean, low, high): percentile bootstrap interval of the mean over resampled rows."""
    values = np.asarray(values, float)
    if values.size == 0:
        return float("nan"), float("nan"), float("nan")
    rng = np.random.default_rng(seed)
    means = values[rng.integers(0, values.size, size=(n_boot, values.size))].mean(axis=1)
    tail = (1 - level) / 2 * 100
    return float(values.mean()), float(np.percentile(means, tail)), float(np.percentile(means, 100 - tail))


def routes_under_budget(table: pd.DataFrame, budget: float) -> pd.DataFrame:
    """A copy of ``table`` whose ``learned_route`` is the router's route under ``budget``: a tool
    family (the more probable one) where its probability p_route reaches the threshold calibrated on
    these N prompts, else ANSWER; at most ⌊budget·N⌋ prompts take a tool. Needs ``p_answer``,
    ``p_search``, ``p_calculate``."""
    import torch

    from src.router.routing_eval import budget_routes, calibrate_tool_threshold

    missing = [f"p_{r}" for r in ROUTES if f"p_{r}" not in table.columns]
    if missing:
        raise ValueError(f"route table lacks columns {missing} (routing under a budget needs them)")
    out = table.copy()
    if len(out):
        probs = torch.tensor(out[[f"p_{r}" for r in ROUTES]].to_numpy(float), dtype=torch.float64)
        routes = budget_routes(probs, calibrate_tool_threshold(probs, budget))
        out["learned_route"] = [ROUTES[i] for i in routes.tolist()]
    return out


def frontier_points(
    table: pd.DataFrame, n_boot: int = 1000, seed: int = 0, budget: float | None = None
) -> pd.DataFrame:
    """One row per policy: reward and cost means with bootstrap 95% intervals, and the tool rate
    (the learned router's, shared by matched_random, oracle, best and readable). ``budget``: the
    learned router routes under it (``routes_under_budget``); column ``routing`` says which."""
    if budget is not None:
        table = routes_under_budget(table, budget)
    rows = []
    for policy in available_policies(table):
        reward, cost = policy_values(table, policy)
        r, r_lo, r_hi = bootstrap_mean_ci(reward, n_boot, seed)
        c, c_lo, c_hi = bootstrap_mean_ci(cost, n_boot, seed)
        rows.append(
            {
                "policy": policy,
                "reward": r,
                "reward_lo": r_lo,
                "reward_hi": r_hi,
                "cost": c,
                "cost_lo": c_lo,
                "cost_hi": c_hi,
            }
        )
    out = pd.DataFrame(rows)
    out["n_prompts"] = len(table)
    out["learned_tool_rate"] = float((table["learned_route"] != "answer").mean()) if len(table) else np.nan
    out["gain_share"] = gain_share(out)
    out["readable_share"] = gain_share(out, "readable")
    out["routing"] = "argmax" if budget is None else "budget"
    return out


_STYLE = {  # policy: (colour, marker, legend label)
    "learned": ("tab:blue", "o", "learned router"),
    "matched_random": ("tab:orange", "s", "matched random (same tool rate)"),
    "oracle": ("tab:green", "^", "weak-label oracle (same tool rate)"),
    "best": ("tab:red", "v", "best allocation by measured reward (same tool rate)"),
    "readable": ("tab:purple", "D", "best by request group (same tool rate)"),
    "learned_under_budget": ("tab:cyan", "*", "learned router under B (calibrated threshold)"),
}


def plot_frontier(points: pd.DataFrame):
    """Reward vs cost per budget: learned and matched random with 95% intervals (both axes), the
    same-rate baselines dotted, always-answer / always-tool as markers, all at the argmax routing's
    tool rate; the learned router under B (``routing`` "budget" rows) as stars. ``points``: frontier
    rows with a ``budget``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.add_subplot()
    routing = points["routing"] if "routing" in points.columns else pd.Series("argmax", index=points.index)
    under_budget = points[(routing == "budget") & (points["policy"] == "learned")]
    points = points[routing != "budget"]
    for policy, (color, marker, label) in _STYLE.items():
        part = under_budget if policy == "learned_under_budget" else points[points["policy"] == policy]
        part = part.sort_values("cost")
        if part.empty:
            continue
        ax.errorbar(
            part["cost"],
            part["reward"],
            xerr=[part["cost"] - part["cost_lo"], part["cost_hi"] - part["cost"]],
            yerr=[part["reward"] - part["reward_lo"], part["reward_hi"] - part["reward"]],
            color=color,
            marker=marker,
            capsize=3,
            label=label,
            linestyle="-" if policy in ("learned", "matched_random") else ":",
        )
    _mark_constant_policies(ax, points)
    ax.set_xlabel("mean tool cost per prompt (held-out)")
    ax.set_ylabel("mean task reward (held-out)")
    ax.set_title("Budget frontier: learned router vs prompt-independent routing")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    fig.tight_layout()
    return fig


def _mark_constant_policies(ax, points: pd.DataFrame) -> None:
    """Always-answer / always-tool as black markers (mean over budgets); each learned point's B."""
    for policy, marker in (("always_answer", "x"), ("always_tool", "+")):
        part = points[points["policy"] == policy]
        if len(part):
            ax.scatter(
                part["cost"].mean(),
                part["reward"].mean(),
                marker=marker,
                s=80,
                color="k",
                label=policy.replace("_", "-"),
                zorder=3,
            )
    if "budget" in points.columns:
        for _, row in points[points["policy"] == "learned"].iterrows():
            ax.annotate(
                f"B={row['budget']:g}",
                (row["cost"], row["reward"]),
                textcoords="offset points",
                xytext=(4, -10),
                fontsize=7,
            )
