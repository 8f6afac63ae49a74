"""Exit codes a scheduler understands, in every phase, through the real entry point: SIGINT once or
twice -> 130, SIGTERM -> 143, never 0 or 1. Phases: start-up (before any trainer), the SFT warm
start of an RL job, ``experiment=sft``, and the RL fit (Ctrl-C twice). An interrupted SFT caches
no half-trained model; one stop saves its resumable state beside it (tests/e2e/jobs/test_sft_resume.py
resumes it). The signal is sent once the phase's own log line shows."""

from __future__ import annotations

import random
import signal
import subprocess
import threading
import time

import pytest
from jobhelpers import CACHE, REPO, train_cmd


def fresh_sft_lr() -> str:
    """An ``sft.lr`` override no earlier test run used: a new warm-start key, so the warm start is
    trained, not found in the cache. Drawn from the OS: an in-process run seeds ``random``."""
    return f"sft.lr={0.001 + random.SystemRandom().random() * 1e-6}"


# a fresh SFT key per test run, so a warm start is trained and is long
SFT = ["sft.max_steps=5000", "sft.log_every=2", fresh_sft_lr(), "sft.batch_size=2"]


class _Job:
    """A training subprocess whose output is collected while it runs."""

    def __init__(self, *overrides: str):
        self.proc = subprocess.Popen(
            train_cmd(*overrides), cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.lines: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def out(self) -> str:
        return "".join(self.lines)

    def wait_for(self, marker: str, timeout: float = 300) -> None:
        deadline = time.time() + timeout
        while marker not in self.out:
            assert self.proc.poll() is None, (
                f"exited {self.proc.returncode} before {marker!r}:\n{self.out[-4000:]}"
            )
            assert time.time() < deadline, f"no {marker!r} in {timeout} s:\n{self.out[-4000:]}"
            time.sleep(0.1)

    def signal(self, *signums: int, gap: float = 0.3) -> int:
        for i, signum in enumerate(signums):
            if i:
                time.sleep(gap)
            if self.proc.poll() is None:
                self.proc.send_signal(signum)
        return self.proc.wait(timeout=300)


def _warm_starts() -> set[str]:
    return {p.name for p in (CACHE / "warm_start").glob("sft-*") if p.is_dir()}


@pytest.mark.parametrize(
    "signums, code",
    [
        ((signal.SIGTERM,), 143),
        pytest.param((signal.SIGINT,), 130, marks=pytest.mark.slow),
        pytest.param((signal.SIGINT, signal.SIGINT), 130, marks=pytest.mark.slow),
    ],
    ids=["sigterm", "sigint", "sigint-twice"],
)
def test_sft_warm_start_phase(tmp_path, signums, code):
    cached = _warm_starts()
    job = _Job("experiment=router_grpo", *SFT, f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2")
    job.wait_for("SFT: ")
    job.wait_for("SFT step", timeout=120)  # training steps are running
    rc = job.signal(*signums)
    assert rc == code, job.out[-4000:]
    assert _warm_starts() == cached  # nothing half-trained was cached
    saved = [p for p in (CACHE / "warm_start").glob("sft-*.interrupted.ckpt") if str(p) in job.out]
    if len(signums) == 1:
        assert "SFT stopped by" in job.out and len(saved) == 1, job.out[-3000:]
    for p in saved:  # 5000 steps: not worth resuming
        p.unlink()


@pytest.mark.slow
@pytest.mark.parametrize(
    "signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)], ids=["sigterm", "sigint"]
)
def test_experiment_sft(tmp_path, signum, code):
    run_dir = tmp_path / "run"
    job = _Job("experiment=sft", *SFT, f"run_dir={run_dir}")
    job.wait_for("SFT step", timeout=240)
    assert job.signal(signum) == code, job.out[-4000:]
    assert not (run_dir / "model").exists()
    assert (run_dir / "model.interrupted.ckpt").is_file()


@pytest.mark.slow
def test_startup_phase_sigterm(tmp_path):
    """Before any trainer: the config is validated, the seed set, the model and data prepared."""
    job = _Job("experiment=grpo", f"run_dir={tmp_path / 'run'}", "trainer.max_steps=2")
    job.wait_for("Seed set")
    assert job.signal(signal.SIGTERM) == 143, job.out[-4000:]


@pytest.mark.slow
def test_rl_phase_ctrl_c_twice(tmp_path):
    run_dir = tmp_path / "run"
    job = _Job(
        "experiment=grpo",
        f"run_dir={run_dir}",
        "trainer.max_steps=50",
        "trainer.save_freq=100",
        "sampling.n_prompts=2",
        "sampling.max_new_tokens=16",
    )
    deadline = time.time() + 300
    while not (run_dir / "rollouts" / "step_00000000.parquet").exists():
        assert job.proc.poll() is None and time.time() < deadline, job.out[-4000:]
        time.sleep(0.1)
    assert job.signal(signal.SIGINT, signal.SIGINT, gap=0.05) == 130, job.out[-4000:]
