"""End to end: `experiment=mlgym_grpo` trains 2 steps on multi-step episodes in a real subprocess."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

REPO = Path(__file__).resolve().parents[3]


def test_mlgym_grpo_two_steps(tmp_path):
    run_dir = tmp_path / "run"
    cmd = [
        sys.executable,
        "scripts/train.py",
        "experiment=mlgym_grpo",
        "trainer.max_steps=2",
        f"run_dir={run_dir}",
        f"cache_dir={REPO / '.cache' / 'toolrouter'}",
    ]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]

    events = sorted((run_dir / "tensorboard").rglob("events.out.tfevents.*"))
    assert events, f"no TensorBoard event file under {run_dir}"
    acc = EventAccumulator(str(events[0].parent))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for tag in ("train/episode_return_mean", "train/episode_steps_mean", "rollout/mask_fraction"):
        assert tag in tags, f"{tag} missing; logged: {sorted(tags)}"
        assert len(acc.Scalars(tag)) == 2
    assert all(0.0 < s.value < 1.0 for s in acc.Scalars("rollout/mask_fraction"))

    rows = pd.read_parquet(run_dir / "rollouts" / "step_00000001.parquet")
    assert len(rows) == 4  # 2 seeds x 2 episodes
    assert (rows["response_length"] <= 160).all()
    assert (rows["n_action_tokens"] + rows["n_observation_tokens"] == rows["response_length"]).all()
    assert rows.groupby("uid")["seed"].nunique().eq(1).all()
    assert (run_dir / "checkpoints" / "last.ckpt").exists()
