"""Replay the router's learning on a frozen actor: seconds per seed where a run takes minutes.

A run's checkpoint gives, once, each prompt's router input (the pooled hidden states the head
reads) and its route table (``route_eval.route_table``: the greedy reward and cost under each
route). A fresh head then learns from them with the run's own router settings: the same head,
loss, advantage, entropy schedule, λ controller and optimizer, P prompts × G sampled routes per
step. Left out: the actor changing under GRPO, and sampled (not greedy) responses. Used to choose
the router's settings over many seeds before confirming them with real runs (README, "The router
demo"); ``scripts/replay_router.py`` is the command.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import torch

from src.algorithms.lagrange import initial_controller, lambda_window_step
from src.budget_report import settling_figures
from src.config.schema import RouterConfig
from src.models.router_policy import RouterPolicy
from src.rollout.batch import RouterRollout
from src.rollout.metrics import route_accuracy
from src.router.routing_eval import budget_route_probs, calibrate_tool_threshold, routing_metrics

__all__ = [
    "ReplayTable",
    "budget_gain_shares",
    "probe_routes",
    "replay",
    "replay_table",
    "route_frame",
    "router_inputs",
]

ROUTE_KEYS = ("answer", "search", "calculate")
LABELS = {"ANSWER": 0, "SEARCH": 1, "CALCULATE": 2}


@dataclass
class ReplayTable:
    """inputs [N, H] the head's pooled inputs; reward, cost [N, 3] per route (answer, search,
    calculate); label [N] weak label index (-1: MIXED or none)."""

    inputs: torch.Tensor
    reward: torch.Tensor
    cost: torch.Tensor
    label: torch.Tensor

    def __post_init__(self):
        n = self.inputs.shape[0]
        if self.reward.shape != (n, 3) or self.cost.shape != (n, 3) or self.label.shape != (n,):
            raise ValueError(
                f"replay table shapes: inputs {tuple(self.inputs.shape)}, reward "
                f"{tuple(self.reward.shape)}, cost {tuple(self.cost.shape)}, label {tuple(self.label.shape)}"
            )


@torch.no_grad()
def router_inputs(policy, records: Sequence, batch_size: int = 32) -> torch.Tensor:
    """[N, H] what ``policy``'s router head reads for ``records``: its pooled backbone states."""
    from src.rollout.engines.types import left_pad

    module, pad = policy.module, policy.tokenizer.pad_token_id
    inputs = []
    for start in range(0, len(records), batch_size):
        ids, mask = left_pad(
            [policy.prompt_ids(r.messages) for r in records[start : start + batch_size]], pad
        )
        ids, mask = ids.to(policy.device), mask.to(policy.device)
        hidden = module.router_hidden(ids, mask)
        inputs.append(module.router_head.represent(hidden, mask, ids).float().cpu())
    return torch.cat(inputs)


@torch.no_grad()
def replay_table(policy, records: Sequence, batch_size: int = 32) -> ReplayTable:
    """The table of ``records`` (``RLLARecord``) under ``policy`` (``inference.Policy`` of a run)."""
    from src.jobs.route_eval import route_table

    table = route_table(policy, records, batch_size, policy.reward_config)
    return ReplayTable(
        inputs=router_inputs(policy, records, batch_size),
        reward=torch.tensor(table[[f"reward_{r}" for r in ROUTE_KEYS]].to_numpy(), dtype=torch.float32),
        cost=torch.tensor(table[[f"cost_{r}" for r in ROUTE_KEYS]].to_numpy(), dtype=torch.float32),
        label=torch.tensor([LABELS.get(str(x), -1) for x in table["weak_label"]]),
    )


