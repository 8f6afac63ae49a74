"""Short end-to-end runs of the configurations the other job tests do not cover."""

import pandas as pd
import torch
from jobhelpers import run_train, scalars


def test_lora_with_ppo_minibatches_counts_one_global_step_per_rl_step(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=grpo",
        f"run_dir={run_dir}",
        "trainer.max_steps=2",
        "model.lora.enable=true",
        "algorithm.ppo_epochs=2",
        "algorithm.ppo_mini_batch_size=4",
        "algorithm.micro_batch_size=2",
        "sampling.n_prompts=2",
        "sampling.max_new_tokens=8",
        "algorithm.kl_estimator=k1",
        "algorithm.loss_agg_mode=seq-mean-token-mean",
    )
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 2
    assert any("lora_A" in k for k in last["state_dict"])
    # 2 epochs x (8 rollouts / 4 per minibatch) = 4 optimizer steps per RL step, 8 in all
    steps = {int(s["step"]) for s in last["optimizer_states"][0]["state"].values()}
    assert steps == {8}
    assert "train/kl" in scalars(run_dir)


def test_real_rlla_data_runs_as_is(tmp_path, shared_data):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=grpo",
        "data=rlla",
        f"run_dir={run_dir}",
        "trainer.max_steps=1",
        "sampling.n_prompts=1",
        "sampling.n_generations_per_prompt=2",
        "sampling.max_new_tokens=8",
        "data.max_prompt_length=1200",
    )
    rows = pd.read_parquet(run_dir / "rollouts" / "step_00000000.parquet")
    assert set(rows["data_source"]) == {"rlla"} and len(rows) == 2


def test_router_on_harmony_data(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=router_grpo_gpt_oss",
        f"run_dir={run_dir}",
        "trainer.max_steps=1",
        "sft.max_steps=2",
        "sampling.n_prompts=2",
        "sampling.max_new_tokens=8",
        # a smaller synthetic set: the router's SIF fit forwards every training prompt, and the
        # harmony prompts (~4x the XML ones) share no cached fit with the other tests' runs
        "data.synthetic.n_train=256",
        "data.synthetic.n_test=32",
    )
    rows = pd.read_parquet(run_dir / "rollouts" / "step_00000000.parquet")
    assert set(rows["data_source"]) == {"rlla_gpt"}
    assert set(rows["route"]) <= {"answer", "search", "calculate"}
    assert "train/route_frac_answer" in scalars(run_dir)


def test_validation_logs_val_twins(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=grpo",
        f"run_dir={run_dir}",
        "trainer.max_steps=2",
        "trainer.val_check_interval=2",
        "trainer.limit_val_batches=1",
        "sampling.n_prompts=2",
        "sampling.eval.n_prompts=3",
        "sampling.max_new_tokens=8",
    )
    series = scalars(run_dir)
    for tag in ("val/reward_task_mean", "val/response_length_mean", "val/tool_call_rate"):
        assert tag in series, sorted(series)


def test_router_sharing_the_actor_optimizer_trains_head_and_backbone(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=router_grpo",
        f"run_dir={run_dir}",
        "trainer.max_steps=2",
        "sft.max_steps=2",
        "router.separate_optimizer=false",
        "router.detach_backbone=false",
        "router.sup_coef=0.1",
        "router.pooling=last",
        "sampling.n_prompts=2",
        "sampling.max_new_tokens=8",
        "trainer.save_freq=1",
    )
    first = torch.load(run_dir / "checkpoints" / "step_00000001.ckpt", map_location="cpu", weights_only=False)
    last = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert len(last["optimizer_states"]) == 1 and len(last["optimizer_states"][0]["param_groups"]) == 2
    head = [k for k in last["state_dict"] if k.startswith("router_head.")]
    assert any(not torch.equal(first["state_dict"][k], last["state_dict"][k]) for k in head)
    assert "train/router_ce" in scalars(run_dir)
