"""RLVCR on collected multi-step episodes: alternative thinking, scoring, token advantages.

Given a :class:`RolloutBatch` whose ``episodes`` came from the episode collector, for every step
of a qualifying episode (see ``qualifying_episodes``) that parses as a well-formed RLVCR step:

1. the history is everything before that turn's first generated token
   (``prompt_ids + response_ids[:action_start]``);
2. the thinking of the levels the policy did not use is generated from that history with the
   level's prompt (``build_level_prompt``; level 1 needs no generation) — all steps × levels in
   ONE ``engine.generate`` call — and cut before ``<action>``;
3. the original action — the ids the policy generated, not a re-encoding of its text (see
   ``steps.py``) — is scored after the four contexts ``thinking_k + <action>`` with one batched
   teacher-forced pass (``score_level_groups``); the default score is minus the mean action
   entropy (``mode="neg_entropy"``, seed 002), ``logprob`` is the alternative;
4. ``rlvcr_advantage`` combines the trajectory GRPO advantage (episodes grouped by uid, reward
   minus the format penalty) with ``w`` × the thinking advantage, and the returned copy of the
   batch carries it as ``token_advantages`` [N, T]: each step's advantage on that turn's generated tokens, the
   trajectory advantage on every other generated token (steps that did not qualify or parse get
   thinking advantage 0 by construction, so their tokens carry the trajectory advantage).

The batch keeps everything else; the module trains on ``token_advantages`` when present.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from omegaconf import OmegaConf

from src.algorithms.loss_module import group_ids
from src.algorithms.rlvcr import (
    QUALIFY_MODES,
    RlvcrParams,
    StepLevels,
    make_level_scores,
    penalised_rewards,
    qualifying_episodes,
    rlvcr_advantage,
    rlvcr_metrics,
    scatter_step_advantages,
)
from src.config.sampling import SamplingParams
from src.config.schema import AlgorithmConfig, AlgorithmGroupConfig
from src.rollout.batch import CollectRequest, RolloutBatch
from src.rollout.engines.types import RolloutEngine
from src.rollout.episodes.loop import EpisodeTemplates, stop_token_ids
from src.rollout.rlvcr.scoring import ScoringGroup, score_level_groups
from src.rollout.rlvcr.steps import (
    LEVELS,
    StepReader,
    StepRef,
    build_level_prompt,
    extract_level_thinking,
    level_tag,
    scored_step,
    tag_ids,
)

__all__ = [
    "RlvcrAugmenter",
    "RlvcrCollector",
    "check_settings",
    "make_rlvcr_collector",
    "rlvcr_episode_templates",
    "scored_step",
]

log = logging.getLogger(__name__)

# What the agent is shown with ``env.step_format: rlvcr`` (see ``rlvcr_episode_templates``).
RLVCR_SYSTEM_PROMPT = (
    "You are an agent working in a shell on a small coding task. Each reply is ONE step: first choose "
    "how much to think, then give exactly one action (a shell command, `validate` or `submit`), in "
    "this format:\n<level>k</level><think>your thinking</think><action>your action</action>\n"
    "k is 1 (act at once, with no <think> block), 2 (a sentence or two), 3 (step-by-step reasoning) "
    "or 4 (a thorough analysis). Think only as much as the step needs. The next message shows the "
    "output of your action."
)
RLVCR_NEXT_STEP_TEMPLATE = (
    "OBSERVATION:\n{observation}\nNext step as <level>k</level><think>...</think><action>...</action>"
)


def rlvcr_episode_templates(**overrides: str) -> EpisodeTemplates:
    """Episode templates that ask for the RLVCR step format; ``overrides`` replace fields."""
    base = {"system": RLVCR_SYSTEM_PROMPT, "next_step": RLVCR_NEXT_STEP_TEMPLATE}
    return EpisodeTemplates(**{**base, **overrides})


# ---------------------------------------------------------------------------- settings
def check_settings(settings: AlgorithmConfig) -> None:
    """The RLVCR keys' own checks (``validate()`` reports the same for a job's config)."""
    if settings.rlvcr_qualify not in QUALIFY_MODES:
        raise ValueError(
            f"algorithm.rlvcr_qualify={settings.rlvcr_qualify!r}; expected one of {list(QUALIFY_MODES)}"
        )
    if settings.cost_max <= 0:
        raise ValueError(f"algorithm.cost_max must be > 0, got {settings.cost_max}")
    if settings.rlvcr_think_max_new_tokens < 1:
        raise ValueError(
            f"algorithm.rlvcr_think_max_new_tokens must be >= 1, got {settings.rlvcr_think_max_new_tokens}"
        )


# ---------------------------------------------------------------------------- orchestration
@dataclass
class LevelScoring:
    """scores / costs [S, 4] float (zero rows for steps not scored); alt_tokens: alternative
    thinking tokens generated."""

    scores: torch.Tensor
    costs: torch.Tensor
    alt_tokens: int


class RlvcrAugmenter:
    """Returns an episode batch with RLVCR token advantages and metrics added.

    Args:
        tokenizer: HF tokenizer of the policy.
        engine: rollout engine (``generate(prompt_ids, SamplingParams) -> Completions``).
        model: the actor, used for the teacher-forced scoring (put in eval mode while scoring).
        settings: the algorithm config (its RLVCR keys, ``RlvcrSettings``, and adv_eps / norm_adv_by_std).
    """

    def __init__(self, tokenizer, engine: RolloutEngine, model, settings: AlgorithmConfig):
        check_settings(settings)
        self.tokenizer = tokenizer
        self.engine = engine
        self.model = model
        self.settings = settings
        self.tags = tag_ids(self._enc)
        # dropped before parsing / building prompts: padding and the tokens that end a turn
        self.drop_ids = {tokenizer.pad_token_id, tokenizer.eos_token_id, *stop_token_ids(tokenizer)}
        self.reader = StepReader(
            tokenizer,
            self.drop_ids,
            self._enc,
            settings.rlvcr_allow_unclosed_action,
            settings.rlvcr_score_malformed_steps,
        )

    def _enc(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _dec(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t not in self.drop_ids], skip_special_tokens=False)

    # -------------------------------------------------------------- entry point
    @torch.no_grad()
    def augment(self, batch: RolloutBatch) -> RolloutBatch:
        """A copy of ``batch`` with ``token_advantages`` [N, T], ``rlvcr/*`` metrics and row columns."""
        t0 = time.perf_counter()
        st = self.settings
        episodes = batch.episodes
        if episodes is None:
            raise ValueError(
                "RLVCR needs the episode list on the batch (batch.episodes); use the episode collector"
            )
        n, width = batch.response_mask.shape
        if len(episodes) != n:
            raise ValueError(f"RLVCR: batch has {n} rows but {len(episodes)} episodes")
        steps = [s for row, ep in enumerate(episodes) for s in self.reader.read(row, ep, width)]
        groups = group_ids(batch.uids)
        raw = torch.tensor([float(ep.reward) for ep in episodes], dtype=torch.float32)
        n_bad = malformed_counts(steps, n)
        rewards = penalised_rewards(
            raw, n_bad / executed_counts(steps, n).clamp(min=1), st.rlvcr_format_penalty
        )
        ep_ok = qualifying_episodes(raw, groups, st.rlvcr_qualify, st.rlvcr_qualify_threshold)
        qualifies = torch.tensor([qualifying_step(s, ep_ok) for s in steps], dtype=torch.bool)
        scoring = self.level_scores(steps, qualifies)
        adv = self.advantages(steps, rewards, groups, scoring, qualifies)
        token_adv = scatter_step_advantages(
            batch.response_mask,
            adv.trajectory_adv,
            torch.tensor([s.row for s in steps], dtype=torch.long),
            torch.tensor([s.start for s in steps], dtype=torch.long),
            torch.tensor([s.end for s in steps], dtype=torch.long),
            adv.advantage,
        )
        metrics = self.metrics(steps, adv, qualifies, ep_ok, n_bad, scoring.alt_tokens)
        elapsed = time.perf_counter() - t0
        log.debug("RLVCR: %d steps, %d scored, %.2fs", len(steps), int(qualifies.sum()), elapsed)
        return replace(
            batch,
            token_advantages=token_adv,
            metrics=with_timing(batch.metrics, metrics, elapsed),
            rows=with_rlvcr_columns(batch.rows, n, ep_ok, n_bad),
        )

    # -------------------------------------------------------------- generation + scoring
    def level_scores(self, steps: list[StepRef], qualifies: torch.Tensor) -> LevelScoring:
        """Scores and thinking costs of the four levels for each qualifying step."""
        scores, costs = torch.zeros(len(steps), 4), torch.zeros(len(steps), 4)
        idx = qualifies.nonzero().flatten()
        if idx.numel() == 0:
            return LevelScoring(scores, costs, 0)
        scored = [steps[i] for i in idx.tolist()]
        contexts, alt_tokens = self._alternative_thinking(scored)
        out = self._score(scored, contexts)
        scores[idx] = make_level_scores(out.action_logprob, out.action_entropy, self.settings.rlvcr_mode)
        costs[idx] = out.thinking_tokens.float()
        return LevelScoring(scores, costs, alt_tokens)

    def _alternative_thinking(self, steps: list[StepRef]) -> tuple[list[list[str]], int]:
        """Four thinking contexts (text, level 1..4) per step; the used level's comes from the step."""
        # level 1 is just its tag; the used level keeps the policy's own thinking (normalised like
        # the generated ones); the other slots are filled from the generation below
        contexts = [
            [extract_level_thinking(s.think if k == s.level else "", k) for k in LEVELS] for s in steps
        ]
        jobs = [(i, k) for i, s in enumerate(steps) for k in LEVELS if k != 1 and k != s.level]
        if not jobs:
            return contexts, 0
        # the history keeps its exact ids (it ends with the assistant turn header, so the blank line
        # build_level_prompt puts after a history is the leading newline of its empty-history form)
        suffix = {k: self._enc(build_level_prompt("", k)) for k in LEVELS}
        prompts = [list(steps[i].history_ids) + suffix[k] for i, k in jobs]
        st = self.settings
        sampling = SamplingParams(
            n_generations_per_prompt=1,
            temperature=st.rlvcr_think_temperature,
            top_p=st.rlvcr_think_top_p,
            max_new_tokens=st.rlvcr_think_max_new_tokens,
            stop_token_ids=self.tags.stop,
        )
        lists = self.engine.generate(prompts, sampling).token_lists()
        for (i, k), ids in zip(jobs, lists):
            contexts[i][k - 1] = extract_level_thinking(self._dec(ids), k)
        return contexts, sum(len(ids) for ids in lists)

    def _score(self, steps: list[StepRef], contexts: list[list[str]]):
        """Teacher-forced scores of each step's generated action ids under its four contexts."""
        groups = []
        for s, ctx in zip(steps, contexts):
            thinking = [
                tag + self._enc(text[len(level_tag(k)) :])
                for k, tag, text in zip(LEVELS, self.tags.levels, ctx)
            ]
            groups.append(ScoringGroup(s.history_ids, thinking, s.action.action_ids, s.action.prefix_ids))
        was_training = self.model.training
        self.model.eval()
        try:
            return score_level_groups(
                self.model,
                groups,
                self.tags.action,
                self.tags.levels,
                self.tokenizer.pad_token_id,
                max_rows=self.settings.rlvcr_score_max_rows,
            )
        finally:
            self.model.train(was_training)

    # -------------------------------------------------------------- advantages + metrics
    def advantages(
        self,
        steps: list[StepRef],
        rewards: torch.Tensor,
        groups: torch.Tensor,
        scoring: LevelScoring,
        qualifies: torch.Tensor,
    ):
        """``rlvcr_advantage`` over the batch's steps (see ``src.algorithms.rlvcr``)."""
        st = self.settings
        levels = StepLevels(
            torch.tensor([s.row for s in steps], dtype=torch.long),
            scoring.scores,
            scoring.costs,
            torch.tensor([(s.level or 1) - 1 for s in steps], dtype=torch.long),
            qualifies,
        )
        params = RlvcrParams(
            st.cost_max,
            st.thinking_cost_alpha,
            st.step_advantage_w,
            eps=st.adv_eps,
            norm_by_std=st.norm_adv_by_std,
        )
        return rlvcr_advantage(rewards, groups, levels, params)

    def metrics(self, steps, adv, qualifies, ep_ok, n_bad, alt_tokens: int) -> dict[str, float]:
        own_thinking = torch.tensor(
            [len(self._enc(s.parse.think)) if s.parse.think else 0 for s in steps], dtype=torch.float32
        )
        metrics = rlvcr_metrics([s.parse.level for s in steps], own_thinking, adv.thinking_adv, qualifies)
        n = adv.trajectory_adv.numel()
        metrics.update(
            {
                "rlvcr/qualifying_episodes": float(ep_ok.sum()),
                "rlvcr/malformed_step_frac": float(n_bad.sum() / max(len(steps), 1)),
                "rlvcr/alt_thinking_tokens": float(alt_tokens),
                "rlvcr/trajectory_adv_abs_mean": float(adv.trajectory_adv.abs().mean()) if n else 0.0,
            }
        )
        return metrics


def qualifying_step(step: StepRef, episode_ok: torch.Tensor) -> bool:
    """A step is scored when its episode qualifies, the env saw it, and it has a level and action ids."""
    has_action = step.action is not None and bool(step.action.action_ids)
    return bool(episode_ok[step.row]) and step.executed and step.level is not None and has_action


def executed_counts(steps: list[StepRef], n: int) -> torch.Tensor:
    """[N] steps the env saw, per episode."""
    out = torch.zeros(n)
    for s in steps:
        out[s.row] += float(s.executed)
    return out


def malformed_counts(steps: list[StepRef], n: int) -> torch.Tensor:
    """[N] executed steps that break the format, per episode."""
    out = torch.zeros(n)
    for s in steps:
        out[s.row] += float(s.parse.malformed and s.executed)
    return out


def with_timing(before: dict[str, float], metrics: dict[str, float], elapsed: float) -> dict[str, float]:
    """The batch's metrics plus RLVCR's; the augmentation counts as rollout scoring time (the
    module's tokens/sec uses it)."""
    scoring = before.get("timing/scoring_s", 0.0) + elapsed
    return {**before, **metrics, "timing/rlvcr_s": elapsed, "timing/scoring_s": scoring}


def with_rlvcr_columns(rows: list[dict], n: int, ep_ok: torch.Tensor, n_bad: torch.Tensor) -> list[dict]:
    """Copies of the rollout-log rows with ``rlvcr_qualified`` / ``rlvcr_malformed_steps``."""
    if len(rows) != n:
        return rows
    return [
        {**row, "rlvcr_qualified": bool(ep_ok[i]), "rlvcr_malformed_steps": int(n_bad[i])}
        for i, row in enumerate(rows)
    ]


class RlvcrCollector:
    """Wraps an episode collector: ``collect`` returns its batch after ``augmenter.augment``."""

    def __init__(self, inner, augmenter: RlvcrAugmenter):
        self.inner = inner
        self.augmenter = augmenter

    @property
    def engine(self) -> RolloutEngine:
        return self.inner.engine

    def collect(self, request: CollectRequest) -> RolloutBatch:
        return self.augmenter.augment(self.inner.collect(request))


def algorithm_settings(algorithm) -> AlgorithmGroupConfig:
    """``cfg.algorithm`` (typed or plain) as its schema: the augmenter reads the config's own keys."""
    plain = OmegaConf.to_container(algorithm, resolve=True) if OmegaConf.is_config(algorithm) else algorithm
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(AlgorithmGroupConfig), plain))


def make_rlvcr_collector(cfg, tokenizer, engine, module, inner) -> RlvcrCollector:
    """The episode collector ``inner`` wrapped with an augmenter built from ``cfg.algorithm``."""
    return RlvcrCollector(
        inner, RlvcrAugmenter(tokenizer, engine, module.actor, algorithm_settings(cfg.algorithm))
    )
