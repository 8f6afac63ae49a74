"""GPU runs (skipped without CUDA): bf16 on one GPU, and the sharded strategies with checkpoint +
resume giving the same first losses as a single-device run."""

import importlib.util

import pytest
import torch
from jobhelpers import run_train, scalars

pytestmark = pytest.mark.gpu

GPU = [
    "trainer.accelerator=gpu",
    "trainer.devices=1",
    "trainer.precision=bf16-mixed",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
]


def test_grpo_bf16_on_one_gpu(tmp_path):
    run_train("experiment=grpo", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2", *GPU)
    assert "train/tokens_per_sec" in scalars(tmp_path / "run")


@pytest.mark.parametrize("strategy", ["fsdp", "deepspeed_stage_2", "deepspeed_stage_3"])
def test_sharded_strategy_runs_checkpoints_resumes_and_matches_single_device(tmp_path, strategy):
    if strategy.startswith("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed not installed")
    common = ["experiment=grpo", "trainer.save_freq=1", "algorithm.use_kl_loss=false", *GPU]
    run_train(*common, f"run_dir={tmp_path / 'single'}", "trainer.max_steps=2")
    run_train(
        *common, f"run_dir={tmp_path / 'sharded'}", "trainer.max_steps=1", f"trainer.strategy={strategy}"
    )
    run_train(
        *common,
        f"run_dir={tmp_path / 'sharded'}",
        "trainer.max_steps=2",
        f"trainer.strategy={strategy}",
        "resume=true",
    )
    single, sharded = scalars(tmp_path / "single"), scalars(tmp_path / "sharded")
    assert sharded["train/reward_task_mean"][0][1] == pytest.approx(single["train/reward_task_mean"][0][1])
    assert sharded["train/entropy"][0][1] == pytest.approx(single["train/entropy"][0][1], rel=2e-2)
    assert [s for s, _ in sharded["train/entropy"]] == [s for s, _ in single["train/entropy"]]
    assert torch.cuda.is_available()
