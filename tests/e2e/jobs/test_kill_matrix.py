"""Every output of a run, not only its training state, is exact after an interruption: a short
router run with a validation after every checkpointed step (save_freq = val_check_interval = 2,
4 steps) is interrupted at chosen points, resumed with the README's command, and every rollout
file under ``rollouts/`` (training steps and ``val/``: names and frames) and every TensorBoard
entry (scalars and texts: tag, step, value; each exactly once) must equal the uninterrupted run's
(``runoutputs.assert_same_outputs``; wall-clock timings aside).

The points: SIGKILL after a checkpointed step's validation (before the next checkpoint), SIGKILL
in the middle of that validation (``faults.SignalAtStep(at="val_batch_start")``: it is run again on
resume), SIGTERM at a step with no validation (no unscheduled validation at the stop), SIGINT at a
checkpointed validation step (the validation is skipped at the stop and run on resume).

In-process tests below cover the pieces: the manifest's validation record, the cut of an
incomplete validation, the ``epoch`` point kept once per step.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import torch
import yaml
from faults import fault_overrides
from jobhelpers import ROUTER_RUN_OVERRIDES, run_train
from runoutputs import assert_same_outputs, event_entries

from src.callbacks.run_logs import RunTensorBoardLogger, truncate_event_file, truncate_rollouts
from src.jobs.resume import ResumePoint, cut_logs_back, incomplete_validation

# checkpoints at global steps 2 and 4, each followed by a validation (logger steps 1 and 3)
RUN = [*ROUTER_RUN_OVERRIDES, "trainer.max_steps=4"]


def _run(run_dir: Path, *overrides: str, expect: int = 0) -> None:
    """A run stopped by the fault injector has its own process; the others (the uninterrupted run,
    every resume) run in this one (``jobhelpers.run_train``)."""
    run_train(*RUN, f"run_dir={run_dir}", *overrides, timeout=900, expect=expect)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("kill_matrix") / "uninterrupted"
    _run(run_dir)
    entries = event_entries(run_dir)
    # not vacuous: both validations and the route confusion texts are there, each point once
    assert {(t, s) for t, s, _ in entries if t == "val/reward_task_mean"} == {
        ("val/reward_task_mean", 1),
        ("val/reward_task_mean", 3),
    }
    assert any(t.startswith("train/route_confusion") for t, _, _ in entries)
    keys = [(t, s) for t, s, _ in entries]
    assert len(keys) == len(set(keys))  # no tag has two points at one step (``epoch`` included)
    return run_dir


def _interrupt_and_resume(
    uninterrupted: Path, run_dir: Path, step: int, sig: str, at: str, expect: int
) -> None:
    _run(run_dir, *fault_overrides(step, sig, at), expect=expect)
    _run(run_dir, "resume=true")
    assert_same_outputs(uninterrupted, run_dir)
    a = torch.load(uninterrupted / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    b = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])


def test_sigkill_after_a_checkpointed_steps_validation(uninterrupted, tmp_path):
    """Killed at step 3: the checkpoint of step 2 came before the validation after it, which was
    complete (the manifest says so): the resume keeps it and does not run it again."""
    run_dir = tmp_path / "run"
    _interrupt_and_resume(uninterrupted, run_dir, 3, "SIGKILL", "batch_end", -signal.SIGKILL)


@pytest.mark.parametrize("step", [2, 4], ids=["mid-run", "after-the-last-step"])
def test_sigkill_during_a_validation_runs_it_again(uninterrupted, tmp_path, step):
    """Killed in the validation after step 2, or after step 4 = trainer.max_steps (the resume has no
    step left to train: it runs that validation and ends)."""
    run_dir = tmp_path / "run"
    _run(run_dir, *fault_overrides(step, "SIGKILL", "val_batch_start"), expect=-signal.SIGKILL)
    lost = f"*_{step - 1:08d}.parquet"  # the validation's logger step
    assert not list((run_dir / "rollouts" / "val").glob(lost))  # the validation was lost
    _run(run_dir, "resume=true")
    assert_same_outputs(uninterrupted, run_dir)


def test_sigterm_runs_no_unscheduled_validation(uninterrupted, tmp_path):
    run_dir = tmp_path / "run"
    _run(run_dir, *fault_overrides(3, "SIGTERM", "batch_end"), expect=128 + signal.SIGTERM)
    assert not list((run_dir / "rollouts" / "val").glob("*_00000002.parquet"))  # none at the stop
    _run(run_dir, "resume=true")
    assert_same_outputs(uninterrupted, run_dir)


@pytest.mark.slow
def test_sigint_at_a_validation_step_validates_on_resume(uninterrupted, tmp_path):
    """Stopped at step 2 (checkpointed, a validation due): the stop skips it, the resume runs it."""
    _interrupt_and_resume(uninterrupted, tmp_path / "run", 2, "SIGINT", "batch_end", 128 + signal.SIGINT)


@pytest.mark.slow
def test_sigterm_mid_step_after_a_validation(uninterrupted, tmp_path):
    _interrupt_and_resume(uninterrupted, tmp_path / "run", 2, "SIGTERM", "batch_start", 128 + signal.SIGTERM)


# ---------------------------------------------------------------------------- pieces
def test_incomplete_validation_reads_the_manifest_record(tmp_path):
    manifest = tmp_path / "manifest.yaml"
    assert incomplete_validation(None, manifest) is None  # no validation after the checkpoint
    assert incomplete_validation(3, manifest) == 3  # no manifest: not known complete
    manifest.write_text(yaml.safe_dump({"latest_checkpoint": "x", "validated_step": 1}))
    assert incomplete_validation(3, manifest) == 3  # an earlier validation was complete
    manifest.write_text(yaml.safe_dump({"latest_checkpoint": "x", "validated_step": 3}))
    assert incomplete_validation(3, manifest) is None
    manifest.write_text("latest_checkpoint: [")  # broken: run it again
    assert incomplete_validation(3, manifest) == 3


def _events(folder: Path) -> Path:
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(str(folder))
    for s in range(4):
        writer.add_scalar("train/x", float(s), s)
        if s % 2:
            writer.add_scalar("val/y", float(s), s)
    writer.add_text("train/route_confusion", "table", 1)
    writer.close()
    (path,) = folder.glob("events.out.tfevents.*")
    return path


def test_an_incomplete_validation_is_cut_whole(tmp_path):
    """Resumed from global step 2 (logger step 1): a complete validation at 1 stays, an incomplete
    one goes (points and files), with the step's training points and text."""
    for validation, kept in ((None, [("val/y", 1)]), (1, [])):
        run = tmp_path / str(validation)
        _events(run / "tensorboard")
        (run / "rollouts" / "val").mkdir(parents=True)
        for s in (1, 3):
            (run / "rollouts" / f"step_{s:08d}.parquet").write_bytes(b"x")
            (run / "rollouts" / "val" / f"routes_{s:08d}.parquet").write_bytes(b"x")
        cut_logs_back(run, ResumePoint(Path("x.ckpt"), 2, 1, (), validation))
        at_1 = [(t, s) for t, s, _ in event_entries(run) if s >= 1]
        assert at_1 == kept
        files = sorted(
            p.relative_to(run / "rollouts").as_posix() for p in (run / "rollouts").rglob("*.parquet")
        )
        assert files == ["step_00000001.parquet", *(["val/routes_00000001.parquet"] if kept else [])]


