"""``algorithm.dynamic_sampling``: off by default, and each bad setting is named by its key at start-up."""

from __future__ import annotations

import pytest
from test_validate import keys, problems

from src.config.job import compose_job

ON = "algorithm.dynamic_sampling.enable=true"


def test_off_by_default_and_a_plain_enable_is_valid():
    cfg = compose_job(["experiment=router_grpo"])
    assert cfg.algorithm.dynamic_sampling.enable is False
    assert problems(ON, base="experiment=router_grpo") == []
    assert problems(ON, "algorithm.dynamic_sampling.on=actor") == []  # router off: the actor's reward


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["algorithm.dynamic_sampling.on=both"], "algorithm.dynamic_sampling.on"),
        (["algorithm.dynamic_sampling.on=router"], "algorithm.dynamic_sampling.on"),  # router off
        (["algorithm.dynamic_sampling.max_extra_batches=-1"], "algorithm.dynamic_sampling.max_extra_batches"),
        (["algorithm.dynamic_sampling.eps=0"], "algorithm.dynamic_sampling.eps"),
        (["sampling.n_generations_per_prompt=1"], "algorithm.dynamic_sampling.enable"),
        (["replay.capacity=8"], "algorithm.dynamic_sampling.enable"),
        (["trainer.strategy=fsdp", "trainer.devices=2"], "algorithm.dynamic_sampling.enable"),
    ],
)
def test_bad_setting_is_named(overrides, key):
    assert key in keys(problems(ON, *overrides))
    assert key not in keys(problems(*overrides))  # only checked when enabled
