"""validate(): each bad value is named by its key; all problems of a config come in one ConfigError."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from src.algorithms.loss_module import ADVANTAGES
from src.config.job import compose_job, file_list
from src.config.validate import ConfigError, max_positions
from src.jobs.checks import validate_job


def problems(*overrides: str, base: str = "experiment=grpo") -> list[str]:
    try:
        validate_job(compose_job([base, *overrides]))
    except ConfigError as err:
        return err.problems
    return []


def keys(found: list[str]) -> list[str]:
    return [p.split(":")[0].split("=")[0].split(" ")[0] for p in found]


def test_router_hidden_layer_within_the_model():
    for k in (-3, -1, 0, 2):
        assert "router.hidden_layer" not in keys(
            problems(f"router.hidden_layer={k}", base="experiment=router_grpo")
        )


@pytest.mark.parametrize(
    "override, key",
    [
        ("sampling.n_prompts=0", "sampling.n_prompts"),
        ("sampling.n_generations_per_prompt=0", "sampling.n_generations_per_prompt"),
        ("sampling.max_new_tokens=0", "sampling.max_new_tokens"),
        ("sampling.temperature=0", "sampling.temperature"),
        ("sampling.top_p=0", "sampling.top_p"),
        ("sampling.top_p=1.5", "sampling.top_p"),
        ("sampling.eval.temperature=-1", "sampling.eval.temperature"),
        ("algorithm.optim.lr=0", "algorithm.optim.lr"),
        ("algorithm.optim.lr=-1e-5", "algorithm.optim.lr"),
        ("algorithm.clip_ratio_low=1.0", "algorithm.clip_ratio_low"),
        ("algorithm.clip_ratio_high=-0.1", "algorithm.clip_ratio_high"),
        ("algorithm.ppo_epochs=0", "algorithm.ppo_epochs"),
        ("algorithm.micro_batch_size=0", "algorithm.micro_batch_size"),
        ("algorithm.kl_coef=-1", "algorithm.kl_coef"),
        ("algorithm.optim.betas=[0.9,1.0]", "algorithm.optim.betas[1]"),
        ("algorithm.rollout_is=tokens", "algorithm.rollout_is"),
        ("trainer.save_freq=0", "trainer.save_freq"),
        ("data.max_prompt_length=0", "data.max_prompt_length"),
        ("data.synthetic.n_train=0", "data.synthetic.n_train"),
        ("model.warm_start=sfft", "model.warm_start"),
        ("model.dtype=bfloat16", "model.dtype"),  # CPU is fp32 only
        ("task=eval", "task"),
        ("data.format=json", "data.format"),
    ],
)
def test_bad_value_is_named(override, key):
    assert key in keys(problems(override))


@pytest.mark.parametrize("estimator", ADVANTAGES.names())
def test_group_advantages_need_two_generations(estimator):
    found = problems("sampling.n_generations_per_prompt=1", f"algorithm.adv_estimator={estimator}")
    assert keys(found) == ["sampling.n_generations_per_prompt"]
    assert estimator in found[0]


def test_rollout_is_cap_must_be_positive():
    found = problems("algorithm.rollout_is=sequence", "algorithm.rollout_is_cap=0")
    assert keys(found) == ["algorithm.rollout_is_cap"]
    assert problems("algorithm.rollout_is=token", "algorithm.rollout_is_cap=3") == []


def test_prompts_split_evenly_over_devices():
    found = problems("trainer.devices=3", "sampling.n_prompts=4", "sampling.eval.n_prompts=6")
    assert keys(found) == ["sampling.n_prompts"]
    assert (
        problems(
            "trainer.devices=2", "trainer.num_nodes=2", "sampling.n_prompts=8", "sampling.eval.n_prompts=4"
        )
        == []
    )


@pytest.mark.parametrize(
    "overrides, key",
    [
        (["router.budget=-1"], "router.budget"),
        (["router.budget=1.5"], "router.budget"),  # any_tool costs at most 1
        (["router.lambda_lr=0"], "router.lambda_lr"),
        (["router.lambda_init=-0.1"], "router.lambda_init"),
        (["router.lambda_init=0.5", "router.lambda_max=0.2"], "router.lambda_max"),
        (["router.pooling=max"], "router.pooling"),
        (["router.lambda_update=pi"], "router.lambda_update"),
        (["router.lambda_kp=-1"], "router.lambda_kp"),
        (["router.lambda_kd=-0.5"], "router.lambda_kd"),
        (["router.lambda_cost_ema=1.0"], "router.lambda_cost_ema"),
        (["router.ema_decay=1.0"], "router.ema_decay"),
        (["router.ema_decay=-0.1"], "router.ema_decay"),
        (["router.sif_unseen_weight=-0.5"], "router.sif_unseen_weight"),
        (["router.hidden_layer=3"], "router.hidden_layer"),  # the tiny model has 2 layers
        (["router.hidden_layer=-4"], "router.hidden_layer"),
        (["router.input=logits"], "router.input"),
        (["router.input=base_embeddings", "router.hidden_layer=-1"], "router.hidden_layer"),
        (["router.input=base_embeddings", "router.detach_backbone=false"], "router.detach_backbone"),
    ],
)
def test_router_budget_and_lambda_ranges(overrides, key):
    assert key in keys(problems(*overrides, base="experiment=router_grpo"))


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.adv_estimator=nope", "algorithm.adv_estimator"),
        ("algorithm.policy_loss=nope", "algorithm.policy_loss"),
        ("algorithm.kl_estimator=k9", "algorithm.kl_estimator"),
        ("algorithm.loss_agg_mode=sum", "algorithm.loss_agg_mode"),
        ("trainer.strategy=nope", "trainer.strategy"),
    ],
)
def test_names_are_checked_against_their_registries(override, key):
    assert key in keys(problems(override))


def test_a_registered_estimator_passes_without_a_list_to_edit(monkeypatch):
    name = "test_only_estimator"
    monkeypatch.setitem(ADVANTAGES._items, name, lambda rewards, index, norm_by_std=True, eps=1e-6: rewards)
    assert "algorithm.adv_estimator" not in keys(problems(f"algorithm.adv_estimator={name}"))


def test_router_advantage_is_one_of_the_registered_names():
    found = problems("router.advantage=scalarized", base="experiment=router_grpo")
    assert found == [
        "router.advantage: 'scalarized' is not one of ['scalarized_reward', 'scalarized_advantage']"
    ]
    for name in ("scalarized_reward", "scalarized_advantage"):
        assert problems(f"router.advantage={name}", base="experiment=router_grpo") == []


def test_router_sup_term_is_one_of_the_registered_names():
    found = problems("router.sup_term=families", base="experiment=router_grpo")
    assert found == ["router.sup_term: 'families' is not one of ['family', 'route']"]
    for name in ("route", "family"):
        assert problems(f"router.sup_term={name}", base="experiment=router_grpo") == []


def test_every_target_must_import_and_a_bad_one_is_named_by_its_key():
    """Components from ``_target_`` (the defaults and a researcher's own): a target that does not
    import is one problem naming its key, found before the job builds anything."""
    assert problems(base="experiment=router_grpo") == []
    found = problems(
        "algorithm.loss_module._target_=src.algorithms.loss_module.no_such_factory",
        "rollout.collector._target_=no_such_package.make",
        "+trainer.strategies.mine._target_=src.jobs.strategies.ddp",  # a researcher's own, importable
        base="experiment=router_grpo",
    )
    assert keys(found) == ["algorithm.loss_module._target_", "rollout.collector._target_"]
    assert "no_such_factory" in found[0] and "No module named 'no_such_package'" in found[1]


def test_budget_range_follows_the_cost():
    assert problems("router.budget=2.5", "router.cost=per_family", base="experiment=router_grpo") == []
    assert problems("router.budget=50", "router.cost=per_call", base="experiment=router_grpo") == []
    found = problems(
        "router.budget=2",
        "router.cost=per_call",
        "+router.cost_weights.cap=1.5",
        base="experiment=router_grpo",
    )
    assert keys(found) == ["router.budget"]


def test_prompt_plus_response_must_fit_the_tiny_model():
    found = problems("data.max_prompt_length=2000", "sampling.max_new_tokens=100")
    assert len(found) == 1 and "data.max_prompt_length + sampling.max_new_tokens" in found[0]
    assert "2100" in found[0] and "2048" in found[0]
    assert problems("data.max_prompt_length=1948", "sampling.max_new_tokens=100") == []


def test_positions_are_read_from_an_hf_config(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    cfg = compose_job(["experiment=grpo", f"model.path={tmp_path}", "data.max_prompt_length=200"])
    assert max_positions(cfg)[0] == 256
    with pytest.raises(ConfigError, match="exceeds the model's 256 positions"):
        validate_job(cfg)
    missing = problems(f"model.path={tmp_path / 'nope'}")
    assert keys(missing) == ["model.path"]


def _parquet(path):
    pd.DataFrame({"x": [1]}).to_parquet(path)
    return str(path)


def test_a_string_file_list_is_one_file(tmp_path):
    one = _parquet(tmp_path / "a.parquet")
    assert file_list(one) == [one]
    assert problems("data.kind=files", f"data.train_files={one}") == []
    found = problems("data.kind=files", f"data.train_files={tmp_path}/x.parquet")
    assert found == [f"data.train_files: file not found: {tmp_path}/x.parquet"]
    found = problems("data.kind=files", f"data.train_files=[{one},{tmp_path}/y.parquet]", "data.val_files=7")
    assert sorted(keys(found)) == ["data.train_files", "data.val_files"]
    assert keys(problems("data.kind=files")) == ["data.train_files"]  # empty list


def test_env_checks_and_data_env_pairing():
    base = "experiment=mlgym_grpo"
    assert "env.token_budget" in keys(problems("env.token_budget=0", base=base))
    assert "env.step_format" in keys(problems("env.step_format=fancy", base=base))
    assert "env.temperatures[1]" in keys(problems("env.temperatures=[1.0,0]", base=base))
    assert "env.id" in keys(problems("env.id=somewhere", base=base))
    assert "env.enable" in keys(problems("data=synthetic", base=base))
    assert "env.enable" in keys(problems("env=local_bos"))  # prompts data with an environment


def test_all_problems_come_together():
    found = problems("sampling.n_prompts=0", "algorithm.optim.lr=0", "trainer.save_freq=0")
    assert {"sampling.n_prompts", "algorithm.optim.lr", "trainer.save_freq"} <= set(keys(found))
