"""Controlled learning test of the budgeted router: router head + GRPO + λ converge to the budget.

Setup (seeded, CPU, a few seconds):
    Prompts: 48 synthetic RLLA rows (``generate_rlla_rows``), a third each search, calculate and
        answer. Half of the search and half of the calculate rows are *high gain* (the scripted
        model writes the ground-truth call: reward 4 vs −3 for answering), the other half *low
        gain* (it calls the right tool with a made-up argument: −0.8…0 vs −3). True family =
        the weak label of the ground truth (``weak_label``).
    Generation: ``ScriptedResponder`` writes the response text per (prompt, route); its reward
        and tool cost come from the real ``rlla.compute_score``, ``tool_usage`` and the
        ``any_tool`` cost, precomputed once per (prompt, route) in ``route_table``.
    Representation: each prompt is a left-padded token sequence whose last token is its own; a
        frozen embedding table is the "backbone", so the pooled hidden state of a prompt is its
        kind's random vector plus per-prompt noise (junk on the other tokens). Not a tiny random
        transformer: its states carry no learned notion of prompt kind, so whether they separate
        kinds would depend on surface tokens and on the seed; a trained LM's states would, and
        that is what this stands in for — the test is about the RL and dual updates, not about
        representation learning.
    Router path: the real ``RouterPolicy`` (the module's router unit: head, GRPO advantages of
        r_router grouped by the row's ``extra_info.index``, ``router_loss``, entropy schedule)
        over the frozen embedding's hidden states; Adam on its parameters; λ and its window
        updated by the module's own ``LagrangeMultiplier`` (dual ascent every K steps).
Budget: B = share of high-gain prompts (1/3), so at the optimum only high-gain prompts use a tool
(the right family) and λ settles between the low-gain and the high-gain reward gain per unit cost.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass

import pytest
import torch

from src.algorithms.lagrange import DualGains, LagrangeMultiplier, dual_step, init_dual_state
from src.algorithms.loss_module import group_ids, grpo_advantage
from src.algorithms.losses import router_loss
from src.config.schema import DualSettings, RouterHeadConfig
from src.datamodules.synthetic import generate_rlla_rows, ground_truth_family
from src.formats.tools_block import tool_descriptions
from src.models.router_policy import RouterPolicy
from src.rollout.batch import RolloutBatch, RouterRollout
from src.router.families import ToolFamilies
from src.router.head import RouterHead
from src.router.routes import Route, weak_label, weak_label_index
from src.router.scripted import ScriptedResponder, route_table
from src.router.usage import make_cost_fn

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
        label = weak_label(
            ground_truth, families, descriptions=tool_descriptions(row["prompt"][0]["content"])
        )
        route = weak_label_index(label)
        assert Route(route).label == ground_truth_family(
            ground_truth
        )  # the labeller agrees with the generator
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
        ids[p, SEQ_LEN - k :] = torch.cat(
            [torch.randint(1, N_JUNK + 1, (k - 1,), generator=g), torch.tensor([1 + N_JUNK + p])]
        )
        mask[p, SEQ_LEN - k :] = 1
    return World(
        rows,
        [int(r["extra_info"]["index"]) for r in rows],
        torch.tensor(routes),
        kinds_t,
        kinds_t < 2,
        (kinds_t >= 2) & (kinds_t < 4),
        table.rewards,
        table.costs,
        ids,
        mask,
        embedding,
    )


class Router:
    """The frozen-embedding "backbone", the real ``RouterPolicy`` and λ with its window, held as
    the module holds them (``LagrangeMultiplier``)."""

    def __init__(self, embedding: torch.Tensor, entropy_coef: float = 0.0, dual: DualSettings | None = None):
        cfg = RouterHeadConfig(
            enable=True, mlp_hidden=32, entropy_coef=entropy_coef, sup_coef=0.0, norm_adv_by_std=True
        )
        self.embedding, self.policy, self.dual = embedding, RouterPolicy(HIDDEN, cfg, adv_eps=1e-6), dual
        self.lagrange = LagrangeMultiplier(dual if dual is not None else DualSettings(), 0.0)

    def prompt_logits(self, prompt_ids: torch.Tensor, prompt_mask: torch.Tensor) -> torch.Tensor:
        """[P, 3]: the policy's head over the frozen per-token vectors."""
        return self.policy(self.embedding[prompt_ids], prompt_mask)

    def loss(self, rb: RolloutBatch, step: int = 0):
        r = rb.router
        return self.policy.loss(self.prompt_logits(r.prompt_ids, r.prompt_mask), r, rb.uids, step)

    def end_step(self, rb: RolloutBatch) -> dict[str, float]:
        """What ``ToolRouterModule.update_lambda`` does on one process (no reduction needed)."""
        cost = rb.router.cost
        totals = torch.tensor([float(cost.sum()), float(rb.rewards.sum()), float(cost.numel())])
        return self.lagrange.update(totals)


