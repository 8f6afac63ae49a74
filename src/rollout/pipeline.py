"""One step's rollouts: prompt source -> collector -> buffer, with the one engine and its one weight sync.

The pipeline is the only thing that produces a step's :class:`RolloutBatch`:

1. the **prompt source** turns the dataloader's records into the step's prompts (``DataSource``:
   as they are; ``CurriculumSource``: a lesson's prompts and sampling, after evaluating lessons
   with the same collector, so with the same engine and the same weights as training);
2. the **collector** (built once at fit start, around the one engine) answers a
   :class:`CollectRequest`;
3. with ``algorithm.dynamic_sampling`` on, the step's dead groups are dropped and the batch refilled
   from extra seeded prompt draws (``src.rollout.dynamic_refill``);
4. the **buffer** decides what the loss sees (``NoBuffer``: the fresh rollouts; ``LocalReplay`` /
   ``WorkerReplay``: a draw from the replay buffer, filled locally or by Ray workers).

``sync_weights`` is the one weight-sync point: stage 6 of ``training_step`` and at fit start (which
covers a resume: Lightning restores the weights before ``on_fit_start``). An engine that holds its
own copy of the weights (``engine.needs_weight_sync``, vLLM) gets ``update_weights(state_dict)``;
the buffer pushes to its workers on its own cadence.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from src.config.sampling import SamplingParams
from src.datamodules.position import refill_seed
from src.rollout.batch import Collector, CollectRequest, RolloutBatch
from src.rollout.dynamic_refill import DynamicSampling, refill

CollectFn = Callable[[list[dict[str, Any]], SamplingParams | None], RolloutBatch]


@dataclass
class StepPrompts:
    """What a prompt source gives one step: records, their sampling (None: the collector's own)
    and scalars to log (``curriculum/...``)."""

    records: list[dict[str, Any]]
    sampling: SamplingParams | None = None
    scalars: dict[str, float] = field(default_factory=dict)


class PromptSource(Protocol):
    def prompts(self, records: list[dict[str, Any]], step: int, collect: CollectFn) -> StepPrompts: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class DataSource:
    """The datamodule's records, as they are."""

    def prompts(self, records: list[dict[str, Any]], step: int, collect: CollectFn) -> StepPrompts:
        return StepPrompts(records)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


class RolloutBuffer(Protocol):
    """Turns a step's fresh rollouts (None when workers produce them) into what the loss sees."""

    collects_locally: bool

    def start(self, module, step: int) -> None: ...

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch: ...

    def sync(self, module, step: int) -> None: ...

    def close(self) -> None: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class NoBuffer:
    """On-policy: the loss sees the step's fresh rollouts."""

    collects_locally = True

    def start(self, module, step: int) -> None:
        pass

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch:
        return fresh

    def sync(self, module, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def step_seed(seed: int, step: int) -> int:
    """The seed of one step's sampling: a resumed run samples as an uninterrupted one."""
    return seed * 1_000_003 + step


class RolloutPipeline:
    """Owns the one collector (and so the one engine), the prompt source and the buffer.

    ``collector_factory(module)`` builds the collector once the module is on its device (None when
    Ray workers produce every rollout and nothing is collected here). ``dynamic``: dynamic
    sampling's settings and refill draw (None: off). ``keyed_draws`` (``rollout.keyed_draws``): the
    training rollouts' and refills' routes and tokens are drawn per row from streams keyed by the
    step's seed, the prompt's uid and the copy, so any world size draws what one process draws
    (``CollectRequest.draw_seed``); false: one stream per rank and step, in batch order.
    """

    def __init__(
        self,
        collector_factory: Callable[[Any], Collector] | None,
        source: PromptSource,
        buffer: RolloutBuffer,
        eval_sampling: SamplingParams | None,
        seed: int = 0,
        dynamic: DynamicSampling | None = None,
        keyed_draws: bool = False,
    ):
        self.collector_factory = collector_factory
        self.source, self.buffer = source, buffer
        self.eval_sampling, self.seed = eval_sampling, seed
        self.dynamic, self.keyed_draws = dynamic, keyed_draws
        self.collector: Collector | None = None

    def start(self, module, step: int) -> None:
        """Build the collector (once) and bring every engine to the module's current weights."""
        if self.collector is None and self.collector_factory is not None:
            self.collector = self.collector_factory(module)
        self.buffer.start(module, step)
        self.sync_weights(module, step)

    def sync_weights(self, module, step: int) -> None:
        """The one weight-sync point: after each optimizer step, at fit start and after a resume."""
        if self.collector is not None and self.collector.engine.needs_weight_sync:
            self.collector.engine.update_weights(
                {k: v.detach() for k, v in module.actor.state_dict().items()}
            )
        self.buffer.sync(module, step)

    def rollout(self, records: list[dict[str, Any]], step: int, lam: float) -> tuple[RolloutBatch, dict]:
        """(the batch the step trains on, scalars to log). Sampling is seeded by (seed, step)."""
        seed = step_seed(self.seed, step)
        prompts = self.source.prompts(records, step, self._collector_fn(step, lam))
        torch.manual_seed(seed)  # sampling inside generate (after any curriculum evaluation)
        request = self._seeded_request(prompts.records, step, lam, prompts.sampling, seed)
        fresh = self._collect(request) if self.buffer.collects_locally else None
        scalars = dict(prompts.scalars)
        if self.dynamic is not None and fresh is not None:
            fresh, dynamic_scalars = refill(
                fresh, step, self._refill_fn(step, lam, prompts.sampling), self.dynamic
            )
            scalars.update(dynamic_scalars)
        return self.buffer.draw(fresh, request, seed), scalars

    def evaluate(self, records: list[dict[str, Any]], step: int, lam: float) -> RolloutBatch:
        """Validation rollouts: the eval sampling (greedy, one per prompt by default), each prompt on
        the argmax route of the router's Polyak average (its live head without ``router.ema_decay``)."""
        if self.eval_sampling is None:
            raise ValueError("validation needs rollout eval sampling (single-turn collectors only)")
        request = CollectRequest(
            records, step, lam, self.eval_sampling, argmax_routes=True, averaged_router=True
        )
        return self._collect(request)

    def _collector_fn(self, step: int, lam: float) -> CollectFn:
        def collect(rows: list[dict[str, Any]], sampling: SamplingParams | None) -> RolloutBatch:
            return self._collect(
                CollectRequest(rows, step, lam, sampling, torch.Generator().manual_seed(step))
            )

        return collect

    def _refill_fn(self, step: int, lam: float, sampling: SamplingParams | None):
        """Collects refill k's prompts, its sampling seeded by (seed, step, k) like the draw's."""

        def collect(records: list[dict[str, Any]], k: int) -> RolloutBatch:
            seed = refill_seed(self.seed, step, k)
            torch.manual_seed(seed)
            return self._collect(self._seeded_request(records, step, lam, sampling, seed))

        return collect

    def _seeded_request(self, records, step: int, lam: float, sampling, seed: int) -> CollectRequest:
        """A training collect drawing from ``seed``: the router's generator, and with ``keyed_draws``
        every row's own streams keyed by it."""
        generator = torch.Generator().manual_seed(seed)
        draw_seed = seed if self.keyed_draws else None
        return CollectRequest(records, step, lam, sampling, generator, draw_seed=draw_seed)

    def _collect(self, request: CollectRequest) -> RolloutBatch:
        if self.collector is None:
            raise RuntimeError("the rollout pipeline has no collector: call start(module, step) first")
        return self.collector.collect(request)

    def close(self) -> None:
        self.buffer.close()

    def state_dict(self) -> dict[str, Any]:
        return {"source": self.source.state_dict(), "buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Raises ValueError when the checkpoint's source or buffer is not this run's kind (e.g. a
        curriculum's state resumed without the curriculum): it would silently restart from scratch."""
        for part, target in (("source", self.source), ("buffer", self.buffer)):
            if set(state[part]) != set(target.state_dict()):
                raise ValueError(
                    f"the checkpoint holds a rollout {part} state ({sorted(state[part])}) this run's "
                    f"{type(target).__name__} does not have; resume with the same overrides "
                    "(checkpoints/manifest.yaml: resume_command)"
                )
        self.source.load_state_dict(state["source"])
        self.buffer.load_state_dict(state["buffer"])
