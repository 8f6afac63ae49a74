"""The curriculum as the pipeline's prompt source: evaluates lessons, moves them on, picks each step's.

Every ``eval_frequency`` steps (step 0 included) it measures each lesson worth measuring
(``CurriculumState.to_evaluate``) — mean task reward of one rollout per eval prompt under the
lesson's eval sampling, collected by the pipeline's own collector (the training engine, with the
training weights) — and updates the state. Each step it then picks one lesson from the weights
(seeded by the step, so a resumed run picks the same) and returns that lesson's prompts and
sampling. Scalars per lesson: ``curriculum/<lesson>/active``, ``/weight``, ``/graduated``,
``/drawn``, ``/eval_reward``. Its state is checkpointed with the pipeline's.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from src.config.sampling import SamplingParams
from src.datamodules.curriculum import ACTIVE, GRADUATED, CurriculumState, LessonPools
from src.rollout.pipeline import CollectFn, StepPrompts

log = logging.getLogger(__name__)


@dataclass
class LessonSampling:
    """Per lesson: prompts per step and the train / eval sampling; eval prompts and cadence."""

    n_prompts: dict[str, int]
    train: dict[str, SamplingParams]
    eval: dict[str, SamplingParams]
    eval_prompts: int
    eval_frequency: int


class CurriculumSource:
    def __init__(self, state: CurriculumState, pools: LessonPools, sampling: LessonSampling, seed: int = 0):
        self.state, self.pools, self.sampling, self.seed = state, pools, sampling, seed
        self.eval_frequency = max(int(sampling.eval_frequency), 1)
        self.evaluated_at = -1

    def prompts(self, records: list[dict[str, Any]], step: int, collect: CollectFn) -> StepPrompts:
        """The step's lesson prompts (the dataloader's records are tickets and are not used)."""
        if step % self.eval_frequency == 0 and step != self.evaluated_at:
            self.evaluate(step, collect)
        weights = self.state.weights()
        lesson = self.pick(weights, step)
        return StepPrompts(
            self.pools.draw(lesson, self.sampling.n_prompts[lesson], step),
            self.sampling.train[lesson],
            self.scalars(weights, lesson),
        )

    def evaluate(self, step: int, collect: CollectFn) -> None:
        rewards = {}
        for lesson in self.state.to_evaluate():
            rows = self.pools.eval_rows(lesson, self.sampling.eval_prompts)
            rewards[lesson] = float(collect(rows, self.sampling.eval[lesson]).rewards.float().mean())
        for lesson, status in self.state.update(rewards):
            log.info(
                "curriculum step %d: lesson %s is now %s (eval reward %.3f)",
                step,
                lesson,
                status,
                self.state.latest(lesson),
            )
        self.evaluated_at = step

    def pick(self, weights: dict[str, float], step: int) -> str:
        ids = sorted(weights)
        probs = torch.tensor([weights[i] for i in ids], dtype=torch.float64)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return ids[int(torch.multinomial(probs, 1, generator=g))]

    def scalars(self, weights: dict[str, float], lesson: str) -> dict[str, float]:
        out: dict[str, float] = {}
        for lid in sorted(weights):
            out[f"curriculum/{lid}/active"] = float(self.state.status[lid] == ACTIVE)
            out[f"curriculum/{lid}/weight"] = weights[lid]
            out[f"curriculum/{lid}/graduated"] = float(self.state.status[lid] == GRADUATED)
            out[f"curriculum/{lid}/drawn"] = float(lid == lesson)
            latest = self.state.latest(lid)
            if latest is not None:
                out[f"curriculum/{lid}/eval_reward"] = latest
        return out

    def state_dict(self) -> dict[str, Any]:
        return {**self.state.state_dict(), "evaluated_at": self.evaluated_at}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)
        self.evaluated_at = int(state["evaluated_at"])
