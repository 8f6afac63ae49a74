"""The router alone, measured on labelled prompts: route shares per weak label, accuracy, recall and
precision, tool rate, answer-vs-tool AUC, and routing under a budget.

Inputs are the router's probabilities ``probs`` [N, 3] over (answer, search, calculate) and the
prompts' weak labels ("ANSWER" | "SEARCH" | "CALCULATE" | "MIXED"). Two readings of the router:
    greedy   each prompt takes its argmax route (counts)
    sampled  each prompt takes every route with its probability (expected counts: what sampling
             routes on average, with no sampling noise)
Metrics (``None`` where the denominator is empty):
    route_acc_answer       ANSWER-labelled prompts routed to answer (= recall_answer)
    route_acc_family       tool-ROUTED prompts whose label is the route's family; a tool-labelled
                           prompt sent to answer does not count here (see recall_search / _calculate)
    recall_<route>         prompts labelled <route> that are routed to it
    precision_<route>      prompts routed to <route> that are labelled <route>
    tool_rate              prompts routed to search or calculate
    auc_answer_vs_tool     P(p_tool of a tool-labelled prompt > p_tool of an ANSWER-labelled one),
                           ties count half; p_tool = 1 − p_answer; 0.5 is chance

Under a budget B the router keeps its family choice but sends a prompt to a tool only when
p_route = max(p_search, p_calculate), the probability of the tool route it would take, reaches a
threshold; ``calibrate_tool_threshold`` picks the threshold on held-out prompts so that a share B
of them (no more) is routed to a tool. Ranking by p_route rather than p_tool = 1 − p_answer keeps
the budget off prompts whose tool mass is split between families or sits on a family the router
has given up: such a prompt's p_tool can be high while the route it would take is unlikely
(33 real runs, docs/router_demo.md "The budget ranked by the route's own probability").
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = [
    "ROUTES",
    "answer_vs_tool_auc",
    "budget_route_probs",
    "budget_routes",
    "calibrate_tool_threshold",
    "route_shares",
    "routing_metrics",
]

ROUTES = ("answer", "search", "calculate")
LABEL_ROUTE = {"ANSWER": 0, "SEARCH": 1, "CALCULATE": 2}


def _check(probs: torch.Tensor, labels: Sequence[str]) -> None:
    if probs.ndim != 2 or probs.shape[1] != 3:
        raise ValueError(f"probs must be [N, 3], got {tuple(probs.shape)}")
    if probs.shape[0] != len(labels):
        raise ValueError(f"{probs.shape[0]} probability rows but {len(labels)} labels")


def _assignment(probs: torch.Tensor, greedy: bool) -> torch.Tensor:
    """[N, 3] route weights per prompt: one-hot argmax (greedy) or the probabilities (sampled)."""
    if greedy:
        return torch.nn.functional.one_hot(probs.argmax(dim=-1), 3).to(torch.float64)
    return probs.to(torch.float64)


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def routing_metrics(probs: torch.Tensor, labels: Sequence[str], greedy: bool) -> dict[str, float]:
    """The module doc's metrics (without the AUC) of one reading; entries with no data omitted."""
    _check(probs, labels)
    weights = _assignment(probs, greedy)
    label_idx = torch.tensor([LABEL_ROUTE.get(lab, -1) for lab in labels], dtype=torch.long)
    out: dict[str, float | None] = {
        "tool_rate": float(weights[:, 1:].sum()) / len(labels) if labels else None
    }
    for r, name in enumerate(ROUTES):
        routed = weights[:, r]
        labelled = label_idx == r
        out[f"recall_{name}"] = _ratio(float(routed[labelled].sum()), float(labelled.sum()))
        out[f"precision_{name}"] = _ratio(float(routed[labelled].sum()), float(routed.sum()))
    out["route_acc_answer"] = out["recall_answer"]
    tool_routed = weights[:, 1:].sum(dim=1)
    right_family = sum(weights[i, r] for i in range(len(labels)) for r in (1, 2) if int(label_idx[i]) == r)
    out["route_acc_family"] = _ratio(float(right_family), float(tool_routed.sum()))
    return {k: v for k, v in out.items() if v is not None}


def route_shares(probs: torch.Tensor, labels: Sequence[str], greedy: bool) -> dict[str, dict[str, float]]:
    """{weak label: {"n": count, route: share of that label's prompts}} for every label present."""
    _check(probs, labels)
    weights = _assignment(probs, greedy)
    out: dict[str, dict[str, float]] = {}
    for label in sorted(set(labels)):
        rows = torch.tensor([lab == label for lab in labels])
        share = weights[rows].mean(dim=0)
        out[label] = {"n": int(rows.sum()), **{name: float(share[r]) for r, name in enumerate(ROUTES)}}
    return out


