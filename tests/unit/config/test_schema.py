"""The typed job config: every shipped experiment and group option composes and validates; unknown
keys (override, ``+key=``, experiment file) and wrong types fail naming the key."""

from __future__ import annotations

import shutil

import pytest
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from src.config.job import (
    CONFIG_DIR,
    LocalGameEnvConfig,
    MLGymEnvConfig,
    RllaDataConfig,
    SeedsDataConfig,
    compose_job,
)
from src.config.validate import ConfigError, validate

SHIPPED = [
    ["experiment=grpo"],
    ["experiment=router_grpo"],
    ["experiment=router_grpo_gpt_oss"],
    ["experiment=mlgym_grpo"],
    ["experiment=mlgym_grpo", "env=mlgym"],
    ["experiment=mlgym_grpo", "env=local_pd"],
    ["experiment=rlvcr"],
    ["experiment=sft"],
    ["experiment=grpo", "algorithm=rlvcr"],
]


@pytest.mark.parametrize("overrides", SHIPPED, ids=lambda o: " ".join(o))
def test_shipped_configs_compose_and_validate(overrides):
    validate(compose_job(overrides))


@pytest.mark.parametrize("option", ["data=rlla", "data=rlla_gpt", "rollout=vllm"])
def test_options_that_need_files_or_extras_compose(option):
    cfg = compose_job(["experiment=grpo", option])  # validation may refuse them here (no data / no vLLM)
    assert OmegaConf.select(cfg, option.split("=")[0]) is not None


def test_polymorphic_groups_carry_their_schema():
    grpo, episodes, mlgym = (
        compose_job(["experiment=grpo"]),
        compose_job(["experiment=mlgym_grpo"]),
        compose_job(["experiment=mlgym_grpo", "env=mlgym"]),
    )
    assert OmegaConf.get_type(grpo.data) is RllaDataConfig
    assert OmegaConf.get_type(episodes.data) is SeedsDataConfig
    assert OmegaConf.get_type(episodes.env) is LocalGameEnvConfig
    assert OmegaConf.get_type(mlgym.env) is MLGymEnvConfig


@pytest.mark.parametrize(
    "override, key",
    [
        ("router.budgett=0.2", "router.budgett"),
        ("router.budget=abc", "router.budget"),
        ("algorithm.optim.lr=abc", "algorithm.optim.lr"),
        ("rollout.n=0", "rollout.n"),
        ("env.simulations=3", "env.simulations"),  # env=none has no game keys
        ("sampling.n_prompts=two", "sampling.n_prompts"),
        ("trainer.val_check_interval=often", "trainer.val_check_interval"),
    ],
)
def test_bad_overrides_fail_at_composition_naming_the_key(override, key):
    with pytest.raises(ConfigCompositionException) as err:
        compose_job(["experiment=grpo", override])
    text = str(err.value) + str(err.value.__cause__)
    assert key in text


def test_plus_override_is_refused_by_validate():
    cfg = compose_job(["experiment=grpo", "+algorithm.kl_coeff=1", "+model.tiny.layers=3"])
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert [p.split(":")[0] for p in err.value.problems] == ["model.tiny.layers", "algorithm.kl_coeff"]


@pytest.mark.parametrize(
    "body, key",
    [
        ("router:\n  budgett: 0.2\n", "budgett"),
        ("sampling:\n  temprature: 0.7\n", "temprature"),
        ("env:\n  token_budgett: 10\n", "token_budgett"),
        ("algorithm:\n  optim:\n    lr: fast\n", "lr"),
    ],
)
def test_experiment_file_typos_fail(tmp_path, body, key):
    configs = tmp_path / "configs"
    shutil.copytree(CONFIG_DIR, configs)
    (configs / "experiment" / "typo.yaml").write_text("# @package _global_\n" + body)
    with pytest.raises(Exception) as err:
        compose_job(["experiment=typo"], configs)
    text = f"{err.value} {err.value.__cause__}"
    assert key in text
