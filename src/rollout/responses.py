"""Decode and score generated responses: text, reward parts, tool usage and cost of each row.

Shared by the single-turn collector and inference (which scores only when given ground truths).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from src.rewards.dispatch import score
from src.rewards.types import RewardBreakdown, RewardConfig
from src.router.context import PromptContext, response_usage
from src.router.families import ToolFamilies
from src.router.usage import ToolUsage

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