def test_truncate_defaults_are_unchanged(tmp_path):
    path = _events(tmp_path / "tb")
    assert truncate_event_file(path, keep_below=1, keep_validation=False) > truncate_event_file(
        _events(tmp_path / "tb2"), keep_below=1
    )
    (tmp_path / "r" / "val").mkdir(parents=True)
    (tmp_path / "r" / "val" / "rollouts_00000001.parquet").write_bytes(b"x")
    assert truncate_rollouts(tmp_path / "r", keep_below=2) == 0
    assert truncate_rollouts(tmp_path / "r", keep_below=2, val_keep_below=1) == 1


def test_a_validation_logs_no_second_epoch_point(tmp_path):
    logger = RunTensorBoardLogger(save_dir=str(tmp_path), name="tensorboard", version="")
    logger.log_metrics({"train/x": 1.0, "epoch": 0.0}, step=1)
    logger.log_metrics({"val/y": 2.0, "epoch": 0.0}, step=1)
    logger.log_metrics({"epoch": 0.0}, step=2)  # only the epoch: kept
    logger.finalize("success")
    assert sorted((t, s) for t, s, _ in event_entries(tmp_path)) == [
        ("epoch", 1),
        ("epoch", 2),
        ("train/x", 1),
        ("val/y", 1),
    ]
