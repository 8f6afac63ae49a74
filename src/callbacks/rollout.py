"""Lightning callback that produces the rollout batch before each training and validation step."""

from __future__ import annotations

import logging
from collections.abc import Callable

import lightning.pytorch as pl
import torch

from src.rollout.batch import PromptBatch
from src.rollout.engine import SamplingParams

log = logging.getLogger(__name__)


class RolloutCallback(pl.Callback):
    """Calls ``collector.collect(records, step, lam)`` in ``on_train_batch_start`` and attaches the
    result to the step's batch (``PromptBatch.rollout``); syncs the engine's weights after each step.

    ``collector_factory(pl_module)`` builds the collector once the module is on its device (the
    engine generates with the module's own actor, or a vLLM copy kept in sync).
    """

    def __init__(
        self,
        collector_factory: Callable[[pl.LightningModule], object],
        seed: int = 0,
        eval_sampling: SamplingParams | None = None,
    ):
        self.collector_factory = collector_factory
        self.collector = None
        self.seed = seed
        self.eval_sampling = eval_sampling

    def on_fit_start(self, trainer, pl_module) -> None:
        self.collector = self.collector_factory(pl_module)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        """Validation rollouts: the eval sampling (greedy, one per prompt by default), no weight update."""
        if self.eval_sampling is None:
            raise ValueError("validation needs rollout eval sampling (single-turn collectors only)")
        _prompt_batch(batch).rollout = self.collector.collect(
            batch.records,
            step=trainer.global_step,
            lam=float(pl_module.lagrange_lambda),
            sampling=self.eval_sampling,
        )

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + trainer.global_step)
        torch.manual_seed(self.seed * 1_000_003 + trainer.global_step)  # sampling in generate
        batch = _prompt_batch(batch)
        # a lesson's own sampling (curriculum) reaches single-turn collectors only
        extra = {"sampling": batch.sampling} if batch.sampling is not None else {}
        batch.rollout = self.collector.collect(
            batch.records, step=trainer.global_step, lam=float(pl_module.lagrange_lambda), generator=generator, **extra
        )

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        engine = getattr(self.collector, "engine", None)
        if engine is not None and engine.needs_weight_sync:
            engine.update_weights({k: v.detach() for k, v in pl_module.actor.state_dict().items()})


def _prompt_batch(batch) -> PromptBatch:
    if not isinstance(batch, PromptBatch):
        raise TypeError(
            f"RolloutCallback needs a PromptBatch (the module's on_after_batch_transfer makes one), "
            f"got {type(batch).__name__}"
        )
    return batch
