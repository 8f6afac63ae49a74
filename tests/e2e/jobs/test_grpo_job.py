"""experiment=grpo end to end: 4 steps, interrupted by SIGINT after step 2 and resumed."""

import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
import torch
import yaml
from jobhelpers import REPO, run_train, scalars, train_cmd

REQUIRED = [
    "train/reward_task_mean",
    "train/kl",
    "train/entropy",
    "train/response_length_mean",
    "train/tokens_per_sec",
]


def _optimizer_steps(ckpt_path) -> set[int]:
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    return {int(s["step"]) for s in ckpt["optimizer_states"][0]["state"].values()}


def test_grpo_sigint_resume_reaches_step_4(tmp_path):
    run_dir = tmp_path / "run"
    overrides = [
        "experiment=grpo",
        "trainer.max_steps=4",
        "trainer.save_freq=2",
        f"run_dir={run_dir}",
        "sampling.max_new_tokens=24",
        "sampling.n_prompts=2",
    ]
    proc = subprocess.Popen(
        train_cmd(*overrides), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    ckpt2 = run_dir / "checkpoints" / "step_00000002.ckpt"
    deadline = time.time() + 400
    while not ckpt2.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.2)
    assert ckpt2.exists(), proc.communicate()[0][-4000:]
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=300)[0]
    # Ctrl-C lets the running step finish, saves at its end and exits 128 + SIGINT
    assert proc.returncode == 130, out[-4000:]
    ckpt_dir = run_dir / "checkpoints"
    manifest = yaml.safe_load((ckpt_dir / "manifest.yaml").read_text())
    interrupted_at = manifest["global_step"]
    assert interrupted_at in (2, 3), out[-4000:]
    # step 2 was saved by the periodic checkpoint already; a later stop writes interrupted.ckpt
    assert manifest["latest_checkpoint"].endswith("interrupted.ckpt") == (interrupted_at == 3)
    assert "resume=true" in manifest["resume_command"] and manifest["config"]["trainer"]["max_steps"] == 4
    assert not Path(manifest["latest_checkpoint"]).is_absolute()  # relative to the run dir: copies resume
    assert _optimizer_steps(run_dir / manifest["latest_checkpoint"]) == {interrupted_at}
    assert not (ckpt_dir / "on_exception.ckpt").exists()

    run_train(*overrides, "resume=true")

    last = torch.load(ckpt_dir / "last.ckpt", map_location="cpu", weights_only=False)
    assert last["global_step"] == 4
    # AdamW's step counters continue from the interrupted state: the optimizer state was restored
    assert _optimizer_steps(ckpt_dir / "last.ckpt") == {4}
    assert yaml.safe_load((ckpt_dir / "manifest.yaml").read_text())["global_step"] == 4

    series = scalars(run_dir)
    for tag in REQUIRED:
        assert tag in series, f"{tag} missing from {sorted(series)}"
    rollouts = sorted((run_dir / "rollouts").glob("step_*.parquet"))
    assert [p.name for p in rollouts] == [f"step_{i:08d}.parquet" for i in range(4)]
    df = pd.read_parquet(rollouts[-1])
    for col in [
        "step",
        "uid",
        "data_source",
        "used_tool",
        "cost",
        "reward_task",
        "reward_format",
        "reward_correctness",
        "response_length",
        "response",
    ]:
        assert col in df.columns
    assert len(df) == 2 * 4  # sampling.n_prompts x n_generations_per_prompt