def rollout_batch(
    world: World, idx: torch.Tensor, copies: int, lam: float, generator: torch.Generator, router: Router
) -> RolloutBatch:
    """One step's rollouts: P prompts × G copies, each copy samples its own route."""
    ids, mask = world.prompt_ids[idx], world.prompt_mask[idx]
    with torch.no_grad():
        logits = router.prompt_logits(ids, mask).repeat_interleave(copies, dim=0)
    out = RouterHead.act(logits, sample=True, generator=generator)
    rows = idx.repeat_interleave(copies)
    r_task = world.rewards[rows, out.router_action]
    cost = world.costs[rows, out.router_action]
    n = len(rows)
    router = RouterRollout(
        ids,
        mask,
        torch.arange(len(idx)).repeat_interleave(copies),
        out.router_action,
        out.router_log_prob,
        cost,
        torch.full((n,), -1),
        r_task,
        torch.full_like(cost, lam),
    )
    empty = torch.zeros(n, 0)
    return RolloutBatch(
        empty.long(), empty.long(), empty, r_task, [world.uids[int(r)] for r in rows], empty, router=router
    )


@dataclass
class Run:
    expected_cost: float  # under the final policy's probabilities, averaged over prompts
    window_cost: float  # empirical mean cost over the last `window` steps
    probs: torch.Tensor  # [P, 3] final policy
    lambdas: list[float]  # λ after each step
    costs: list[float]  # empirical mean cost per step
    seconds: float