class _Learner:
    """A fresh head, its optimizer and its route draws (one generator), on one table."""

    def __init__(self, table: ReplayTable, cfg: RouterConfig, seed: int, group: int):
        torch.manual_seed(seed)  # the head's initial weights
        self.table, self.group = table, group
        self.gen = torch.Generator().manual_seed(seed)
        # the table holds the pooled inputs already: the head's own pooling, its SIF buffers and its
        # base embedding table are unused
        self.head = RouterPolicy(table.inputs.shape[1], replace(cfg, pooling="mean", input="actor"))
        self.opt = torch.optim.AdamW(self.head.parameters(), lr=cfg.lr, weight_decay=0.0)

    def logits(self, inputs: torch.Tensor, averaged: bool = False) -> torch.Tensor:
        """inputs [N, H] pooled -> [N, 3]; ``averaged``: the Polyak average (``router.ema_decay``)."""
        return self.head.pooled_logits(inputs, averaged)

    def step(self, idx: torch.Tensor, lam: float, step: int):
        """One router update on prompts ``idx``; returns the rows' (route, cost, r_task)."""
        t, head = self.table, self.head
        logits = self.logits(t.inputs[idx])
        rows = torch.arange(len(idx)).repeat_interleave(self.group)
        probs = torch.softmax(logits.detach().float(), -1)[rows]
        action = torch.multinomial(probs, 1, generator=self.gen).squeeze(-1)
        r_task, cost = t.reward[idx][rows, action], t.cost[idx][rows, action]
        rollout = RouterRollout(
            prompt_ids=None, prompt_mask=None, prompt_index=rows, action=action,
            log_prob=torch.zeros(len(rows)), cost=cost,
            target=t.label[idx][rows], task_reward=r_task, lam=torch.full_like(cost, lam),
        )  # fmt: skip
        loss, _ = head.loss(logits, rollout, idx[rows].tolist(), step)
        self.opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)  # the run's algorithm.grad_clip default
        self.opt.step()
        if head.cfg.ema_decay > 0:
            head.update_average()
        return action, cost, r_task


def _label_names(label: torch.Tensor) -> list[str]:
    """Weak label indices back to their names (-1: MIXED), as the project's metrics take them."""
    names = {v: k for k, v in LABELS.items()}
    return [names.get(int(i), "MIXED") for i in label]


def _nan(value: float | None) -> float:
    return float("nan") if value is None else float(value)


def replay(
    train: ReplayTable, test: ReplayTable, cfg: RouterConfig, seed: int, steps: int, shape=(8, 4)
) -> tuple[dict[str, float], torch.Tensor]:
    """Train a fresh head for ``steps`` steps of ``shape`` = (prompts, routes per prompt) on
    ``train`` (prompts in a seeded order, epoch after epoch); λ by ``cfg``'s controller.

    Returns (figures, the final head's probabilities [N_test, 3] on ``test``). Figures: the last 50
    steps' mean cost, λ range and training accuracies, and the final head's
    (its Polyak average where ``cfg.ema_decay`` > 0, as a run evaluates it) accuracies and tool
    rate on ``test``: greedy (argmax), and under the budget (``test_budgeted_*``:
    a p_route threshold calibrated on ``test`` itself, so its tool rate is B up to ties). Greedy
    family accuracy counts tool-routed prompts only, so a head that sends few prompts to a tool
    scores high on it while spending far less than B; the budgeted figures are read at B.
    """
    n_prompts, group = shape
    learner = _Learner(train, cfg, seed, group)
    lam = torch.tensor(float(cfg.lambda_init), dtype=torch.float64)
    window, controller = torch.zeros(4, dtype=torch.float64), initial_controller(cfg.lambda_init)
    order = torch.randperm(len(train.label), generator=learner.gen)
    trace = []
    for step in range(steps):
        idx = order[(torch.arange(n_prompts) + step * n_prompts) % len(order)]
        action, cost, r_task = learner.step(idx, float(lam), step)
        totals = torch.tensor([float(cost.sum()), float(r_task.sum()), float(len(cost))], dtype=torch.float64)
        lam, window, controller, _ = lambda_window_step(lam, window, controller, totals, cfg)
        trace.append((float(cost.mean()), float(lam), train.label[idx].repeat_interleave(group), action))
    last = trace[-50:]
    routes = [ROUTE_KEYS[int(a)] for a in torch.cat([t[3] for t in last])]
    train_acc = route_accuracy(_label_names(torch.cat([t[2] for t in last])), routes)
    with torch.no_grad():
        probs = torch.softmax(learner.logits(test.inputs, averaged=True).float(), -1)
    names = _label_names(test.label)
    test_acc = routing_metrics(probs, names, greedy=True)
    routed = budget_route_probs(probs, calibrate_tool_threshold(probs, cfg.budget))
    budgeted = routing_metrics(routed, names, greedy=True)
    cost = pd.Series([t[0] for t in trace])
    settling = settling_figures(cost, pd.Series([t[1] for t in trace]), cfg.budget)
    figures = {
        "cost_last50": float(np.mean([t[0] for t in last])),
        **{k: float(v) for k, v in settling.items() if k in ("cost_last100", "lambda_cv", "settled")},
        "window_max_dev": max((abs(w - cfg.budget) for w in settling["cost_windows"]), default=np.nan),
        "settling_step": _nan(settling["settling_step"]),
        "lambda_min": min(t[1] for t in last),
        "lambda_max": max(t[1] for t in last),
        "train_acc_answer": _nan(train_acc[0]),
        "train_acc_family": _nan(train_acc[1]),
        "test_acc_answer": _nan(test_acc.get("route_acc_answer")),
        "test_acc_family": _nan(test_acc.get("route_acc_family")),
        "test_tool_rate": _nan(test_acc.get("tool_rate")),
        "test_budgeted_acc_answer": _nan(budgeted.get("route_acc_answer")),
        "test_budgeted_acc_family": _nan(budgeted.get("route_acc_family")),
        "test_budgeted_tool_rate": _nan(budgeted.get("tool_rate")),
    }
    return figures, probs


