"""``experiment=router_grpo rollout=vllm`` end to end with a real vLLM (colocated, CPU): it logs the
same scalars as ``rollout=hf``, the engine samples from the trainer's weights (log-prob mismatch
below 1e-3 at fp32), and a resumed run pushes its restored weights before its first rollout.

Runs in the vLLM venv (``make test-vllm``). One 2-step run resumed to 3 steps (two engine start-ups)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM not importable: run in the vLLM venv (make test-vllm)")
pytestmark = pytest.mark.vllm

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: jobhelpers
from jobhelpers import run_train, scalars

# the actor must move for the resume check to bite (a resumed engine sampling from the model
# directory instead of the checkpoint): an entropy bonus gives it a gradient whatever the rewards
# (tiny groups often tie: zero advantage), and the lr makes 2 steps count
COMMON = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "algorithm.optim.lr=1e-3",
    "algorithm.entropy_coeff=0.1",
    "trainer.save_freq=2",
]
# the README's command (max_model_len left at its default: the model's own positions), smaller
VLLM = [
    "rollout=vllm",
    "rollout.engines.vllm.kv_cache_memory_gib=0.25",
    "rollout.engines.vllm.enforce_eager=true",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    base = tmp_path_factory.mktemp("vllm_jobs")
    vllm_dir, hf_dir = base / "vllm", base / "hf"
    run_train(*COMMON, *VLLM, f"run_dir={vllm_dir}", "trainer.max_steps=2")
    resumed = run_train(*COMMON, *VLLM, f"run_dir={vllm_dir}", "trainer.max_steps=3", "resume=true")
    run_train(*COMMON, "rollout=hf", f"run_dir={hf_dir}", "trainer.max_steps=3")
    return scalars(vllm_dir), scalars(hf_dir), resumed, vllm_dir


def test_vllm_run_logs_the_hf_runs_scalars(runs):
    vllm, hf, _, _ = runs
    assert set(vllm) == set(hf)
    assert [s for s, _ in vllm["train/pg_loss"]] == [0, 1, 2]


def test_engine_samples_from_the_trainers_weights_before_and_after_resume(runs):
    vllm, _, resumed, run_dir = runs
    import torch

    # precondition: training moves the actor (else a stale engine could not be told apart)
    ckpts = [
        torch.load(run_dir / "checkpoints" / f"step_0000000{i}.ckpt", weights_only=False) for i in (2, 3)
    ]
    moved = max(
        (ckpts[1]["state_dict"][k].float() - v.float()).abs().max().item()
        for k, v in ckpts[0]["state_dict"].items()
        if k.startswith("actor.")
    )
    assert moved > 1e-4, moved
    means = dict(vllm["rollout/logprob_abs_diff_mean"])
    assert set(means) == {0, 1, 2}
    # step 2 is the resumed run's first rollout: the checkpoint's weights were pushed to the engine
    assert all(v < 1e-3 for v in means.values()), means
    assert all(v < 1e-2 for _, v in vllm["rollout/logprob_abs_diff_max"])
    assert "resum" in (resumed.stdout + resumed.stderr).lower()
