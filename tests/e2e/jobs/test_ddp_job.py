"""DDP on CPU (gloo, 2 processes): the router job runs, rollouts of both ranks are logged and λ
follows the dual update on the global mean cost."""

import pandas as pd
import pytest
import torch
from jobhelpers import run_train


def test_router_ddp_two_processes_use_the_global_cost(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=router_grpo",
        f"run_dir={run_dir}",
        "trainer.strategy=ddp",
        "trainer.devices=2",
        "trainer.max_steps=3",
        "sampling.n_prompts=4",  # over both ranks: 2 each
        "sampling.max_new_tokens=16",
        "sft.max_steps=2",
        "router.budget=0.2",
        "router.lambda_lr=1.0",
        "router.lambda_init=1.0",
        "router.lambda_update=gradient",  # the plain dual step, recomputed below from the log
    )
    rollouts = pd.concat([pd.read_parquet(p) for p in sorted((run_dir / "rollouts").glob("*.parquet"))])
    assert set(rollouts["rank"]) == {0, 1}
    lam = 1.0  # router.lambda_init
    for _, step in rollouts.groupby("step"):
        assert len(step) == 2 * 2 * 4  # ranks x prompts x copies
        lam = max(0.0, lam + 1.0 * (float(step["cost"].mean()) - 0.2))  # plain dual ascent
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert ckpt["global_step"] == 3
    assert float(ckpt["state_dict"]["lagrange.lam"]) == pytest.approx(lam, abs=1e-6)