def route_frame(test: ReplayTable, probs: torch.Tensor, records: Sequence | None = None) -> pd.DataFrame:
    """``test`` as a route table (``route_eval.route_table``'s columns, what ``src.frontier`` reads)
    with a head's probabilities ``probs`` [N, 3] and its argmax route; ``records`` (``RLLARecord``,
    in table order) add uid and the request columns ``readable`` groups by, else uid is the row."""
    from src.jobs.route_eval import request_columns

    n = len(test.label)
    if probs.shape != (n, 3) or (records is not None and len(records) != n):
        raise ValueError(f"{n} test prompts, probs {tuple(probs.shape)}, {len(records or [])} records")
    frame = pd.DataFrame({"uid": [r.uid for r in records] if records is not None else range(n)})
    frame["weak_label"] = _label_names(test.label)
    if records is not None:
        frame = frame.join(pd.DataFrame([request_columns(r) for r in records]))
    p = probs.detach().double().cpu().numpy()
    for j, route in enumerate(ROUTE_KEYS):
        frame[f"p_{route}"] = p[:, j]
        frame[f"reward_{route}"] = test.reward[:, j].double().numpy()
        frame[f"cost_{route}"] = test.cost[:, j].double().numpy()
    frame["learned_route"] = [ROUTE_KEYS[j] for j in p.argmax(axis=1)]
    return frame


def budget_gain_shares(frame: pd.DataFrame, budget: float) -> dict[str, float]:
    """The frame's routes under ``budget`` (the p_route threshold calibrated on these prompts): their
    share of ``best``'s and ``readable``'s reward gain over always-answer (``src.frontier.gain_share``)."""
    from src.frontier import frontier_points

    points = frontier_points(frame, n_boot=2, budget=budget)  # means only: no interval is read
    return {
        "gain_share": float(points["gain_share"].iloc[0]),
        "readable_share": float(points["readable_share"].iloc[0]),
    }


def probe_routes(train: ReplayTable, test: ReplayTable, budget: float, ridge: float = 10.0) -> torch.Tensor:
    """[N_test] routes (0 answer, 1 search, 2 calculate) of a full-information linear probe: one ridge
    regression per route of its reward on the standardised inputs, fitted on all three rewards of
    every ``train`` prompt (a bandit-trained head sees one route's per draw); the ⌊B·N⌋ test prompts
    whose better predicted tool family gains most over answer take it, as a head under ``budget``
    spends it. What the head's inputs carry linearly about where tools pay."""
    x, xt = train.inputs.double(), test.inputs.double()
    mean, sd = x.mean(0), x.std(0) + 1e-6
    design = torch.nn.functional.pad((x - mean) / sd, (0, 1), value=1.0)  # [N, H+1] with a bias column
    gram = design.T @ design + ridge * torch.eye(design.shape[1], dtype=design.dtype)
    weights = torch.linalg.solve(gram, design.T @ train.reward.double())  # [H+1, 3]
    predicted = torch.nn.functional.pad((xt - mean) / sd, (0, 1), value=1.0) @ weights  # [N_test, 3]
    family = 1 + predicted[:, 1:].argmax(dim=-1)
    gain = predicted.gather(1, family[:, None]).squeeze(1) - predicted[:, 0]
    k = int(np.floor(budget * len(gain) + 1e-9))
    routes = torch.zeros(len(gain), dtype=torch.long)
    chosen = torch.argsort(gain, descending=True, stable=True)[:k]
    routes[chosen] = family[chosen]
    return routes
