"""A resume never destroys: a refused resume and a resume of a finished run leave checkpoints,
TensorBoard and rollouts byte for byte as they were; a copied run directory resumes from its own
checkpoints (the manifest holds paths relative to the run directory); an unreadable newest
checkpoint is named and the newest intact one is used; a checkpoint file left by a kill before
its manifest update is replaced by the resumed run's save, not joined by ``-v1``. Real runs."""

from __future__ import annotations

import hashlib
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import torch
import yaml
from faults import fault_overrides
from jobhelpers import run_train_unchecked

SMALL = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=2",
    "sampling.max_new_tokens=16",
    "trainer.max_steps=4",
    "trainer.save_freq=2",
]
KILL_AT_3 = fault_overrides(3, "SIGKILL")


def _run(run_dir: Path, *overrides: str, base=SMALL) -> subprocess.CompletedProcess:
    """A run stopped by the fault injector has its own process; the others (the resumes) this one."""
    return run_train_unchecked(*base, f"run_dir={run_dir}", *overrides, timeout=900)


def _snapshot(run_dir: Path) -> dict[str, str]:
    """Content hash of every file a resume could cut or rewrite."""
    return {
        str(p.relative_to(run_dir)): hashlib.sha1(p.read_bytes()).hexdigest()
        for sub in ("checkpoints", "tensorboard", "rollouts")
        for p in sorted((run_dir / sub).rglob("*"))
        if p.is_file()
    }


@pytest.fixture(scope="module")
def killed_at_3(tmp_path_factory) -> Path:
    """One run killed at step 3 (checkpoint at step 2, logs past it), trained once: each test works
    on its own copy (the manifest holds paths relative to the run directory)."""
    run_dir = tmp_path_factory.mktemp("resume_safety") / "killed"
    killed = _run(run_dir, *KILL_AT_3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    return run_dir


def test_resume_never_destroys(killed_at_3, tmp_path):
    original = tmp_path / "original"
    shutil.copytree(killed_at_3, original)
    manifest = yaml.safe_load((original / "checkpoints" / "manifest.yaml").read_text())
    assert manifest["latest_checkpoint"] == "checkpoints/last.ckpt", manifest["latest_checkpoint"]

    # a copied run directory, the original gone: the copy must resume from its own files
    run_dir = tmp_path / "copy"
    shutil.copytree(original, run_dir)
    shutil.rmtree(original)
    ckpts = run_dir / "checkpoints"

    # a resume refused at start-up (another experiment's callbacks) cuts nothing
    before = _snapshot(run_dir)
    refused = _run(run_dir, "resume=true", base=[*SMALL[1:], "experiment=grpo"])
    assert refused.returncode != 0 and "RouteConfusionLogger" in refused.stdout + refused.stderr
    assert _snapshot(run_dir) == before

    # the newest checkpoint unreadable (empty); a step-4 file left by a kill before its manifest update
    (ckpts / "last.ckpt").write_bytes(b"")
    shutil.copy(ckpts / "step_00000002.ckpt", ckpts / "step_00000004.ckpt")
    old = (ckpts / "step_00000002.ckpt").stat().st_mtime - 60
    os.utime(ckpts / "step_00000004.ckpt", (old, old))  # older: step 2 stays the newest intact one
    resumed = _run(run_dir, "resume=true")
    out = resumed.stdout + resumed.stderr
    assert resumed.returncode == 0, out[-4000:]
    assert f"{ckpts / 'last.ckpt'} is not readable" in out
    assert f"resuming from {ckpts / 'step_00000002.ckpt'}" in out
    assert sorted(p.name for p in ckpts.glob("*.ckpt")) == [
        "last.ckpt",
        "step_00000002.ckpt",
        "step_00000004.ckpt",
    ]  # no step_00000004-v1.ckpt
    for name in ("last.ckpt", "step_00000004.ckpt"):
        assert torch.load(ckpts / name, map_location="cpu", weights_only=False)["global_step"] == 4

    # resuming the finished run says so and changes nothing
    before = _snapshot(run_dir)
    again = _run(run_dir, "resume=true")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "the run is finished" in again.stdout + again.stderr
    assert _snapshot(run_dir) == before


def test_no_intact_checkpoint_names_every_file(tmp_path):
    from src.jobs.resume import prepare_run_dir

    ckpts = tmp_path / "checkpoints"
    ckpts.mkdir()
    (ckpts / "last.ckpt").write_bytes(b"")
    (ckpts / "step_00000002.ckpt").write_bytes(b"PK\x03\x04 cut short")
    try:
        prepare_run_dir(tmp_path, resume=True)
    except ValueError as err:
        assert "last.ckpt" in str(err) and "step_00000002.ckpt" in str(err)
    else:
        raise AssertionError("no error for a run whose every checkpoint is unreadable")


def _damaged(ckpt: Path, damage) -> None:
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    damage(state)
    torch.save(state, ckpt)


def _wrong_shape(state) -> None:
    name = next(k for k, v in state["state_dict"].items() if v.ndim == 2)
    state["state_dict"][name] = state["state_dict"][name][:, :1].clone()


def _refused_callback_state(state) -> None:
    state["callbacks"]["RouteConfusionLogger"] = {"not": "its state"}


def test_checkpoint_that_fails_to_load_in_fit_cuts_nothing(killed_at_3, tmp_path):
    """It passes the start-up read (step counters, callback keys) but Lightning cannot restore it:
    the error names the file, and no TensorBoard event or rollout was cut (nor a new file left)."""
    run_dir = tmp_path / "run"
    shutil.copytree(killed_at_3, run_dir)
    ckpt = run_dir / "checkpoints" / "last.ckpt"
    intact = ckpt.read_bytes()
    # the killed run logged past its checkpoint: an accepted resume would cut TensorBoard back
    from src.callbacks.run_logs import truncate_tensorboard
    from src.jobs.resume import read_resume_point

    shutil.copytree(run_dir / "tensorboard", tmp_path / "tb_copy")
    assert truncate_tensorboard(tmp_path / "tb_copy", read_resume_point(ckpt).logger_step) > 0
    # a wrong shape is refused before the trainer is built (a user error: one line, exit 2); a
    # callback that refuses its state only inside the fit
    refusals = {
        _wrong_shape: (2, f"{ckpt} does not fit this run's model"),
        _refused_callback_state: (1, f"resuming from {ckpt} failed while loading it"),
    }
    for damage, (code, says) in refusals.items():
        _damaged(ckpt, damage)
        before = _snapshot(run_dir)
        assert any(k.startswith("tensorboard/") for k in before)
        resumed = _run(run_dir, "resume=true")
        out = resumed.stdout + resumed.stderr
        assert resumed.returncode == code and says in out, out[-3000:]
        assert _snapshot(run_dir) == before, damage.__name__
        ckpt.write_bytes(intact)
