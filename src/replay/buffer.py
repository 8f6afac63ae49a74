"""Replay buffer of rollout groups (seed 003's ``TrainParams``): off-policy reuse with bounds.

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
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from src.rollout.batch import RolloutBatch
from src.rollout.batch_ops import concat_batches, split_groups


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
