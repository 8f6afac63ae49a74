"""The curriculum as a Lightning callback: evaluates lessons, moves them on, fills each step's batch.

Every ``eval_frequency`` steps (step 0 included) it measures each lesson worth measuring
(``CurriculumState.to_evaluate``) — mean task reward of one rollout per eval prompt under the eval
sampling — and updates the state. Each step it then picks one lesson from the weights (seeded by
the step, so a resumed run picks the same) and puts that lesson's prompts and sampling on the
batch before the ``RolloutCallback`` (listed after this one) collects. Scalars per lesson:
``curriculum/<lesson>/active``, ``/weight``, ``/eval_reward``. The state is checkpointed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import lightning.pytorch as pl
import torch

from src.datamodules.curriculum import ACTIVE, GRADUATED, CurriculumState
from src.datamodules.lessons import LessonPools
from src.rollout.batch import PromptBatch
from src.rollout.engine import SamplingParams

log = logging.getLogger(__name__)


class CurriculumCallback(pl.Callback):
    def __init__(
        self,
        state: CurriculumState,
        pools: LessonPools,
        collector_factory: Callable[[pl.LightningModule], Any],
        train_sampling: dict[str, SamplingParams],
        eval_sampling: dict[str, SamplingParams],
        n_prompts: dict[str, int],
        eval_prompts: int,
        eval_frequency: int,
        seed: int = 0,
    ):
        self.state, self.pools = state, pools
        self.collector_factory, self.collector = collector_factory, None
        self.train_sampling, self.eval_sampling = train_sampling, eval_sampling
        self.n_prompts, self.eval_prompts = n_prompts, eval_prompts
        self.eval_frequency, self.seed = max(int(eval_frequency), 1), seed
        self.evaluated_at = -1

    def on_fit_start(self, trainer, pl_module) -> None:
        self.collector = self.collector_factory(pl_module)

    def on_train_batch_start(self, trainer, pl_module, batch: PromptBatch, batch_idx) -> None:
        step = trainer.global_step
        if step % self.eval_frequency == 0 and step != self.evaluated_at:
            self._evaluate(step, float(pl_module.lagrange_lambda))
        weights = self.state.weights()
        lesson = self._pick(weights, step)
        batch.records = self.pools.draw(lesson, self.n_prompts[lesson], step)
        batch.sampling = self.train_sampling[lesson]
        pl_module.log_dict(self._scalars(weights, lesson), on_step=True, logger=True)

    def _evaluate(self, step: int, lam: float) -> None:
        rewards = {}
        for lesson in self.state.to_evaluate():
            rows = self.pools.eval_rows(lesson, self.eval_prompts)
            rb = self.collector.collect(
                rows,
                step=step,
                lam=lam,
                generator=torch.Generator().manual_seed(step),
                sampling=self.eval_sampling[lesson],
            )
            rewards[lesson] = float(rb.rewards.float().mean())
        for lesson, status in self.state.update(rewards):
            log.info(
                "curriculum step %d: lesson %s is now %s (eval reward %.3f)",
                step,
                lesson,
                status,
                self.state.latest(lesson),
            )
        self.evaluated_at = step

    def _pick(self, weights: dict[str, float], step: int) -> str:
        ids = sorted(weights)
        probs = torch.tensor([weights[i] for i in ids], dtype=torch.float64)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + step)
        return ids[int(torch.multinomial(probs, 1, generator=g))]

    def _scalars(self, weights: dict[str, float], lesson: str) -> dict[str, float]:
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

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.state.load_state_dict(state_dict)
        self.evaluated_at = int(state_dict.get("evaluated_at", -1))
