"""``scripts/train.py experiment=grpo algorithm=<name>`` runs for every loss module (tiny settings)."""

import math

import pandas as pd
import pytest
import torch
from jobhelpers import run_train, scalars

NAMES = ["grpo", "dr_grpo", "rloo", "reinforce_pp", "gspo", "ppo"]


@pytest.mark.parametrize("name", NAMES)
def test_each_loss_module_trains_two_steps(tmp_path, name):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=grpo",
        f"algorithm={name}",
        f"run_dir={run_dir}",
        "trainer.max_steps=2",
        "sampling.n_prompts=2",
        "sampling.max_new_tokens=8",
    )
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 2
    series = scalars(run_dir)
    for tag in ("train/pg_loss", "train/ratio_mean", "train/entropy"):
        assert len(series[tag]) == 2 and all(math.isfinite(v) for _, v in series[tag]), tag
    # the rollout logger found each step's rollouts in training_step's outputs
    assert len(pd.read_parquet(run_dir / "rollouts" / "step_00000001.parquet")) == 2 * 4
