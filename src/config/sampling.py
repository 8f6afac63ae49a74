"""How rollouts are sampled (seed 003's ``SamplingParams``): global defaults, eval and per-lesson overrides.

One place sets each value: ``sampling.*`` is the training default, ``sampling.eval.*`` overrides it
for validation rollouts, and a lesson's override (later) goes through the same ``merge_sampling``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import List, Optional


@dataclass
class SamplingParams:
    """temperature 0 = greedy. ``n_prompts`` prompts (or env seeds) per step, each sampled
    ``n_generations_per_prompt`` times (the GRPO group size). ``stop``: extra stop tokens (strings,
    each one token of the vocabulary) besides the tokenizer's end-of-sequence.

    Also what a rollout engine's ``generate`` takes: ``n`` (= ``n_generations_per_prompt``)
    completions per prompt; ``stop_token_ids``: the stop tokens as ids (``stop`` resolved by
    ``src.rollout.factory.engine_sampling``; not a config key). ``min_new_tokens`` > 0 forbids the
    stop tokens before that many tokens (benchmarks ask for exactly T new tokens with
    ``min_new_tokens = max_new_tokens``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    n_prompts: int = 4
    n_generations_per_prompt: int = 4
    max_new_tokens: int = 64
    min_new_tokens: int = 0  # > 0: no stop token before this many (benchmarks: = max_new_tokens)
    stop: List[str] = field(default_factory=list)
    stop_token_ids: List[int] = field(default_factory=list, metadata={"omegaconf_ignore": True})

    @property
    def n(self) -> int:
        """Completions per prompt of one ``generate`` call: ``n_generations_per_prompt``."""
        return self.n_generations_per_prompt


@dataclass
class SamplingOverride:
    """A partial ``SamplingParams``: ``None`` keeps the value it overrides."""

    temperature: Optional[float] = None
    top_p: Optional[float] = None
    n_prompts: Optional[int] = None
    n_generations_per_prompt: Optional[int] = None
    max_new_tokens: Optional[int] = None
    min_new_tokens: Optional[int] = None
    stop: Optional[List[str]] = None
    stop_token_ids: Optional[List[int]] = field(default=None, metadata={"omegaconf_ignore": True})


def _greedy_eval() -> SamplingOverride:
    return SamplingOverride(temperature=0.0, top_p=1.0, n_prompts=8, n_generations_per_prompt=1)


@dataclass
class SamplingConfig(SamplingParams):
    """The ``sampling`` group: the training defaults plus the validation override (greedy, one each)."""

    eval: SamplingOverride = field(default_factory=_greedy_eval)


def merge_sampling(base: SamplingParams, override: SamplingOverride | None) -> SamplingParams:
    """``base`` with every non-None field of ``override`` replacing it (a new plain SamplingParams)."""
    plain = SamplingParams(**{f.name: getattr(base, f.name) for f in fields(SamplingParams)})
    if override is None:
        return plain
    changes = {f.name: getattr(override, f.name) for f in fields(SamplingOverride)}
    return replace(plain, **{k: (list(v) if k == "stop" else v) for k, v in changes.items() if v is not None})


def train_sampling(sampling: SamplingConfig) -> SamplingParams:
    return merge_sampling(sampling, None)


def eval_sampling(sampling: SamplingConfig) -> SamplingParams:
    return merge_sampling(sampling, sampling.eval)
