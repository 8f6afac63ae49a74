"""Controlled learning test of the budgeted router: router head + GRPO + λ converge to the budget.

Setup (seeded, CPU, a few seconds):
    Prompts: 48 synthetic RLLA rows (``generate_rlla_rows``), a third each search, calculate and
        answer. Half of the search and half of the calculate rows are *high gain* (the scripted
        model writes the ground-truth call: reward 4 vs −3 for answering), the other half *low
        gain* (it calls the right tool with a made-up argument: about −0.5 vs −3). True family =
        the weak label of the ground truth (``weak_label``).
    Generation: ``ScriptedResponder`` writes the response text per (prompt, route); its reward
        and tool cost come from the real ``rlla.compute_score``, ``tool_usage`` and the
        ``any_tool`` cost, precomputed once per (prompt, route) in ``route_table``.
    Representation: each prompt is a left-padded token sequence whose last token is its own; a
        frozen embedding table is the "backbone", so the pooled hidden state of a prompt is its
        kind's random vector plus per-prompt noise (junk on the other tokens). A tiny random
        transformer's last-token states are dominated by the final punctuation token and do not
        separate kinds reliably; a trained LM would, and that is what this stands in for — the
        test is about the RL and dual updates, not about representation learning.
    Router path: the module's own ``ToolRouterModule.router_logits`` and ``_router_loss`` (GRPO
        advantages grouped by the row's ``extra_info.index``, then ``router_loss``), borrowed
        by a minimal host object whose actor is the frozen embedding; Adam on the real
        ``RouterHead``; λ from the real ``LagrangeCallback`` (``lagrange_update`` every K steps).
Budget: B = share of high-gain prompts (1/3), so at the optimum only high-gain prompts use a tool
(the right family) and λ settles between the low-gain and the high-gain reward gain per unit cost.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from src.callbacks.lagrange_callback import LagrangeCallback
from src.datamodules.synthetic import generate_rlla_rows, ground_truth_family
from src.models.advantages import grpo_advantage, group_ids
from src.models.losses import router_loss
from src.models.module import ToolRouterModule
from src.models.router_head import RouterHead
from src.rewards.lagrange import lagrange_update
from src.rewards.tool_cost import make_cost_fn
from src.rewards.tool_families import ToolFamilies, tool_descriptions, weak_label
from src.rollout.batch import RolloutBatch, RouterRollout
from src.rollout.routes import Route, weak_label_index
from src.rollout.scripted import ScriptedResponder, route_table

HIDDEN, SEQ_LEN, N_JUNK = 16, 6, 32
KIND_NAMES = ("search/high", "calculate/high", "search/low", "calculate/low", "answer")


# ---------------------------------------------------------------- the controlled world


@dataclass
class World:
    rows: list[dict]
    uids: list[int]
    routes: torch.Tensor  # [P] long, true route per prompt
    kinds: torch.Tensor  # [P] long, index into KIND_NAMES
    high: torch.Tensor  # [P] bool, high-gain tool prompts
    low: torch.Tensor  # [P] bool, low-gain tool prompts
    rewards: torch.Tensor  # [P, 3] r_task per route
    costs: torch.Tensor  # [P, 3] tool cost per route
    prompt_ids: torch.Tensor  # [P, L] left-padded token ids
    prompt_mask: torch.Tensor  # [P, L]
    embedding: torch.Tensor  # [V, H] frozen "backbone"


def build_world(n: int = 48, seed: int = 0, noise: float = 0.3) -> World:
    rows = generate_rlla_rows(n, seed, p_search=1, p_calculate=1, p_answer=1).to_dict("records")
    families = ToolFamilies()
    routes, kinds, skills, seen = [], [], [], {}
    for row in rows:
        ground_truth = row["reward_model"]["ground_truth"]
        label = weak_label(ground_truth, families, descriptions=tool_descriptions(row["prompt"][0]["content"]))
        route = weak_label_index(label)
        assert Route(route).label == ground_truth_family(ground_truth)  # the labeller agrees with the generator
        seen[route] = seen.get(route, 0) + 1
        sloppy = route != Route.ANSWER and seen[route] % 2 == 0  # every other tool row of a family
        routes.append(route)
        skills.append("sloppy" if sloppy else "exact")
        kinds.append(4 if route == Route.ANSWER else (route - 1) + 2 * sloppy)
    table = route_table(rows, skills, families, make_cost_fn("any_tool"))
    kinds_t = torch.tensor(kinds)

    g = torch.Generator().manual_seed(seed)
    kind_vectors = torch.randn(len(KIND_NAMES), HIDDEN, generator=g)
    # vocab: 0 pad, 1..N_JUNK junk, then one final token per prompt (its kind's vector + noise)
    final = kind_vectors[kinds_t] + noise * torch.randn(n, HIDDEN, generator=g)
    embedding = torch.cat([5 * torch.randn(1 + N_JUNK, HIDDEN, generator=g), final])
    lengths = torch.randint(2, SEQ_LEN + 1, (n,), generator=g)
    ids = torch.zeros(n, SEQ_LEN, dtype=torch.long)
    mask = torch.zeros(n, SEQ_LEN, dtype=torch.long)
    for p in range(n):
        k = int(lengths[p])
        ids[p, SEQ_LEN - k:] = torch.cat([torch.randint(1, N_JUNK + 1, (k - 1,), generator=g),
                                          torch.tensor([1 + N_JUNK + p])])
        mask[p, SEQ_LEN - k:] = 1
    return World(rows, [int(r["extra_info"]["index"]) for r in rows], torch.tensor(routes), kinds_t,
                 kinds_t < 2, (kinds_t >= 2) & (kinds_t < 4), table.rewards, table.costs, ids, mask, embedding)


class FrozenEmbeddingLM(nn.Module):
    """An "actor" whose decoder body returns fixed per-token vectors as last_hidden_state."""

    def __init__(self, embedding: torch.Tensor):
        super().__init__()
        self.model = _Body(embedding)


class _Body(nn.Module):
    def __init__(self, embedding: torch.Tensor):
        super().__init__()
        self.register_buffer("table", embedding)

    def forward(self, input_ids, attention_mask, position_ids):
        return SimpleNamespace(last_hidden_state=self.table[input_ids])


class RouterHost:
    """Just enough of ``ToolRouterModule`` to run its own router methods and the λ callback."""

    router_logits = ToolRouterModule.router_logits
    _router_loss = ToolRouterModule._router_loss

    def __init__(self, actor: nn.Module, head: RouterHead, entropy_coef: float = 0.0):
        self.actor, self.router_head = actor, head
        self.device = torch.device("cpu")
        self.algo = SimpleNamespace(adv_eps=1e-6, norm_adv_by_std=True)
        self.router_cfg = SimpleNamespace(entropy_coef=entropy_coef, sup_coef=0.0, detach_backbone=True)
        self.lagrange_lambda = torch.tensor(0.0)
        self.last_rollout = None
        self.logged: list[dict] = []

    def log_dict(self, metrics, **_):
        self.logged.append(dict(metrics))


def rollout_batch(world: World, idx: torch.Tensor, copies: int, lam: float, generator: torch.Generator,
                  host: RouterHost) -> RolloutBatch:
    """One step's rollouts: P prompts × G copies, each copy samples its own route."""
    ids, mask = world.prompt_ids[idx], world.prompt_mask[idx]
    logits = host.router_logits(ids, mask).repeat_interleave(copies, dim=0)
    out = RouterHead.act(logits, sample=True, generator=generator)
    rows = idx.repeat_interleave(copies)
    r_task = world.rewards[rows, out.router_action]
    cost = world.costs[rows, out.router_action]
    n = len(rows)
    router = RouterRollout(ids, mask, torch.arange(len(idx)).repeat_interleave(copies), out.router_action,
                           out.router_log_prob, r_task - lam * cost, cost, torch.full((n,), -1))
    empty = torch.zeros(n, 0)
    return RolloutBatch(empty.long(), empty.long(), empty, r_task, [world.uids[int(r)] for r in rows], empty,
                        router=router)


