"""Sampling params: one object, eval and per-lesson overrides merged field by field."""

from __future__ import annotations

import dataclasses
import random

import pytest

from src.config.job import compose_job
from src.config.sampling import (
    SamplingConfig,
    SamplingOverride,
    SamplingParams,
    eval_sampling,
    merge_sampling,
)


def _random_override(rng: random.Random) -> SamplingOverride:
    values = {
        "temperature": rng.uniform(0.1, 2.0),
        "top_p": rng.uniform(0.1, 1.0),
        "n_prompts": rng.randint(1, 16),
        "n_generations_per_prompt": rng.randint(1, 8),
        "max_new_tokens": rng.randint(1, 512),
        "stop": [f"<t{rng.randint(0, 9)}>"],
    }
    return SamplingOverride(**{k: (v if rng.random() < 0.5 else None) for k, v in values.items()})


def test_merge_matches_a_field_by_field_reference():
    rng = random.Random(0)
    for _ in range(200):
        base = SamplingParams(temperature=rng.uniform(0.1, 2), n_prompts=rng.randint(1, 9), stop=["</s>"])
        override = _random_override(rng)
        merged = merge_sampling(base, override)
        for f in dataclasses.fields(SamplingParams):
            want = getattr(override, f.name)
            assert getattr(merged, f.name) == (getattr(base, f.name) if want is None else want)
    assert (
        merge_sampling(base, None) == base and type(merge_sampling(SamplingConfig(), None)) is SamplingParams
    )


def test_eval_sampling_is_greedy_and_keeps_the_training_length():
    cfg = SamplingConfig(max_new_tokens=80)
    ev = eval_sampling(cfg)
    assert (ev.temperature, ev.n_generations_per_prompt, ev.max_new_tokens) == (0.0, 1, 80)


def test_experiments_set_sampling_in_one_place():
    from src.rollout.factory import eval_sampling_from, sampling_from

    class Tok:
        def encode(self, text, add_special_tokens=False):
            return [len(text)] if text.startswith("<") else [1, 2]

    cfg = compose_job(["experiment=router_grpo", "sampling.stop=['<x>']"])
    train, ev = sampling_from(cfg, Tok()), eval_sampling_from(cfg, Tok())
    assert (train.n, train.max_new_tokens, train.temperature, train.stop_token_ids) == (4, 56, 0.3, [3])
    assert (ev.n, ev.max_new_tokens, ev.temperature) == (1, 56, 0.0)
    with pytest.raises(ValueError, match="sampling.stop"):
        sampling_from(compose_job(["experiment=grpo", "sampling.stop=['two words']"]), Tok())
