"""Single-turn rollouts: route (optional), generate G responses per prompt, score, cost.

Orchestration: ``collect`` is route -> routed prompts -> generate -> score -> assemble, each a
function of its own; per-prompt router facts come from ``src.router.routes``. The route decisions
and routed prompts (the router half of a single-turn rollout) and the decoding and scoring of
generated responses (text, reward parts, tool usage and cost of each row; scored only when given
ground truths) are here too, shared with inference.

Rows are prompt-major: P prompts × ``copies`` gives N = P·copies rows, row i from prompt i // copies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import torch

from src.config.sampling import SamplingParams
from src.config.schema import RouterConfig
from src.rewards.dispatch import check_finite_rewards, score
from src.rewards.rlla import RewardBreakdown, RewardConfig
from src.rollout.batch import CollectRequest, RolloutBatch, RouterRollout, assemble_sequences
from src.rollout.engines.types import Completions, RolloutEngine, draw_key, keyed_uniforms, left_pad
from src.router.families import ToolFamilies
from src.router.head import RouterHead
from src.router.routes import (
    PromptContext,
    Route,
    parse_route,
    record_context,
    response_usage,
    routed_messages,
    weak_label_index,
)
from src.router.usage import ToolUsage

log = logging.getLogger(__name__)

ROUTE_NAMES = tuple(r.label for r in Route)  # ("answer", "search", "calculate")

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class RouteDecision:
    """logits [P, 3] float (CPU); action [N] long; log_prob [N] float (of ``action`` under logits)."""

    logits: torch.Tensor
    action: torch.Tensor
    log_prob: torch.Tensor

    @property
    def probs(self) -> torch.Tensor:
        """[P, 3] route probabilities (answer, search, calculate)."""
        return torch.softmax(self.logits.float(), dim=-1)

    def names(self) -> list[str]:
        return [ROUTE_NAMES[int(a)] for a in self.action]


def router_logits(
    logits_fn: LogitsFn, prompt_ids: Sequence[list[int]], pad_id: int, micro_batch: int | None = None
) -> torch.Tensor:
    """Router logits [P, 3] (float32, CPU) of P un-routed prompts, left-padded per micro-batch
    (``micro_batch`` None: all P in one call)."""
    step = len(prompt_ids) if micro_batch is None else max(1, int(micro_batch))
    out = []
    for start in range(0, len(prompt_ids), step):
        ids, mask = left_pad(list(prompt_ids[start : start + step]), pad_id)
        out.append(logits_fn(ids, mask).float().cpu())
    return torch.cat(out)


def decide_routes(
    logits: torch.Tensor,
    copies: int,
    sample: bool,
    generator: torch.Generator | None = None,
    uniforms: torch.Tensor | None = None,
) -> RouteDecision:
    """One route per copy: ``copies`` rows per prompt, sampled (or argmax) from logits [P, 3];
    ``uniforms`` [P·copies]: each row's draw (keyed streams) instead of ``generator``'s."""
    out = RouterHead.act(logits.repeat_interleave(copies, dim=0), sample, generator, uniforms)
    return RouteDecision(logits, out.router_action, out.router_log_prob)


def keyed_generate(engine: RolloutEngine, prompts, sampling: SamplingParams, keys: list[int] | None):
    """``engine.generate``, with ``row_keys`` only when drawing keyed (an engine that never draws keyed
    may keep the two-argument ``generate``)."""
    if keys is None:
        return engine.generate(prompts, sampling)
    return engine.generate(prompts, sampling, row_keys=keys)


def row_keys(records: Sequence[dict], copies: int, seed: int | None, stream: str) -> list[int] | None:
    """The keys of the P·copies rows' ``stream`` (prompt-major; ``engines.types.draw_key`` of the
    step's seed, the prompt's uid and the copy); None without a seed (the batch's one stream)."""
    if seed is None:
        return None
    return [draw_key(seed, r["uid"], j, stream) for r in records for j in range(copies)]


def forced_routes(logits: torch.Tensor | None, routes: Sequence[Route | int | str]) -> RouteDecision:
    """A decision that takes the given routes (one per prompt); log-probs from ``logits`` when known
    (else 0 and logits all zero)."""
    action = torch.tensor([int(parse_route(r)) for r in routes], dtype=torch.long)
    if logits is None:
        return RouteDecision(torch.zeros(len(routes), len(Route)), action, torch.zeros(len(routes)))
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return RouteDecision(logits, action, log_probs.gather(-1, action[:, None]).squeeze(-1))


def routed_prompts(
    encode: Callable[[list[dict[str, Any]]], list[int]],
    contexts: Sequence[PromptContext],
    routes: Sequence[int | None],
    families: ToolFamilies,
    mode: str,
) -> tuple[list[list[dict[str, Any]]], list[list[int]]]:
    """(messages, prompt ids) of each row: row i is ``contexts[i]`` under ``routes[i]`` (None: as given)."""
    messages = [routed_messages(ctx, r, families, mode) for ctx, r in zip(contexts, routes)]
    return messages, [encode(m) for m in messages]


CostFn = Callable[[ToolUsage], float]


@dataclass
class ScoredResponse:
    """One decoded response. reward is None when no ground truth was given (inference)."""

    text: str
    length: int
    usage: ToolUsage
    cost: float
    reward: RewardBreakdown | None = None


def decode_response(tokenizer, token_ids: list[int], drop_ids: set[int]) -> str:
    """Assistant text of a completion: stop/pad tokens removed, other special tokens kept (harmony)."""
    return tokenizer.decode([t for t in token_ids if t not in drop_ids], skip_special_tokens=False)


def usage_cost(usage: ToolUsage, cost_fn: CostFn | None) -> float:
    """The router's tool cost of one response; without a cost function, 1 if any tool was used."""
    return float(cost_fn(usage)) if cost_fn is not None else float(usage.used_any_tool)


@dataclass
class ResponseScorer:
    """Scores decoded responses of prompts described by :class:`PromptContext`."""

    families: ToolFamilies
    cost_fn: CostFn | None = None
    reward_config: RewardConfig | None = None

    def score_text(
        self, text: str, length: int, ctx: PromptContext, ground_truth: str | None = None, step: int = 0
    ) -> ScoredResponse:
        usage = response_usage(text, ctx, self.families)
        reward = None
        if ground_truth is not None:
            reward = score(ctx.data_source, text, ground_truth, step=step, config=self.reward_config)
        return ScoredResponse(text, length, usage, usage_cost(usage, self.cost_fn), reward)

    def score_tokens(
        self,
        tokenizer,
        token_lists: Sequence[list[int]],
        drop_ids: set[int],
        contexts: Sequence[PromptContext],
        ground_truths: Sequence[str] | None = None,
        step: int = 0,
    ) -> list[ScoredResponse]:
        """One ScoredResponse per row: row i is ``token_lists[i]`` answering ``contexts[i]``."""
        truths = ground_truths if ground_truths is not None else [None] * len(token_lists)
        return [
            self.score_text(decode_response(tokenizer, ids, drop_ids), len(ids), ctx, truth, step)
            for ids, ctx, truth in zip(token_lists, contexts, truths)
        ]


@dataclass
class Generation:
    """The N = P·G generated rows: prompts [N] routed prompt ids, completions [N, T], seconds taken."""

    prompts: list[list[int]]
    completions: Completions
    seconds: float


def response_row(step: int, record: dict[str, Any], scored: ScoredResponse) -> dict[str, Any]:
    """One rollout-log row (DESIGN.md's column names) of a scored response."""
    parts = scored.reward
    usage = scored.usage
    return {
        "step": step,
        "uid": record["uid"],
        "data_source": record["data_source"],
        "response": scored.text,
        "response_length": scored.length,
        "reward_task": parts.total,
        "reward_format": parts.format,
        "reward_correctness": parts.correctness,
        "reward_length": parts.length,
        "used_tool": usage.used_any_tool,
        "used_search": usage.used_search,
        "used_calculate": usage.used_calculate,
        "n_tool_calls": usage.n_calls,
        "cost": scored.cost,
    }


def router_rollout(
    decision: RouteDecision,
    prompt_ids: list[list[int]],
    pad_id: int,
    copies: int,
    scored: list[ScoredResponse],
    labels: list[str],
    lam: float,
) -> RouterRollout:
    """The router's part of the batch: weak-label targets [N], and r_task, cost and λ [N], which
    r_router (``RouterRollout.reward``) is formed from."""
    p_ids, p_mask = left_pad(prompt_ids, pad_id)
    task = torch.tensor([s.reward.total for s in scored], dtype=torch.float32)
    costs = torch.tensor([s.cost for s in scored], dtype=torch.float32)
    return RouterRollout(
        prompt_ids=p_ids,
        prompt_mask=p_mask,
        prompt_index=torch.arange(len(prompt_ids)).repeat_interleave(copies),
        action=decision.action,
        log_prob=decision.log_prob,
        cost=costs,
        target=torch.tensor([weak_label_index(label) for label in labels], dtype=torch.long),
        task_reward=task,
        lam=torch.full_like(costs, lam),
    )


def add_route_columns(rows: list[dict], decision: RouteDecision, router: RouterRollout, labels: list[str]):
    """Route, router probability, weak label and r_router on each row (in place: rows are ours)."""
    r_router = router.reward.tolist()  # formed once (a property: r_task − λ·cost), not per row
    for i, row in enumerate(rows):
        row.update(
            route=ROUTE_NAMES[int(decision.action[i])],
            router_prob=float(decision.log_prob[i].exp()),
            weak_label=labels[i],
            reward_router=r_router[i],
        )


class SingleTurnCollector:
    """Builds one :class:`RolloutBatch` from P prompt records (see ``RLLADataModule``)."""

    def __init__(
        self,
        tokenizer,
        engine: RolloutEngine,
        sampling: SamplingParams,
        scorer: ResponseScorer,
        router: RouterConfig,
        router_logits_fn: Callable[..., torch.Tensor] | None = None,
    ):
        """``scorer`` holds the tool families, the cost function and the reward config; ``router``
        is the ``router`` group (read: enable, sample, prompt_mode, actor_reward).
        ``router_logits_fn(prompt_ids, prompt_mask, averaged=False)`` -> logits [P, 3]."""
        self.tokenizer = tokenizer
        self.engine = engine
        self.sampling = sampling
        self.router = router
        self.families = scorer.families
        self.router_logits_fn = router_logits_fn
        self.scorer = scorer
        self.drop_ids = {tokenizer.pad_token_id, tokenizer.eos_token_id, *sampling.stop_token_ids}

    def encode(self, messages: list[dict]) -> list[int]:
        from src.datamodules.rlla_datamodule import prompt_token_ids

        return prompt_token_ids(self.tokenizer, messages)

    @torch.no_grad()
    def collect(self, request: CollectRequest) -> RolloutBatch:
        """``request.sampling`` overrides the training sampling (evaluation uses greedy, one sample)."""
        records, step, generator = request.records, request.step, request.generator
        sampling = request.sampling or self.sampling
        contexts = [record_context(r, self.families, with_label=self.router.enable) for r in records]
        sample_routes = self.router.sample and not request.argmax_routes
        keys = partial(row_keys, records, sampling.n, request.draw_seed)
        decision = self.route(
            records, sampling.n, generator, sample_routes, request.averaged_router, keys("route")
        )
        generation = self.generate(records, contexts, decision, sampling, keys("tokens"))
        t0 = time.perf_counter()
        row_contexts = [ctx for ctx in contexts for _ in range(sampling.n)]
        truths = [r["ground_truth"] for r in records for _ in range(sampling.n)]
        scored = self.scorer.score_tokens(
            self.tokenizer, generation.completions.token_lists(), self.drop_ids, row_contexts, truths, step
        )
        rows = [response_row(step, records[i // sampling.n], s) for i, s in enumerate(scored)]
        batch = self.assemble(request, sampling, row_contexts, decision, generation, scored, rows)
        batch.metrics["timing/scoring_s"] = time.perf_counter() - t0
        return batch

    def route(
        self,
        records: list[dict],
        copies: int,
        generator: torch.Generator | None,
        sample: bool,
        averaged: bool = False,
        keys: list[int] | None = None,
    ) -> RouteDecision | None:
        """The router's decision for each of the P·copies rows; None when the router is off.
        ``averaged``: the head's Polyak average decides (validation), else the live head. ``keys``:
        each row's route drawn from its own keyed stream (``row_keys``), not from ``generator``."""
        if not self.router.enable:
            return None
        logits_fn = partial(self.router_logits_fn, averaged=True) if averaged else self.router_logits_fn
        logits = router_logits(logits_fn, [r["prompt_ids"] for r in records], self.tokenizer.pad_token_id)
        uniforms = None if keys is None else keyed_uniforms(keys, 1)[:, 0]
        return decide_routes(logits, copies, sample, generator, uniforms)

    def generate(
        self,
        records: list[dict],
        contexts: list[PromptContext],
        decision: RouteDecision | None,
        sampling: SamplingParams,
        keys: list[int] | None = None,
    ) -> Generation:
        """Routed rows generate one completion each; without a router the engine samples G per prompt.
        ``keys``: each row's tokens drawn from its own keyed stream (``row_keys``)."""
        t0 = time.perf_counter()
        g = sampling.n
        if decision is None:
            prompts = [r["prompt_ids"] for r in records for _ in range(g)]
            completions = keyed_generate(self.engine, [r["prompt_ids"] for r in records], sampling, keys)
        else:
            row_contexts = [ctx for ctx in contexts for _ in range(g)]
            _, prompts = routed_prompts(
                self.encode, row_contexts, decision.action.tolist(), self.families, self.router.prompt_mode
            )
            completions = keyed_generate(
                self.engine, prompts, replace(sampling, n_generations_per_prompt=1), keys
            )
        return Generation(prompts, completions, time.perf_counter() - t0)

    def assemble(
        self,
        request: CollectRequest,
        sampling: SamplingParams,
        row_contexts: list[PromptContext],
        decision: RouteDecision | None,
        generation: Generation,
        scored: list[ScoredResponse],
        rows: list[dict],
    ) -> RolloutBatch:
        """Pack rows, rewards and router decisions into the typed batch."""
        records, pad = request.records, self.tokenizer.pad_token_id
        uids = [r["uid"] for r in records for _ in range(sampling.n)]
        check_finite_rewards([s.reward.total for s in scored], uids)
        task = torch.tensor([s.reward.total for s in scored], dtype=torch.float32)
        router = None
        if decision is not None:
            labels = [ctx.weak_label for ctx in row_contexts]
            prompt_ids = [r["prompt_ids"] for r in records]
            router = router_rollout(decision, prompt_ids, pad, sampling.n, scored, labels, request.lam)
            check_finite_rewards(router.reward, uids, what="router reward")
            add_route_columns(rows, decision, router, labels)
        actor_rewards = router.reward if router is not None and self.router.actor_reward == "router" else task
        comp = generation.completions
        input_ids, attention_mask = assemble_sequences(
            generation.prompts, comp.response_ids, comp.response_mask, pad
        )
        return RolloutBatch(
            input_ids=input_ids,
            attention_mask=attention_mask,
            response_mask=comp.response_mask,
            rewards=actor_rewards,
            uids=uids,
            rollout_log_probs=comp.log_probs,
            temperatures=torch.full((len(rows),), float(sampling.temperature)),
            router=router,
            rows=rows,
            metrics={
                "timing/generation_s": generation.seconds,
                "rollout/generated_tokens": float(comp.response_mask.sum()),
            },
        )
