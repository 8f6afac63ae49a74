"""Replay buffer of rollout groups (seed 003's ``TrainParams``): off-policy reuse with bounds, the
Ray rollout workers that fill it, and the rollout pipeline's buffers built on them.

The unit is a *group*: the G rows of one prompt, so group advantages stay computable. Each group
carries the policy version it was sampled with (the trainer's global step) and the behaviour
log-probs of its tokens (``RolloutBatch.rollout_log_probs``); the loss corrects for the policy
having moved since with the clipped importance ratio against those log-probs.

Rules, applied at each ``sample``:
* a group older than ``max_batch_latency`` policy versions is dropped (counted in ``dropped_stale``);
* groups are drawn without replacement with probability ∝ (1 + age)^(−alpha) — ``alpha`` is the
  recency bias: 0 is uniform, larger favours fresh groups;
* a group drawn ``max_samples_per_rollout`` times leaves the buffer;
* past ``capacity`` groups, the oldest are evicted on ``add`` (counted in ``evicted``).
The drawn groups are returned in insertion order, so a buffer that holds exactly this step's
groups (latency 0, one use) returns the fresh batch row for row.

Asynchronous rollout workers on Ray (``RolloutWorkerPool``): N actors generate while the trainer
trains. Each actor builds its own collector (its own copy of the policy) with ``build_collector``,
a picklable zero-argument callable, and answers ``collect`` requests with a ``RolloutBatch`` and
the policy version its weights came from. The trainer pushes weights every few steps with
``push_weights``; what comes back is fed to the replay buffer, which drops what is too stale. Ray
is an optional dependency (``pip install -e ".[async]"``; the dev/test extra has it): it is
imported only when workers are asked for. A local Ray starts on this machine; ``address`` joins a
running cluster instead (``ray start --head`` on one machine, ``ray start --address=...`` on the
others). An exception inside a worker surfaces in the trainer as :class:`RolloutWorkerError`
carrying the worker's traceback.

The pipeline's replay buffers: the step trains on a draw from the buffer, not only on its fresh
rollouts. ``LocalReplay`` (``rollout.workers=0``): the step's rollouts enter the buffer at the
current policy version and a draw replaces them. ``WorkerReplay``: a Ray pool produces into the
buffer asynchronously — the step's prompts are submitted, whatever has finished is taken (waiting
only when nothing usable is held), and weights are pushed every ``weight_sync_every`` steps. The
rows logged are the rollouts *generated* this step; the draw is what the loss sees. The buffer
(contents, counters, RNG) is pipeline state, checkpointed by the rollout callback.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from src.rollout.batch import CollectRequest, RolloutBatch, concat_batches, split_groups

log = logging.getLogger(__name__)


@dataclass
class ReplayGroup:
    batch: RolloutBatch  # the G rows of one prompt, padding trimmed
    version: int  # policy version (global step) that sampled it
    serial: int  # insertion order
    uses: int = 0


@dataclass
class ReplaySample:
    """A training batch drawn from the buffer, with what the scalars report."""

    batch: RolloutBatch
    ages: list[int]  # policy versions since each drawn group was sampled
    uses: list[int]  # times each drawn group has now been used (this draw included)


class ReplayBuffer:
    def __init__(
        self,
        capacity: int,
        alpha: float,
        max_samples_per_rollout: int,
        max_batch_latency: int,
        pad_id: int,
        seed: int = 0,
    ):
        if capacity < 0 or max_samples_per_rollout < 1 or max_batch_latency < 0 or alpha < 0:
            raise ValueError(
                "replay needs capacity >= 0, max_samples_per_rollout >= 1, max_batch_latency >= 0, "
                f"alpha >= 0; got {capacity}, {max_samples_per_rollout}, {max_batch_latency}, {alpha}"
            )
        self.capacity, self.alpha = capacity, float(alpha)
        self.max_uses, self.max_latency = max_samples_per_rollout, max_batch_latency
        self.pad_id = pad_id
        self.groups: list[ReplayGroup] = []
        self.generator = torch.Generator().manual_seed(seed)
        self.serial = 0
        self.dropped_stale = 0
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, rb: RolloutBatch, version: int) -> None:
        """Store ``rb``'s groups as sampled by policy ``version``."""
        for group in split_groups(rb):
            self.groups.append(ReplayGroup(group, version, self.serial))
            self.serial += 1
        overflow = len(self.groups) - self.capacity
        if overflow > 0:
            self.groups.sort(key=lambda g: (g.version, g.serial))
            self.groups, self.evicted = self.groups[overflow:], self.evicted + overflow

    def drop_stale(self, version: int) -> int:
        fresh = [g for g in self.groups if version - g.version <= self.max_latency]
        dropped = len(self.groups) - len(fresh)
        self.groups, self.dropped_stale = fresh, self.dropped_stale + dropped
        return dropped

    def sample(self, n_groups: int, version: int) -> ReplaySample | None:
        """Draw up to ``n_groups`` groups for training at policy ``version``; None when empty."""
        self.drop_stale(version)
        if not self.groups or n_groups <= 0:
            return None
        ages = torch.tensor([version - g.version for g in self.groups], dtype=torch.float64)
        weights = (1.0 + ages).pow(-self.alpha)
        k = min(n_groups, len(self.groups))
        picked = torch.multinomial(weights, k, replacement=False, generator=self.generator).tolist()
        drawn = sorted((self.groups[i] for i in picked), key=lambda g: g.serial)
        for g in drawn:
            g.uses += 1
        self.groups = [g for g in self.groups if g.uses < self.max_uses]
        return ReplaySample(
            batch=concat_batches([g.batch for g in drawn], self.pad_id),
            ages=[version - g.version for g in drawn],
            uses=[g.uses for g in drawn],
        )

    def metrics(self, sample: ReplaySample | None) -> dict[str, float]:
        """``replay/...`` scalars for a step."""
        out = {
            "replay/size": float(len(self.groups)),
            "replay/dropped_stale": float(self.dropped_stale),
            "replay/evicted": float(self.evicted),
        }
        if sample is not None:
            out.update(
                {
                    "replay/reuse_mean": sum(sample.uses) / len(sample.uses),
                    "replay/age_mean": sum(sample.ages) / len(sample.ages),
                    "replay/age_max": float(max(sample.ages)),
                }
            )
        return out

    # ------------------------------------------------------------------ checkpoint
    def state_dict(self) -> dict[str, Any]:
        return {
            # plain containers of tensors: loadable with torch.load(weights_only=True)
            "groups": [
                {"batch": _batch_state(g.batch), "version": g.version, "serial": g.serial, "uses": g.uses}
                for g in self.groups
            ],
            "generator": self.generator.get_state(),
            "serial": self.serial,
            "dropped_stale": self.dropped_stale,
            "evicted": self.evicted,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = [
            ReplayGroup(RolloutBatch(**g["batch"]), int(g["version"]), int(g["serial"]), int(g["uses"]))
            for g in state["groups"]
        ]
        self.generator.set_state(state["generator"])
        self.serial = int(state["serial"])
        self.dropped_stale, self.evicted = int(state["dropped_stale"]), int(state["evicted"])


_STORED_FIELDS = (
    "input_ids",
    "attention_mask",
    "response_mask",
    "rewards",
    "uids",
    "rollout_log_probs",
    "temperatures",
    "token_advantages",
    "rows",
)


def _batch_state(rb: RolloutBatch) -> dict[str, Any]:
    return {name: getattr(rb, name) for name in _STORED_FIELDS}


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


def with_fresh_rows(sample_batch: RolloutBatch, fresh: RolloutBatch | None, metrics: dict) -> RolloutBatch:
    """The drawn batch, carrying the fresh rollouts' rows (the rollout log) and the merged metrics."""
    rows = fresh.rows if fresh is not None else []
    return dataclasses.replace(sample_batch, rows=rows, metrics=metrics)


class LocalReplay:
    """Colocated replay: fresh rollouts in, one draw of ``n_groups`` groups out."""

    collects_locally = True

    def __init__(self, buffer: ReplayBuffer, n_groups: int):
        self.buffer, self.n_groups = buffer, n_groups

    def start(self, module, step: int) -> None:
        pass

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch:
        self.buffer.add(fresh, version=request.step)
        sample = self.buffer.sample(self.n_groups, version=request.step)
        if sample is None:
            raise RuntimeError(f"replay buffer empty at step {request.step}: no rollouts were produced")
        return with_fresh_rows(sample.batch, fresh, {**fresh.metrics, **self.buffer.metrics(sample)})

    def sync(self, module, step: int) -> None:
        pass

    def close(self) -> None:
        pass

    def state_dict(self) -> dict[str, Any]:
        return {"buffer": self.buffer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.buffer.load_state_dict(state["buffer"])


class WorkerReplay(LocalReplay):
    """Ray workers produce into the buffer; ``pool_factory()`` starts them at fit start."""

    collects_locally = False

    def __init__(
        self,
        buffer: ReplayBuffer,
        n_groups: int,
        pool_factory: Callable[[], RolloutWorkerPool],
        sync_every: int,
    ):
        super().__init__(buffer, n_groups)
        self.pool_factory, self.sync_every = pool_factory, max(int(sync_every), 1)
        self.pool: RolloutWorkerPool | None = None
        self.pushed = False  # the workers have the trainer's weights (the first sync always pushes)

    def start(self, module, step: int) -> None:
        if self.pool is None:
            self.pool = self.pool_factory()
            self.pushed = False

    def draw(self, fresh: RolloutBatch | None, request: CollectRequest, seed: int) -> RolloutBatch:
        self.pool.submit(request.records, request.step, request.lam, seed=seed)
        fresh = self._take(self.pool.ready(block=False))
        sample = self.buffer.sample(self.n_groups, version=request.step)
        while sample is None:  # nothing usable yet: wait for a worker
            self._take(self.pool.ready(block=True))
            sample = self.buffer.sample(self.n_groups, version=request.step)
        metrics = {**(fresh.metrics if fresh is not None else {}), **self.buffer.metrics(sample)}
        return with_fresh_rows(sample.batch, fresh, metrics)

    def _take(self, results: list[tuple[RolloutBatch, int]]) -> RolloutBatch | None:
        """Results into the buffer; the joined fresh batch (None when no worker finished)."""
        for rb, version in results:
            self.buffer.add(rb, version=version)
        if not results:
            return None
        joined = concat_batches([rb for rb, _ in results], self.buffer.pad_id)
        return dataclasses.replace(joined, metrics=results[-1][0].metrics)

    def sync(self, module, step: int) -> None:
        """Push the whole module (actor and router) at fit start and every ``sync_every`` steps."""
        if step % self.sync_every == 0 or not self.pushed:
            self.pool.push_weights(module.state_dict(), version=step)
            self.pushed = True

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
            self.pool = None
