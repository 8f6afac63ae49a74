"""Through the real entry point: a bad config exits 2 at start-up, naming the key, and writes no
checkpoint, TensorBoard event or rollout (validation runs before anything is built). One case per
way a config can be wrong (unknown key or wrong type when Hydra composes it, a value or a
combination ``validate()`` refuses); every other bad key is checked in-process by
``tests/unit/config/test_bad_keys_named.py``, through the same ``compose_job`` + ``validate_job``."""

from __future__ import annotations

import subprocess

import pytest
from jobhelpers import REPO, train_cmd

CASES = [
    ("router_grpo", "router.budgett=0.2", "router.budgett"),  # unknown key
    ("router_grpo", "router.budget=abc", "router.budget"),  # wrong type
    ("router_grpo", "router.budget=-1", "router.budget"),  # out of range
    ("router_grpo", "trainer.max_steps=0", "trainer.max_steps"),  # a run that would do nothing
    ("mlgym_grpo", "env.memory_mb=0", "env.memory_mb"),  # the episode environment's limits
    (
        "grpo",
        "data.synthetic.p_search=0 data.synthetic.p_calculate=0 data.synthetic.p_answer=0",
        "all zero",
    ),
]


@pytest.mark.parametrize("experiment, override, key", CASES, ids=[c[1] for c in CASES])
def test_bad_config_exits_2_naming_the_key_before_writing(tmp_path, experiment, override, key):
    run_dir = tmp_path / "run"
    cmd = train_cmd(f"experiment={experiment}", f"run_dir={run_dir}", "trainer.max_steps=1", *override.split())
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert key in proc.stdout + proc.stderr
    written = {p.name for p in run_dir.iterdir()} if run_dir.exists() else set()
    assert not written & {"checkpoints", "tensorboard", "rollouts"}, written
