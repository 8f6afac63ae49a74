"""RLVCR on collected multi-step episodes: alternative thinking, scoring, token advantages.

Given a :class:`RolloutBatch` whose ``episodes`` came from the episode collector, for every step
of a qualifying episode (see ``qualifying_episodes``) that parses as a well-formed RLVCR step:

1. the history is everything before that turn's first generated token
   (``prompt_ids + response_ids[:action_start]``);
2. the thinking of the levels the policy did not use is generated from that history with the
   level's prompt (``build_level_prompt``; level 1 needs no generation) — all steps × levels in
   ONE ``engine.generate`` call — and cut before ``<action>``;
3. the original action is scored after the four contexts ``thinking_k + <action>`` with one
   batched teacher-forced pass (``score_level_groups``);
4. ``rlvcr_advantage`` combines the trajectory GRPO advantage (episodes grouped by uid, reward
   minus the format penalty) with ``w`` × the thinking advantage, and the result is written as
   ``batch.token_advantages`` [N, T]: each step's advantage on that turn's generated tokens, the
   trajectory advantage on every other generated token (steps that did not qualify or parse get
   thinking advantage 0 by construction, so their tokens carry the trajectory advantage).

The batch keeps everything else; the module trains on ``token_advantages`` when present.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from src.models.advantages import group_ids
from src.models.rlvcr_advantage import make_level_scores, rlvcr_advantage, rlvcr_metrics
from src.rollout.batch import RolloutBatch
from src.rollout.engine import RolloutEngine, SamplingParams
from src.rollout.episode_prompts import EpisodeTemplates, stop_token_ids
from src.rollout.rlvcr_format import ACTION_OPEN, LEVELS, THINK_CLOSE, StepParse, parse_step
from src.rollout.rlvcr_prompts import build_level_prompt, extract_level_thinking, level_tag
from src.rollout.rlvcr_scoring import ScoringGroup, score_level_groups

log = logging.getLogger(__name__)

QUALIFY_MODES = ("threshold", "group_mean", "all")

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
@dataclass
class RlvcrSettings:
    """Everything the augmenter needs (built from ``cfg.algorithm`` by ``settings_from_algorithm``).

    w, alpha, cost_max, mode: the RLVCR formula (see ``src.models.rlvcr_advantage``).
    qualify: which episodes get the thinking advantage: ``threshold`` (reward > qualify_threshold),
        ``group_mean`` (reward >= the mean reward of its uid group, i.e. the better half of each
        group; a group whose rewards are all equal qualifies whole), ``all``.
    format_penalty: subtracted from an episode's reward, scaled by its fraction of malformed steps
        among the executed ones (so the penalty is at most ``format_penalty`` whatever the episode
        length; a turn cut off by the token budget is not a step the env saw).
    think_*: sampling of the alternative thinking.
    score_max_rows: rows per teacher-forced forward (None = all rows in one forward).
    allow_unclosed_action: accept a step without ``</action>`` (engines that stop on it and drop it).
    score_malformed_steps: also score steps that break the format but carry an action (the
        command the env received): their level is the declared one when it parses, else 1 (the
        step acted without a usable thinking level). Off by default; useful while a model has not
        learned the format yet (the format penalty still applies to those steps).
    """

    w: float = 1.0
    alpha: float = 0.1
    cost_max: float = 64.0
    mode: str = "logprob"
    qualify: str = "threshold"
    qualify_threshold: float = 0.0
    format_penalty: float = 0.0
    think_max_new_tokens: int = 64
    think_temperature: float = 1.0
    think_top_p: float = 1.0
    score_max_rows: int | None = None
    allow_unclosed_action: bool = True
    score_malformed_steps: bool = False
    adv_eps: float = 1e-6
    norm_by_std: bool = True

    def __post_init__(self) -> None:
        if self.qualify not in QUALIFY_MODES:
            raise ValueError(f"RLVCR qualify={self.qualify!r}; expected one of {list(QUALIFY_MODES)}")
        if self.cost_max <= 0:
            raise ValueError(f"RLVCR cost_max must be > 0, got {self.cost_max}")
        if self.think_max_new_tokens < 1:
            raise ValueError(f"RLVCR think_max_new_tokens must be >= 1, got {self.think_max_new_tokens}")


# config key in ``cfg.algorithm`` -> RlvcrSettings field
_ALGORITHM_KEYS = {
    "step_advantage_w": "w",
    "thinking_cost_alpha": "alpha",
    "cost_max": "cost_max",
    "rlvcr_mode": "mode",
    "rlvcr_qualify": "qualify",
    "rlvcr_qualify_threshold": "qualify_threshold",
    "rlvcr_format_penalty": "format_penalty",
    "rlvcr_think_max_new_tokens": "think_max_new_tokens",
    "rlvcr_think_temperature": "think_temperature",
    "rlvcr_think_top_p": "think_top_p",
    "rlvcr_score_max_rows": "score_max_rows",
    "rlvcr_allow_unclosed_action": "allow_unclosed_action",
    "rlvcr_score_malformed_steps": "score_malformed_steps",
    "adv_eps": "adv_eps",
    "norm_adv_by_std": "norm_by_std",
}


def settings_from_algorithm(algorithm: Any) -> RlvcrSettings:
    """RlvcrSettings from a mapping (``cfg.algorithm``); missing keys keep their defaults."""
    get = algorithm.get if hasattr(algorithm, "get") else lambda k, d=None: getattr(algorithm, k, d)
    kwargs = {field_name: get(key) for key, field_name in _ALGORITHM_KEYS.items() if get(key) is not None}
    return RlvcrSettings(**kwargs)


# ---------------------------------------------------------------------------- pure math
def qualifying_episodes(
    rewards: torch.Tensor, groups: torch.Tensor, mode: str, threshold: float = 0.0
) -> torch.Tensor:
    """Which episodes get the thinking advantage. rewards [N] float, groups [N] long -> [N] bool."""
    rewards = rewards.float()
    if mode == "all":
        return torch.ones_like(rewards, dtype=torch.bool)
    if mode == "threshold":
        return rewards > threshold
    if mode == "group_mean":
        if rewards.numel() == 0:
            return torch.zeros(0, dtype=torch.bool)
        n_groups = int(groups.max()) + 1
        sums = torch.zeros(n_groups).index_add_(0, groups, rewards)
        counts = torch.zeros(n_groups).index_add_(0, groups, torch.ones_like(rewards))
        mean = (sums / counts)[groups]
        return rewards >= mean - 1e-6 * (1.0 + mean.abs())  # tolerance: the mean's own rounding
    raise ValueError(f"RLVCR qualify={mode!r}; expected one of {list(QUALIFY_MODES)}")


def penalised_rewards(rewards: torch.Tensor, malformed_frac: torch.Tensor, penalty: float) -> torch.Tensor:
    """``reward - |penalty| * malformed_frac``. [N], [N] -> [N] float32."""
    return rewards.float() - abs(float(penalty)) * malformed_frac.float()


def scatter_step_advantages(
    response_mask: torch.Tensor,
    trajectory_adv: torch.Tensor,
    step_row: torch.Tensor,
    step_start: torch.Tensor,
    step_end: torch.Tensor,
    step_adv: torch.Tensor,
) -> torch.Tensor:
    """Token advantages: the row's trajectory advantage on every response token, then each step's
    advantage on its tokens ``[step_start, step_end)``; zero where ``response_mask`` is 0.

    Args:
        response_mask: [N, T]; trajectory_adv: [N].
        step_row, step_start, step_end: [S] long (row of the step and its half-open token span).
        step_adv: [S] float.
    Returns:
        [N, T] float32.
    """
    n, t = response_mask.shape
    out = trajectory_adv.float()[:, None].expand(n, t).clone()
    if step_row.numel():
        pos = torch.arange(t)
        inside = (pos[None, :] >= step_start[:, None]) & (pos[None, :] < step_end[:, None])  # [S, T]
        hit = torch.zeros((n, t), dtype=torch.long).index_add_(0, step_row, inside.long())
        if int(hit.max()) > 1:
            raise ValueError("scatter_step_advantages: step token spans overlap")
        vals = torch.zeros((n, t)).index_add_(0, step_row, inside.float() * step_adv.float()[:, None])
        out = torch.where(hit > 0, vals, out)
    return out * response_mask.float()


# ---------------------------------------------------------------------------- orchestration
@dataclass
class StepRef:
    """One step of one episode, as the augmenter sees it.

    parse: the step's parse (its declared level feeds the metrics).
    level / think / action: what is scored: the step's level (None = not scorable), its own thinking
        and its action text.
    executed: False for a turn the token budget cut off (never sent to the env): it is neither
        scored nor counted as malformed; its tokens carry the trajectory advantage.
    """

    row: int
    start: int
    end: int
    parse: StepParse
    history_ids: list[int]
    level: int | None
    think: str
    action: str
    executed: bool = True
    qualifies: bool = False


def scored_step(parse: StepParse, env_action: str, score_malformed: bool) -> tuple[int | None, str, str]:
    """(level, thinking, action) to score for one step; level None when the step is not scorable.

    A well-formed step is scored as written. A malformed one only with ``score_malformed``: the
    declared level when it parses (else 1), its thinking for levels > 1, and its action (else the
    command the env received); without any action it is not scorable.
    """
    if not parse.malformed:
        return parse.level, parse.think, parse.action
    action = parse.action or env_action.strip()
    if not score_malformed or not action:
        return None, "", ""
    level = parse.level or 1
    return level, (parse.think if level > 1 else ""), action


@dataclass
class TagIds:
    """Token ids of the tags, each tokenised on its own (``score_level_groups`` needs this)."""

    action: list[int]
    levels: list[list[int]]
    stop: list[int] = field(default_factory=list)


def tag_ids(tokenizer) -> TagIds:
    """Tag ids for ``tokenizer``; single-token ``<action>`` / ``</think>`` become stop ids for the
    alternative-thinking generation (multi-token tags rely on max_new_tokens and truncation)."""
    enc = lambda s: list(tokenizer(s, add_special_tokens=False)["input_ids"])  # noqa: E731
    action = enc(ACTION_OPEN)
    stop = [ids[0] for ids in (action, enc(THINK_CLOSE)) if len(ids) == 1]
    return TagIds(action=action, levels=[enc(level_tag(k)) for k in LEVELS], stop=stop)


class RlvcrAugmenter:
    """Adds RLVCR token advantages and metrics to an episode batch (in place).

    Args:
        tokenizer: HF tokenizer of the policy.
        engine: rollout engine (``generate(prompt_ids, SamplingParams) -> Completions``).
        model: the actor, used for the teacher-forced scoring (put in eval mode while scoring).
        settings: RlvcrSettings.
    """

    def __init__(self, tokenizer, engine: RolloutEngine, model, settings: RlvcrSettings):
        self.tokenizer = tokenizer
        self.engine = engine
        self.model = model
        self.settings = settings
        self.tags = tag_ids(tokenizer)
        # dropped before parsing / building prompts: padding and the tokens that end a turn
        self.drop_ids = {tokenizer.pad_token_id, tokenizer.eos_token_id, *stop_token_ids(tokenizer)}

    def _enc(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _dec(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode([t for t in ids if t not in self.drop_ids], skip_special_tokens=False)

    # -------------------------------------------------------------- steps
    def _steps(self, episodes: Sequence[Any], n_rows: int, width: int) -> list[StepRef]:
        if len(episodes) != n_rows:
            raise ValueError(f"RLVCR: batch has {n_rows} rows but {len(episodes)} episodes")
        steps = []
        for row, ep in enumerate(episodes):
            prompt, response = list(ep.prompt_ids), [int(t) for t in ep.response_ids]
            for j, st in enumerate(ep.steps):
                if not 0 <= st.action_start <= st.action_end <= min(len(response), width):
                    raise ValueError(
                        f"RLVCR: episode {row} step {j}: token span [{st.action_start}, {st.action_end}) "
                        f"is outside its {len(response)} response tokens (batch width {width})"
                    )
                # the turn's own ids, decoded without its stop token (generated_text keeps it)
                text = self._dec(response[st.action_start : st.action_end])
                parse = parse_step(text, allow_unclosed_action=self.settings.allow_unclosed_action)
                level, think, action = scored_step(parse, st.action_text, self.settings.score_malformed_steps)
                steps.append(
                    StepRef(
                        row,
                        st.action_start,
                        st.action_end,
                        parse,
                        prompt + response[: st.action_start],
                        level,
                        think,
                        action,
                        executed=bool(getattr(st, "executed", True)),
                    )
                )
        return steps

    # -------------------------------------------------------------- generation + scoring
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
        out = self.engine.generate(
            prompts,
            SamplingParams(
                n=1,
                temperature=st.think_temperature,
                top_p=st.think_top_p,
                max_new_tokens=st.think_max_new_tokens,
                stop_token_ids=self.tags.stop,
            ),
        )
        lists = out.token_lists()
        for (i, k), ids in zip(jobs, lists):
            contexts[i][k - 1] = extract_level_thinking(self._dec(ids), k)
        return contexts, sum(len(ids) for ids in lists)

    def _score(self, steps: list[StepRef], contexts: list[list[str]]):
        groups = []
        for s, ctx in zip(steps, contexts):
            thinking = [
                tag + self._enc(text[len(level_tag(k)) :])
                for k, tag, text in zip(LEVELS, self.tags.levels, ctx)
            ]
            groups.append(ScoringGroup(s.history_ids, thinking, self._enc(s.action)))
        was_training = self.model.training
        self.model.eval()
        try:
            return score_level_groups(
                self.model,
                groups,
                self.tags.action,
                self.tags.levels,
                self.tokenizer.pad_token_id,
                max_rows=self.settings.score_max_rows,
            )
        finally:
            self.model.train(was_training)

    # -------------------------------------------------------------- entry point
    @torch.no_grad()
    def augment(self, batch: RolloutBatch) -> RolloutBatch:
        """Write ``batch.token_advantages`` [N, T] and ``rlvcr/*`` metrics; returns the same batch."""
        t0 = time.perf_counter()
        st = self.settings
        episodes = getattr(batch, "episodes", None)
        if episodes is None:
            raise ValueError(
                "RLVCR needs the episode list on the batch (batch.episodes); use the episode collector"
            )
        n, width = batch.response_mask.shape
        steps = self._steps(episodes, n, width)

        groups = group_ids(batch.uids)
        raw = torch.tensor([float(ep.reward) for ep in episodes], dtype=torch.float32)
        n_steps = torch.zeros(n)
        for s in steps:
            n_steps[s.row] += float(s.executed)
        n_bad = torch.zeros(n)
        for s in steps:
            n_bad[s.row] += float(s.parse.malformed and s.executed)
        rewards = penalised_rewards(raw, n_bad / n_steps.clamp(min=1), st.format_penalty)
        ep_ok = qualifying_episodes(raw, groups, st.qualify, st.qualify_threshold)
        for s in steps:
            s.qualifies = (
                bool(ep_ok[s.row]) and s.executed and s.level is not None and bool(self._enc(s.action))
            )

        scored = [s for s in steps if s.qualifies]
        scores = torch.zeros(len(steps), 4)
        costs = torch.zeros(len(steps), 4)
        alt_tokens = 0
        if scored:
            contexts, alt_tokens = self._alternative_thinking(scored)
            level_scores = self._score(scored, contexts)
            idx = torch.tensor([i for i, s in enumerate(steps) if s.qualifies], dtype=torch.long)
            scores[idx] = make_level_scores(level_scores.action_logprob, level_scores.action_entropy, st.mode)
            costs[idx] = level_scores.thinking_tokens.float()

        orig = torch.tensor([(s.level or 1) - 1 for s in steps], dtype=torch.long)
        qualifies = torch.tensor([s.qualifies for s in steps], dtype=torch.bool)
        step_row = torch.tensor([s.row for s in steps], dtype=torch.long)
        adv = rlvcr_advantage(
            rewards,
            groups,
            step_row,
            scores,
            costs,
            orig,
            qualifies,
            cost_max=st.cost_max,
            alpha=st.alpha,
            w=st.w,
            eps=st.adv_eps,
            norm_by_std=st.norm_by_std,
        )
        batch.token_advantages = scatter_step_advantages(
            batch.response_mask,
            adv.trajectory_adv,
            step_row,
            torch.tensor([s.start for s in steps], dtype=torch.long),
            torch.tensor([s.end for s in steps], dtype=torch.long),
            adv.advantage,
        )

        own_thinking = torch.tensor(
            [len(self._enc(s.parse.think)) if s.parse.think else 0 for s in steps], dtype=torch.float32
        )
        metrics = rlvcr_metrics([s.parse.level for s in steps], own_thinking, adv.thinking_adv, qualifies)
        elapsed = time.perf_counter() - t0
        metrics.update(
            {
                "rlvcr/qualifying_episodes": float(ep_ok.sum()),
                "rlvcr/malformed_step_frac": float(n_bad.sum() / max(len(steps), 1)),
                "rlvcr/alt_thinking_tokens": float(alt_tokens),
                "rlvcr/trajectory_adv_abs_mean": float(adv.trajectory_adv.abs().mean()) if n else 0.0,
                "timing/rlvcr_s": elapsed,
            }
        )
        batch.metrics.update(metrics)
        # count the augmentation with the rollout's scoring time (the module's tokens/sec uses it)
        batch.metrics["timing/scoring_s"] = batch.metrics.get("timing/scoring_s", 0.0) + elapsed
        if len(batch.rows) == n:
            for i, row in enumerate(batch.rows):
                row["rlvcr_qualified"] = bool(ep_ok[i])
                row["rlvcr_malformed_steps"] = int(n_bad[i])
        log.debug(
            "RLVCR: %d steps, %d scored, %d alternative thinking tokens, %.2fs",
            len(steps),
            len(scored),
            alt_tokens,
            elapsed,
        )
        return batch


class RlvcrCollector:
    """Wraps an episode collector: ``collect`` returns its batch after ``augmenter.augment``."""

    def __init__(self, inner, augmenter: RlvcrAugmenter):
        self.inner = inner
        self.augmenter = augmenter

    @property
    def engine(self):
        return getattr(self.inner, "engine", None)

    def collect(
        self, records, step: int, lam: float = 0.0, generator: torch.Generator | None = None
    ) -> RolloutBatch:
        return self.augmenter.augment(self.inner.collect(records, step=step, lam=lam, generator=generator))


def make_rlvcr_collector(cfg, tokenizer, engine, module, inner) -> RlvcrCollector:
    """The episode collector ``inner`` wrapped with an augmenter built from ``cfg.algorithm``."""
    return RlvcrCollector(
        inner, RlvcrAugmenter(tokenizer, engine, module.actor, settings_from_algorithm(cfg.algorithm))
    )
