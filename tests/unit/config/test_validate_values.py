"""Every value is checked before anything is written: non-finite numbers for every float key (found
by walking the composed config, so the test covers keys added later), the episode environment's
limits and confinement, all-zero synthetic proportions, a model directory whose config.json is not
JSON. Through the entry point (exit 2 naming the key, no artefact): ``tests/e2e/test_entry_point.py``."""

from __future__ import annotations

import math

import pytest
from omegaconf import OmegaConf

from src.config.job import compose_job
from src.config.validate import ConfigError, _leaves, validate


def problems_of(cfg) -> list[str]:
    try:
        validate(cfg)
    except ConfigError as err:
        return err.problems
    return []


def named(problems: list[str], key: str) -> bool:
    return any(p.startswith(f"{key}:") or p.startswith(f"{key}=") or f" {key}" in p for p in problems)


EXPERIMENTS = ["grpo", "router_grpo", "mlgym_grpo", "curriculum", "rlvcr", "sft"]


@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("bad", [math.inf, -math.inf, math.nan], ids=["inf", "-inf", "nan"])
def test_every_float_key_rejects_non_finite(experiment, bad):
    """Each float leaf of the composed config, set to inf / -inf / nan, is named by validate() in a
    line of its own: all of them at once (validate lists every problem), one check per config."""
    base = compose_job([f"experiment={experiment}"])
    assert problems_of(base) == []
    floats = [key for key, value, _ in _leaves(base, "") if isinstance(value, float)]
    assert len(floats) > 10, floats
    cfg = base.copy()
    for key in floats:
        OmegaConf.update(cfg, key, bad, merge=False)
    problems = problems_of(cfg)
    missed = [key for key in floats if not any(p.startswith(f"{key}:") for p in problems)]
    # a key whose schema default is +-inf ("never") may take +-inf; nan is always refused
    allowed = {k for k in missed if not math.isnan(bad) and _schema_inf(base, k)}
    assert sorted(set(missed) - allowed) == []


def _schema_inf(cfg, key: str) -> bool:
    return any(k == key and isinstance(d, float) and math.isinf(d) for k, _, d in _leaves(cfg, ""))


@pytest.mark.parametrize(
    "override, key",
    [
        ("algorithm.optim.lr=inf", "algorithm.optim.lr"),
        ("sampling.temperature=inf", "sampling.temperature"),
        ("router.lr=inf", "router.lr"),
        ("router.entropy_coef=inf", "router.entropy_coef"),
        ("router.lambda_init=inf", "router.lambda_init"),
        ("router.budget=nan", "router.budget"),
    ],
)
def test_issue_cases_named(override, key):
    assert named(problems_of(compose_job(["experiment=router_grpo", override])), key)


@pytest.mark.parametrize(
    "override, key",
    [
        ("env.memory_mb=0", "env.memory_mb"),
        ("env.command_timeout_s=0", "env.command_timeout_s"),
        ("env.eval_timeout_s=-5", "env.eval_timeout_s"),
        ("env.simulations=0", "env.simulations"),
        ("env.rounds=0", "env.rounds"),
        ("env.max_steps=0", "env.max_steps"),
        ("env.max_processes=0", "env.max_processes"),
        ("env.file_size_mb=-1", "env.file_size_mb"),
        ("env.max_output_chars=0", "env.max_output_chars"),
        ("env.confinement=none", "env.confinement"),
    ],
)
def test_env_values_named(override, key):
    assert named(problems_of(compose_job(["experiment=mlgym_grpo", override])), key)


def test_all_zero_synthetic_proportions_named():
    found = problems_of(
        compose_job(
            [
                "experiment=grpo",
                "data.synthetic.p_search=0",
                "data.synthetic.p_calculate=0",
                "data.synthetic.p_answer=0",
            ]
        )
    )
    assert any("data.synthetic.p_search" in p and "all zero" in p for p in found), found


def test_model_config_not_json_named(tmp_path):
    from src.models.loading import resolve_model_path

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{ not json")
    found = problems_of(compose_job(["experiment=grpo", f"model.path={model}"]))
    assert any(str(model / "config.json") in p and "not valid JSON" in p for p in found), found
    with pytest.raises(ValueError, match=str(model / "config.json")):
        resolve_model_path(str(model), str(tmp_path / "cache"))
