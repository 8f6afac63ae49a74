"""Episode collector: G multi-step episodes per seed record, packed into one ``RolloutBatch``.

Orchestration only: the episode loop and its prompts live in ``loop.py``.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from src.envs.base import EpisodeEnv
from src.rewards.dispatch import check_finite_rewards
from src.rollout.batch import CollectRequest, RolloutBatch, assemble_sequences
from src.rollout.engines.types import RolloutEngine
from src.rollout.episodes.loop import Episode, EpisodeSettings, EpisodeTemplates, collect_groups


def pad_episodes(episodes: Sequence[Episode], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad the episodes' responses to the longest one (at least 1 column).

    Returns response_ids [N, T] long, response_mask [N, T] long (1 = generated), attention [N, T]
    long (1 on every real token, observations included: the model must read them), log_probs
    [N, T] float (0 on observations and padding).
    """
    width = max([len(e.response_ids) for e in episodes] + [1])
    n = len(episodes)
    ids = torch.full((n, width), pad_id, dtype=torch.long)
    mask = torch.zeros((n, width), dtype=torch.long)
    attn = torch.zeros((n, width), dtype=torch.long)
    logp = torch.zeros((n, width), dtype=torch.float32)
    for i, e in enumerate(episodes):
        k = len(e.response_ids)
        if k:
            ids[i, :k] = torch.tensor(e.response_ids, dtype=torch.long)
            mask[i, :k] = torch.tensor(e.response_mask, dtype=torch.long)
            attn[i, :k] = 1
            if len(e.rollout_log_probs) == k:
                logp[i, :k] = torch.tensor(e.rollout_log_probs, dtype=torch.float32)
    return {"response_ids": ids, "response_mask": mask, "attention": attn, "log_probs": logp}


def episode_row(tokenizer, episode: Episode, record: dict[str, Any], step: int) -> dict[str, Any]:
    """One rollout-log row. reward_format / reward_correctness do not apply to episodes: NaN."""
    return {
        "step": step,
        "uid": record["uid"],
        "seed": episode.seed,
        "data_source": "episode",
        "response": tokenizer.decode(episode.response_ids, skip_special_tokens=False),
        "actions": [s.action_text for s in episode.steps],
        "episode_return": episode.reward,
        "episode_score": episode.score,
        "episode_steps": episode.num_steps,
        "exit_status": episode.exit_status,
        "budget_exhausted": episode.budget_exhausted,
        "temperature": episode.temperature,
        "response_length": len(episode.response_ids),
        "n_action_tokens": episode.n_action_tokens,
        "n_observation_tokens": episode.n_observation_tokens,
        "reward_task": episode.reward,
        "reward_format": math.nan,
        "reward_correctness": math.nan,
    }


class EpisodeCollector:
    """``collect(records, step, lam, generator) -> RolloutBatch`` over ``{"uid", "seed"}`` records.

    The batch also carries ``episodes`` (list[Episode], row order) for step-level estimators (RLVCR).
    """

    def __init__(
        self,
        tokenizer,
        engine: RolloutEngine,
        env_factory: Callable[[], EpisodeEnv],
        settings: EpisodeSettings,
        templates: EpisodeTemplates | None = None,
    ):
        self.tokenizer = tokenizer
        self.engine = engine
        self.env_factory = env_factory
        self.settings = settings
        self.templates = templates or EpisodeTemplates()

    @torch.no_grad()
    def collect(self, request: CollectRequest) -> RolloutBatch:
        """``lam`` and ``generator`` are unused (no router; sampling uses torch's global RNG)."""
        if request.sampling is not None:
            raise ValueError(
                "episode collectors sample at env.temperatures; a request's sampling is not used"
            )
        records, step = request.records, request.step
        check_records(records)
        t0 = time.perf_counter()
        groups = self.run_groups([int(r["seed"]) for r in records])
        t_episodes = time.perf_counter() - t0
        t1 = time.perf_counter()
        episodes = [e for g in groups for e in g]
        owners = [r for r, g in zip(records, groups) for _ in g]
        check_finite_rewards([e.reward for e in episodes], [r["uid"] for r in owners], what="episode reward")
        batch = pack_batch(self.tokenizer, episodes, owners, step)
        batch.metrics.update(episode_metrics(episodes))
        batch.metrics["timing/generation_s"] = t_episodes  # env steps interleave; counted as generation
        batch.metrics["timing/scoring_s"] = time.perf_counter() - t1
        return batch

    def run_groups(self, seeds: list[int]) -> list[list[Episode]]:
        """G episodes per seed (each at its own temperature from ``settings.temperatures``)."""
        return collect_groups(
            self.engine, self.tokenizer, self.env_factory, seeds, self.settings, self.templates
        )


def check_records(records: list[dict[str, Any]]) -> None:
    """Raise KeyError naming the first record without ``uid`` and ``seed``."""
    for i, r in enumerate(records):
        if "seed" not in r or "uid" not in r:
            raise KeyError(f"episode record {i} needs keys 'uid' and 'seed', got {sorted(r)}")


def pack_batch(tokenizer, episodes: list[Episode], owners: list[dict[str, Any]], step: int) -> RolloutBatch:
    """One row per episode; ``temperatures`` [N] is each episode's own sampling temperature."""
    pad = tokenizer.pad_token_id
    padded = pad_episodes(episodes, pad)
    input_ids, attention_mask = assemble_sequences(
        [e.prompt_ids for e in episodes], padded["response_ids"], padded["attention"], pad
    )
    return RolloutBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=padded["response_mask"],
        rewards=torch.tensor([e.reward for e in episodes], dtype=torch.float32),
        uids=[r["uid"] for r in owners],
        rollout_log_probs=padded["log_probs"],
        temperatures=torch.tensor([float(e.temperature) for e in episodes], dtype=torch.float32),
        rows=[episode_row(tokenizer, e, r, step) for e, r in zip(episodes, owners)],
        episodes=episodes,  # RLVCR reads them for step-level advantages
    )


def episode_metrics(episodes: list[Episode]) -> dict[str, float]:
    """Token mix, budget use, returns and lengths of a step's episodes.

    ``rollout/mask_fraction`` (action tokens / response tokens) is omitted when the episodes hold
    no response token: nothing to measure, which is not a NaN fault.
    """
    n_resp = sum(len(e.response_ids) for e in episodes)
    n_act = sum(e.n_action_tokens for e in episodes)
    n = max(len(episodes), 1)
    out = {
        "rollout/generated_tokens": float(n_act),
        "rollout/budget_exhausted_frac": sum(e.budget_exhausted for e in episodes) / n,
        "train/episode_return_mean": sum(e.reward for e in episodes) / n,
        "train/episode_steps_mean": sum(e.num_steps for e in episodes) / n,
    }
    if n_resp:
        out["rollout/mask_fraction"] = n_act / n_resp
    return out
