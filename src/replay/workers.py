"""Asynchronous rollout workers on Ray: N actors generate while the trainer trains.

Each actor builds its own collector (its own copy of the policy) with ``build_collector``, a
picklable zero-argument callable, and answers ``collect`` requests with a ``RolloutBatch`` and
the policy version its weights came from. The trainer pushes weights every few steps with
``push_weights``; what comes back is fed to the replay buffer, which drops what is too stale.

Ray is an optional dependency (``pip install -e ".[async]"``; the dev/test extra has it): it is
imported only when workers are asked for. A local Ray starts on this machine; ``address`` joins a
running cluster instead (``ray start --head`` on one machine, ``ray start --address=...`` on the
others). An exception inside a worker surfaces in the trainer as :class:`RolloutWorkerError`
carrying the worker's traceback.
"""

from __future__ import annotations

import logging
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from src.rollout.batch import RolloutBatch
from src.rollout.request import CollectRequest

log = logging.getLogger(__name__)


class RolloutWorkerError(RuntimeError):
    """A rollout worker raised; the message holds its traceback."""


def require_ray():
    try:
        import ray
    except ImportError as err:  # the extra is optional: say which one to install
        raise ImportError('rollout.workers > 0 needs Ray: pip install -e ".[async]" (or ".[dev]")') from err
    return ray


class RolloutWorker:
    """The actor body (wrapped with ``ray.remote`` by the pool)."""

    def __init__(self, build_collector: Callable[[], Any], torch_threads: int = 1):
        torch.set_num_threads(max(int(torch_threads), 1))
        self.collector = build_collector()
        self.version = 0

    def set_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> int:
        self.collector.load_policy_state(state_dict)
        self.version = int(version)
        return self.version

    def collect(self, records: list[dict], step: int, lam: float, seed: int) -> tuple[RolloutBatch, int]:
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)
        rb = self.collector.collect(CollectRequest(records, step, lam, generator=generator))
        return rb, self.version


@dataclass
class _Pending:
    ref: Any
    worker: int


class RolloutWorkerPool:
    def __init__(
        self,
        n_workers: int,
        build_collector: Callable[[], Any],
        address: str | None = None,
        cpus_per_worker: float = 1.0,
        torch_threads: int = 1,
    ):
        if n_workers < 1:
            raise ValueError(f"rollout.workers must be >= 1 for a worker pool, got {n_workers}")
        ray = require_ray()
        if not ray.is_initialized():
            # workers import ``src`` from this checkout, wherever the driver was started
            root = str(Path(__file__).resolve().parents[2])
            ray.init(
                address=address,
                include_dashboard=False,
                log_to_driver=True,
                logging_level=logging.WARNING,
                runtime_env={"env_vars": {"PYTHONPATH": root + ":" + ":".join(sys.path[1:])}},
            )
        actor = ray.remote(num_cpus=cpus_per_worker)(RolloutWorker)
        self.ray = ray
        self.actors = [actor.remote(build_collector, torch_threads) for _ in range(n_workers)]
        self.pending: deque[_Pending] = deque()
        self.next_worker = 0

    def push_weights(self, state_dict: dict[str, torch.Tensor], version: int) -> None:
        """Send the trainer's weights (one object-store copy shared by every worker)."""
        ref = self.ray.put({k: v.detach().cpu() for k, v in state_dict.items()})
        self._get([a.set_weights.remote(ref, version) for a in self.actors])

    def submit(self, records: Sequence[dict], step: int, lam: float, seed: int) -> None:
        worker = self.next_worker
        self.next_worker = (worker + 1) % len(self.actors)
        ref = self.actors[worker].collect.remote(list(records), step, lam, seed)
        self.pending.append(_Pending(ref, worker))

    def ready(self, block: bool) -> list[tuple[RolloutBatch, int]]:
        """Finished requests, oldest first; with ``block`` wait for at least one."""
        if not self.pending:
            return []
        refs = [p.ref for p in self.pending]
        done, _ = self.ray.wait(refs, num_returns=1 if block else len(refs), timeout=None if block else 0)
        done_ids = set(done)
        finished = [p for p in self.pending if p.ref in done_ids]
        self.pending = deque(p for p in self.pending if p.ref not in done_ids)
        return self._get([p.ref for p in finished])

    def _get(self, refs: list) -> list:
        try:
            return self.ray.get(refs)
        except self.ray.exceptions.RayError as err:
            raise RolloutWorkerError(f"a rollout worker failed:\n{err}") from err

    def shutdown(self) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.pending = [], deque()
