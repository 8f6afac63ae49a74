"""Each bad override the entry point can be given is named, in-process: composed with
``compose_job`` (unknown keys and wrong types fail there, naming the key) and checked with
``validate_job`` (ranges, combinations, registries), as ``scripts/train.py`` does before anything
is built. ``tests/e2e/test_entry_point.py`` runs one case of each kind through the real entry point."""

from __future__ import annotations

import pytest

from src.config.job import compose_job
from src.config.validate import ConfigError
from src.jobs.checks import validate_job

CASES = [
    ("router.budgett=0.2", "router.budgett"),
    ("+algorithm.kl_coeff=1", "algorithm.kl_coeff"),
    ("router.budget=abc", "router.budget"),
    ("algorithm.optim.lr=abc", "algorithm.optim.lr"),
    ("rollout.n=0", "rollout.n"),
    ("sampling.n_generations_per_prompt=0", "sampling.n_generations_per_prompt"),
    ("router.budget=-1", "router.budget"),
    ("data.train_files=/x.parquet", "data.train_files: file not found: /x.parquet"),
    ("trainer.max_steps=0", "trainer.max_steps"),
    ("router.lambda_init=inf", "router.lambda_init"),
    ("rollout.engines.vllm.max_model_len=4096", "rollout.engines.vllm.max_model_len=4096 exceeds the model's 2048"),
    ("rollout.engines.hf.decode=generate", "rollout.keyed_draws=true: rollout.engines.hf.decode=generate draws"),
]


def error_of(overrides: list[str]) -> str:
    """What stops the job: the composition's error, or every problem ``validate_job`` names."""
    try:
        cfg = compose_job(overrides)
    except Exception as err:  # noqa: BLE001 - Hydra / OmegaConf raise several types, all naming the key
        return str(err)
    try:
        validate_job(cfg)
    except ConfigError as err:
        return str(err)
    return ""


@pytest.mark.parametrize("override, named", CASES, ids=[c[0] for c in CASES])
def test_bad_override_is_named_before_anything_is_built(tmp_path, override, named):
    found = error_of(["experiment=router_grpo", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=1", override])
    assert named in found, found
    assert not (tmp_path / "run").exists()


def test_keyed_draws_with_an_engine_that_draws_from_one_stream_are_named(tmp_path):
    """vLLM's server mode sends one seed per request: keyed draws are refused there, and allowed once
    switched off (the HF ``generate`` decoder likewise, in CASES)."""
    base = ["experiment=router_grpo", f"run_dir={tmp_path / 'run'}", "rollout=vllm", "rollout.engines.vllm.mode=server"]
    assert "rollout.keyed_draws=true: rollout.engines.vllm.mode=server draws" in error_of(base)
    assert "rollout.keyed_draws" not in error_of([*base, "rollout.keyed_draws=false"])
    assert "rollout.keyed_draws" not in error_of(["experiment=router_grpo", "rollout.engines.hf.decode=loop"])
