"""What every collector takes and the one method it answers: ``collect(CollectRequest) -> RolloutBatch``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from src.rollout.batch import RolloutBatch
from src.rollout.engines.types import RolloutEngine, SamplingParams


@dataclass
class CollectRequest:
    """One collect call.

    records: the P prompt records (single-turn: ``prompt_ids``, ``uid``...; episodes: ``uid``, ``seed``).
    step: the global step the rows are logged under. lam: the current λ (r_router = r_task − λ·cost).
    sampling: this call's sampling (evaluation, a curriculum lesson); None = the collector's own.
        Episode collectors sample at their own per-episode temperatures and refuse a sampling.
    generator: seeds the router's sampling (None: unseeded).
    argmax_routes: every row takes the router's most likely route (validation: the router's
        decision, as greedy decoding is the actor's), not a draw.
    averaged_router: route with the head's Polyak average (``router.ema_decay``; validation), not
        the live head that training samples from.
    """

    records: list[dict[str, Any]]
    step: int
    lam: float = 0.0
    sampling: SamplingParams | None = None
    generator: torch.Generator | None = None
    argmax_routes: bool = False
    averaged_router: bool = False


@runtime_checkable
class Collector(Protocol):
    """Single-turn, episode and RLVCR collectors, and what a Ray worker runs."""

    engine: RolloutEngine

    def collect(self, request: CollectRequest) -> RolloutBatch: ...
