"""Helpers for tests that run scripts/train.py as a real subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CACHE = REPO / ".cache" / "toolrouter"
TESTS = Path(__file__).resolve().parent
# the environment of the training processes the tests start: tests/ on the path, for the fault
# injector (``+callbacks.fault._target_=faults.SignalAtStep``)
TRAIN_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
# the short router_grpo run the session fixture trains (tiny SFT warm start)
ROUTER_RUN_OVERRIDES = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "router.lambda_lr=5.0",
    "trainer.save_freq=2",
    "trainer.val_check_interval=2",  # validation and the route confusion text every 2 steps
    "data.synthetic.n_calib=64",  # the budget's threshold calibrated apart from the held-out split
]


def train_cmd(*overrides: str) -> list[str]:
    return [sys.executable, str(REPO / "scripts" / "train.py"), f"cache_dir={CACHE}", *overrides]


def run_train(*overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        train_cmd(*overrides), cwd=REPO, capture_output=True, text=True, timeout=timeout, env=TRAIN_ENV
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def scalars(run_dir: Path, sub: str = "tensorboard") -> dict[str, list[tuple[int, float]]]:
    """All scalar series of a run's TensorBoard event files: tag -> [(step, value)] by step."""
    from src.analysis import load_scalars

    wide = load_scalars(run_dir, sub)
    return {tag: [(int(step), float(v)) for step, v in wide[tag].dropna().items()] for tag in wide.columns}
