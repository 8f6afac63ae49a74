"""``experiment=grpo`` with the shared-prompt forward on and off: the same first step (rollouts,
loss, KL, entropy) and the same weights after its update, to float tolerance."""

import pytest
import torch
from jobhelpers import run_train, scalars

# PPO minibatches of 4 rows (so the old-log-prob pass runs and rows are regrouped), KL on
OVERRIDES = [
    "experiment=grpo",
    "trainer.max_steps=2",
    "trainer.save_freq=1",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=12",
    "algorithm.ppo_mini_batch_size=4",
    "algorithm.micro_batch_size=3",
    "algorithm.entropy_coeff=0.01",
]
EXACT = ["train/reward_task_mean", "train/response_length_mean"]
CLOSE = ["train/pg_loss", "train/kl", "train/entropy", "train/ratio_mean"]


def run(tmp_path, shared: bool):
    run_dir = tmp_path / f"shared_{shared}"
    run_train(*OVERRIDES, f"run_dir={run_dir}", f"algorithm.shared_prompt_forward={str(shared).lower()}")
    ckpt = torch.load(run_dir / "checkpoints" / "step_00000001.ckpt", map_location="cpu", weights_only=False)
    return scalars(run_dir), ckpt["state_dict"]


def test_first_step_is_the_same_with_the_shared_prompt_forward(tmp_path):
    (plain, plain_weights), (shared, shared_weights) = run(tmp_path, False), run(tmp_path, True)
    for tag in EXACT:
        assert shared[tag][0] == plain[tag][0], tag
    for tag in CLOSE:
        step, value = plain[tag][0]
        assert step == 0 and shared[tag][0][0] == 0
        assert shared[tag][0][1] == pytest.approx(value, rel=1e-4, abs=1e-6), tag
    assert len(shared["train/pg_loss"]) == 2
    assert plain_weights.keys() == shared_weights.keys()
    for name, weight in plain_weights.items():
        torch.testing.assert_close(shared_weights[name], weight, rtol=1e-5, atol=1e-6, msg=name)