def train(
    world: World,
    budget: float,
    steps: int = 300,
    prompts: int = 16,
    copies: int = 8,
    k: int = 5,
    eta: float = 0.5,
    lr: float = 3e-3,
    entropy_coef: float = 0.0,
    seed: int = 0,
    window: int = 50,
) -> Run:
    start = time.perf_counter()
    torch.manual_seed(seed)
    generator = torch.Generator().manual_seed(seed)
    router = Router(world.embedding, entropy_coef, DualSettings(budget=budget, lambda_lr=eta, lambda_every_k=k))
    optimizer = torch.optim.Adam(router.policy.parameters(), lr=lr)
    lambdas, costs = [], []
    for step in range(steps):
        idx = torch.randperm(len(world.rows), generator=generator)[:prompts]
        rb = rollout_batch(world, idx, copies, router.lagrange.value, generator, router)
        loss, _ = router.loss(rb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        router.end_step(rb)
        lambdas.append(router.lagrange.value)
        costs.append(float(rb.router.cost.mean()))
    with torch.no_grad():
        probs = torch.softmax(router.prompt_logits(world.prompt_ids, world.prompt_mask), dim=-1)
    expected = float((probs * world.costs).sum(-1).mean())
    return Run(expected, sum(costs[-window:]) / window, probs, lambdas, costs, time.perf_counter() - start)


# Chosen on a 12-seed sweep: all pass; entropy 0.3 or 0.7 pass 10/12, and the config default
# 0.01 fails half the seeds (a route whose group samples all agree gets no GRPO gradient, so a
# prompt that committed before λ moved never re-opens the other route).
CONFIG = {"steps": 300, "prompts": 16, "copies": 8, "k": 5, "eta": 1.0, "lr": 3e-3, "entropy_coef": 0.5}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def world() -> World:
    return build_world()


def gains(world: World) -> torch.Tensor:
    """[P] r_task of the true route minus r_task of ANSWER."""
    return world.rewards[torch.arange(len(world.rows)), world.routes] - world.rewards[:, Route.ANSWER]


# ---------------------------------------------------------------- the scripted world itself


def test_scripted_responses_score_through_the_real_chain(world):
    n = len(world.rows)
    assert [int((world.kinds == k).sum()) for k in range(5)] == [8, 8, 8, 8, 16]
    tool_rows = world.routes != Route.ANSWER
    # ANSWER never costs; a tool route always makes one call (any_tool cost 1)
    assert world.costs[:, Route.ANSWER].eq(0).all() and world.costs[:, 1:].eq(1).all()
    # answering a tool row: format 0, correctness -3; an answer row answered: format 1
    assert world.rewards[tool_rows, Route.ANSWER].eq(-3).all()
    assert world.rewards[~tool_rows, Route.ANSWER].eq(1).all()
    assert world.rewards[~tool_rows, 1:].eq(0).all()  # a call where none is needed: format 0
    wrong = torch.where(world.routes == Route.SEARCH, Route.CALCULATE, Route.SEARCH)
    assert world.rewards[tool_rows, wrong[tool_rows]].eq(-2).all()  # layout right, name wrong
    right = world.rewards[torch.arange(n), world.routes]
    assert right[world.high].eq(4).all()  # the ground truth itself
    assert ((right[world.low] > -1) & (right[world.low] <= 0)).all()  # name credit only
    g = gains(world)
    assert float(g[world.low].max()) < float(g[world.high].min())  # the budget has a clean cut

    responder = ScriptedResponder(ToolFamilies())
    row = world.rows[int(torch.nonzero(world.high)[0])]
    ground_truth = row["reward_model"]["ground_truth"]
    route = int(world.routes[int(torch.nonzero(world.high)[0])])
    assert (
        responder.respond(row["prompt"][0]["content"], row["prompt"][1]["content"], ground_truth, route)
        == ground_truth
    )
    with pytest.raises(ValueError, match="skill"):
        responder.respond("", "", ground_truth, route, skill="perfect")
    # no tool of the route's family listed: a generic one is called anyway (a tool route always calls)
    text = responder.respond(
        "no tools here", "<user> hi </user>", "<think> x </think>\n<response> y </response>", "search"
    )
    assert '"name": "web_search"' in text and '"input": "hi"' in text
    with pytest.raises(ValueError, match="row 0"):
        route_table([{"prompt": []}], ["exact"], ToolFamilies(), make_cost_fn("any_tool"))
    with pytest.raises(ValueError, match="2 skills for 1 rows"):
        route_table(world.rows[:1], ["exact", "exact"], ToolFamilies(), make_cost_fn("any_tool"))


# ---------------------------------------------------------------- the learning tests


def test_router_meets_the_budget_and_routes_high_gain_prompts(world):
    budget = float(world.high.float().mean())  # 1/3: tools pay only on the high-gain prompts
    run = train(world, budget, **CONFIG)
    route = run.probs.argmax(-1)

    assert abs(run.expected_cost - budget) <= 0.05, run.expected_cost
    assert abs(run.window_cost - budget) <= 0.05, run.window_cost
    assert float((route[world.high] == world.routes[world.high]).float().mean()) >= 0.9
    # the budget is spent where it pays: everything else answers directly
    assert float((route[~world.high] == Route.ANSWER).float().mean()) >= 0.9
    # λ settled, pricing a call between the low-gain and the high-gain prompts' gains
    g = gains(world)
    assert float(g[world.low].max()) < run.lambdas[-1] < float(g[world.high].min()), run.lambdas[-1]
    assert abs(run.lambdas[-1] - run.lambdas[-51]) < 0.5
    assert run.seconds < 20


def test_generous_budget_keeps_lambda_at_zero_and_uses_tools_wherever_they_help(world):
    tool_rows = world.routes != Route.ANSWER
    budget = float(tool_rows.float().mean()) + 0.1
    run = train(world, budget, **{**CONFIG, "steps": 150})
    route = run.probs.argmax(-1)

    assert max(run.lambdas) < 0.1 and run.lambdas[-1] == 0.0
    assert float((route[tool_rows] == world.routes[tool_rows]).float().mean()) >= 0.9  # low gain too
    assert float((route[~tool_rows] == Route.ANSWER).float().mean()) >= 0.9
    assert run.expected_cost < budget


def test_training_is_deterministic(world):
    a = train(world, 1 / 3, **{**CONFIG, "steps": 30})
    b = train(world, 1 / 3, **{**CONFIG, "steps": 30})
    assert a.lambdas == b.lambdas and a.costs == b.costs and torch.equal(a.probs, b.probs)


# ---------------------------------------------------------------- the pieces the loop relies on


def test_router_policy_loss_is_grpo_advantage_then_router_loss(world):
    g = torch.Generator().manual_seed(3)
    router = Router(world.embedding, entropy_coef=0.2)
    idx = torch.randperm(len(world.rows), generator=g)[:6]
    rb = rollout_batch(world, idx, 4, 1.7, g, router)
    loss, parts = router.loss(rb)

    with torch.no_grad():
        logits = router.policy(world.embedding[world.prompt_ids[idx]], world.prompt_mask[idx])
    logits = logits[rb.router.prompt_index]
    adv = grpo_advantage(rb.router.reward, group_ids(rb.uids))
    expected, _ = router_loss(logits, rb.router.action, adv, entropy_coef=0.2)
    torch.testing.assert_close(loss, expected)
    # plain-loop reference for the policy-gradient part
    pg = 0.0
    for i in range(len(rb.uids)):
        same = [j for j in range(len(rb.uids)) if rb.uids[j] == rb.uids[i]]
        r = rb.router.reward[same]
        a = (rb.router.reward[i] - r.mean()) / (r.std() + 1e-6)
        pg -= float(torch.log_softmax(logits[i], -1)[rb.router.action[i]]) * float(a) / len(rb.uids)
    assert parts["pg"].item() == pytest.approx(pg, abs=1e-5)
    # the r_router the loop feeds in is r_task − λ·cost
    torch.testing.assert_close(rb.router.reward, rb.rewards - 1.7 * rb.router.cost)


def test_router_policy_entropy_schedule_falls_linearly():
    cfg = RouterHeadConfig(enable=True, entropy_coef=0.5, entropy_coef_final=0.1, entropy_decay_steps=4)
    policy = RouterPolicy(HIDDEN, cfg)
    assert [policy.entropy_coef(s) for s in (0, 2, 4, 9)] == pytest.approx([0.5, 0.3, 0.1, 0.1])


def _fresh(dual: DualSettings, lambda_init: float = 0.0) -> LagrangeMultiplier:
    """λ, its window and the controller's memory, as the module's start."""
    return LagrangeMultiplier(dual, lambda_init)


def _feed(multiplier: LagrangeMultiplier, costs: list[torch.Tensor]) -> list[float]:
    """One ``LagrangeMultiplier.update`` per step's costs (one process); λ after each step."""
    out = []
    for cost in costs:
        totals = torch.tensor([float(cost.sum()), float(cost.numel()), float(cost.numel())])
        multiplier.update(totals)
        out.append(multiplier.value)
    return out


def test_lambda_window_step_is_dual_ascent_on_window_means_and_resumes_exactly():
    g = torch.Generator().manual_seed(0)
    costs = [torch.rand(int(torch.randint(3, 9, (1,), generator=g)), generator=g) for _ in range(14)]
    dual = DualSettings(budget=0.3, lambda_lr=0.7, lambda_every_k=3)

    got = _feed(_fresh(dual), costs)
    lam, expected, window = 0.0, [], []
    for step, cost in enumerate(costs):
        window.append(cost)
        if (step + 1) % dual.lambda_every_k == 0:
            lam = max(0.0, lam + dual.lambda_lr * (float(torch.cat(window).mean()) - dual.budget))
            window = []
        expected.append(lam)
    assert got == pytest.approx(expected, abs=1e-6)
    assert len(set(got)) > 2  # λ moved, and stayed >= 0
    assert min(got) >= 0

    # stop mid-window (step 7 of windows of 3), copy the three tensors (the checkpoint), continue
    state = _fresh(dual)
    _feed(state, costs[:7])
    assert _feed(copy.deepcopy(state), costs[7:]) == pytest.approx(got[7:], abs=1e-12)
    capped = _feed(_fresh(DualSettings(budget=0.0, lambda_lr=5.0, lambda_max=0.4)), costs)
    assert max(capped) == pytest.approx(0.4)  # lambda_max caps λ


def test_lambda_window_step_runs_the_pid_controller_and_resumes_it_exactly():
    g = torch.Generator().manual_seed(1)
    costs = [torch.rand(int(torch.randint(3, 9, (1,), generator=g)), generator=g) for _ in range(12)]
    dual = DualSettings(
        budget=0.3, lambda_lr=0.3, lambda_every_k=2, lambda_update="pid", lambda_kp=1.5, lambda_kd=2.0, lambda_cost_ema=0.6
    )
    got = _feed(_fresh(dual, 0.2), costs)
    gains = DualGains(ki=0.3, kp=1.5, kd=2.0, cost_ema=0.6)
    state, expected, window = init_dual_state(0.2), [], []
    for step, cost in enumerate(costs):
        window.append(cost)
        if (step + 1) % 2 == 0:
            state = dual_step("pid", state, float(torch.cat(window).mean()), 0.3, gains)
            window = []
        expected.append(state.lam)
    assert got == pytest.approx(expected, abs=1e-6)
    assert got != _feed(_fresh(DualSettings(budget=0.3, lambda_lr=0.3, lambda_every_k=2), 0.2), costs)  # P and D count

    first = _fresh(dual, 0.2)
    _feed(first, costs[:5])
    assert _feed(copy.deepcopy(first), costs[5:]) == pytest.approx(got[5:], abs=1e-12)