def answer_vs_tool_auc(probs: torch.Tensor, labels: Sequence[str]) -> float | None:
    """AUC of p_tool = 1 − p_answer separating SEARCH/CALCULATE-labelled from ANSWER-labelled
    prompts (Mann–Whitney, ties half); None without both kinds."""
    _check(probs, labels)
    p_tool = (1.0 - probs[:, 0]).to(torch.float64)
    pos = p_tool[torch.tensor([lab in ("SEARCH", "CALCULATE") for lab in labels], dtype=torch.bool)]
    neg = p_tool[torch.tensor([lab == "ANSWER" for lab in labels], dtype=torch.bool)]
    if len(pos) == 0 or len(neg) == 0:
        return None
    diff = pos[:, None] - neg[None, :]
    return float(((diff > 0).double() + 0.5 * (diff == 0).double()).mean())


def calibrate_tool_threshold(probs: torch.Tensor, budget: float) -> float:
    """The smallest p_route threshold t such that the share of prompts with p_route ≥ t is ≤ budget.

    Routing with it (``budget_routes``) spends a tool on at most ⌊B·N⌋ of these prompts (fewer only
    where p_route ties straddle the cut). ``budget`` in [0, 1]; 1 returns 0 (every prompt may use a tool).
    """
    if not 0.0 <= budget <= 1.0 or math.isnan(budget):
        raise ValueError(f"budget must be in [0, 1], got {budget}")
    if probs.ndim != 2 or probs.shape[0] == 0:
        raise ValueError(f"need a non-empty [N, 3] probability tensor, got {tuple(probs.shape)}")
    p_route = sorted(_p_route(probs).tolist(), reverse=True)
    k = math.floor(budget * len(p_route) + 1e-9)  # prompts allowed a tool
    if k >= len(p_route):
        return 0.0
    if k == 0:  # above every p_route there can be (a probability <= 1)
        return math.nextafter(1.0, math.inf)
    cut = p_route[k]  # the best prompt left out: the threshold must lie above it
    above = math.nextafter(cut, math.inf)
    if p_route[k - 1] <= above:  # a tie straddles the cut
        return above
    # midway to the worst prompt let in: the same prompts' p_route computed in another batch layout
    # (other padding, another summation order) moves by float noise and must not cross the cut
    return max(above, cut + (p_route[k - 1] - cut) / 2)


def budget_routes(probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """[N] long routes: the more probable tool family where its probability p_route ≥ ``threshold``,
    else answer (0)."""
    if probs.ndim != 2 or probs.shape[1] != 3:
        raise ValueError(f"probs must be [N, 3], got {tuple(probs.shape)}")
    family = 1 + probs[:, 1:].argmax(dim=-1)
    return torch.where(_p_route(probs) >= threshold, family, torch.zeros_like(family))


def budget_route_probs(probs: torch.Tensor, threshold: float) -> torch.Tensor:
    """[N, 3] the ``budget_routes`` as one-hot rows, in ``probs``' dtype: what ``routing_metrics`` and
    ``route_shares`` read (greedily) to measure routing under the budget."""
    return torch.nn.functional.one_hot(budget_routes(probs, threshold), 3).to(probs.dtype)


def _p_route(probs: torch.Tensor) -> torch.Tensor:
    """[N] max(p_search, p_calculate) in float64: the threshold lies one float64 step above a
    p_route value, which a float32 comparison would round back onto it (routing one prompt too many)."""
    return probs[:, 1:].to(torch.float64).amax(dim=-1)


def routing_scalars(logits: torch.Tensor, labels: Sequence[str], prefix: str) -> dict[str, float]:
    """``{prefix}/routing_greedy/<metric>`` and ``{prefix}/routing_sampled/<metric>`` of the router's
    logits [P, 3] on P labelled prompts, plus ``{prefix}/routing/auc_answer_vs_tool``."""
    probs = torch.softmax(logits.detach().to(torch.float64).cpu(), dim=-1)
    out = {f"{prefix}/routing_greedy/{k}": v for k, v in routing_metrics(probs, labels, True).items()}
    out.update({f"{prefix}/routing_sampled/{k}": v for k, v in routing_metrics(probs, labels, False).items()})
    auc = answer_vs_tool_auc(probs, labels)
    if auc is not None:
        out[f"{prefix}/routing/auc_answer_vs_tool"] = auc
    return out


def budgeted_scalars(
    logits: torch.Tensor, labels: Sequence[str], threshold: float, prefix: str
) -> dict[str, float]:
    """``{prefix}/routing_budgeted/<metric>``: the P labelled prompts (logits [P, 3]) routed under a
    budget with the p_route ``threshold`` calibrated on other prompts (``calibrate_tool_threshold``),
    so the realised ``tool_rate`` measures how the budget holds on prompts the threshold never saw;
    plus the ``threshold`` itself."""
    probs = torch.softmax(logits.detach().to(torch.float64).cpu(), dim=-1)
    metrics = routing_metrics(budget_route_probs(probs, threshold), labels, True)
    return {f"{prefix}/routing_budgeted/{k}": v for k, v in {**metrics, "threshold": threshold}.items()}
