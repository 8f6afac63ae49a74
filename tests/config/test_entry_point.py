"""Through the real entry point: a bad config exits non-zero at start-up, naming the key, and
writes no checkpoint (validation runs before anything is built)."""

from __future__ import annotations

import subprocess

import pytest
from jobhelpers import REPO, train_cmd

CASES = [
    ("router.budgett=0.2", "router.budgett"),
    ("+algorithm.kl_coeff=1", "algorithm.kl_coeff"),
    ("router.budget=abc", "router.budget"),
    ("algorithm.optim.lr=abc", "algorithm.optim.lr"),
    ("rollout.n=0", "rollout.n"),
    ("sampling.n_generations_per_prompt=0", "sampling.n_generations_per_prompt"),
    ("router.budget=-1", "router.budget"),
    ("data.train_files=/x.parquet", "data.train_files: file not found: /x.parquet"),
]


@pytest.mark.parametrize("override, named", CASES, ids=[c[0] for c in CASES])
def test_bad_config_exits_non_zero_naming_the_key(tmp_path, override, named):
    run_dir = tmp_path / "run"
    cmd = train_cmd("experiment=router_grpo", override, f"run_dir={run_dir}", "trainer.max_steps=0")
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    assert named in proc.stdout + proc.stderr
    assert not (run_dir / "checkpoints").exists()