@dataclass
class Run:
    expected_cost: float  # under the final policy's probabilities, averaged over prompts
    window_cost: float  # empirical mean cost over the last `window` steps
    probs: torch.Tensor  # [P, 3] final policy
    lambdas: list[float]  # λ after each step
    costs: list[float]  # empirical mean cost per step
    seconds: float


def train(world: World, budget: float, steps: int = 300, prompts: int = 16, copies: int = 8, k: int = 5,
          eta: float = 0.5, lr: float = 3e-3, entropy_coef: float = 0.0, seed: int = 0, window: int = 50) -> Run:
    start = time.perf_counter()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    host = RouterHost(FrozenEmbeddingLM(world.embedding), RouterHead(HIDDEN, mlp_hidden=32, pooling="last"),
                      entropy_coef)
    optimizer = torch.optim.Adam(host.router_head.parameters(), lr=lr)
    callback = LagrangeCallback(budget=budget, lr=eta, every_k_steps=k)
    lambdas, costs = [], []
    for step in range(steps):
        idx = torch.randperm(len(world.rows), generator=generator)[:prompts]
        rb = rollout_batch(world, idx, copies, float(host.lagrange_lambda), generator, host)
        loss, _ = host._router_loss(rb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        host.last_rollout = rb
        callback.on_train_batch_end(None, host, None, None, step)
        lambdas.append(float(host.lagrange_lambda))
        costs.append(float(rb.router.cost.mean()))
    with torch.no_grad():
        probs = torch.softmax(host.router_logits(world.prompt_ids, world.prompt_mask), dim=-1)
    expected = float((probs * world.costs).sum(-1).mean())
    return Run(expected, sum(costs[-window:]) / window, probs, lambdas, costs, time.perf_counter() - start)


@pytest.fixture(scope="module")
def world() -> World:
    return build_world()
