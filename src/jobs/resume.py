"""Preparing a run directory at start-up: a fresh run, or a resume from its latest checkpoint.

``resume=true`` continues from the checkpoint the manifest names (else the newest ``*.ckpt``):
the logs are first cut back to that point (``src.callbacks.run_logs``), so the steps the
resumed run repeats are logged once. With no checkpoint yet (killed before the first one) the
run starts again from step 0 with a warning. A fresh run refuses a run_dir that already holds
one, so no earlier run's rows are overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_only

from src.callbacks.checkpointing import latest_checkpoint
from src.callbacks.run_logs import (
    existing_run_artefacts,
    remove_interrupted_writes,
    truncate_rollouts,
    truncate_tensorboard,
)
from src.callbacks.step_scalars import StepScalars

__all__ = ["ResumePoint", "check_callback_states", "prepare_run_dir", "read_resume_point"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: ``global_step`` steps done; TensorBoard continues at
    ``logger_step``; ``callback_states`` are the callback state keys the checkpoint holds."""

    checkpoint: Path | None
    global_step: int
    logger_step: int
    callback_states: tuple[str, ...] = ()


def read_resume_point(ckpt: Path) -> ResumePoint:
    """Step counters and callback keys of a checkpoint (a file is memory-mapped, not read whole)."""
    if ckpt.is_dir():  # sharded (DeepSpeed) checkpoint: the manifest recorded its step
        manifest = yaml.safe_load((ckpt.parent / "manifest.yaml").read_text())
        step = int(manifest["global_step"])
        return ResumePoint(ckpt, step, step)
    import torch

    state: dict[str, Any] = torch.load(ckpt, map_location="cpu", mmap=True, weights_only=False)
    step = int(state["global_step"])
    carried = StepScalars.from_checkpoint(state)
    return ResumePoint(ckpt, step, carried.step if carried else step, tuple(state.get("callbacks", {})))


def prepare_run_dir(run_dir: str | Path, resume: bool) -> ResumePoint | None:
    """Clean interrupted writes; for a resume, find the checkpoint and cut the logs back to it.

    Only the launching process (global rank 0) touches the directory: the ranks that a
    multi-process strategy starts later run this too, while rank 0 is already writing there.
    """
    run_dir = Path(run_dir)
    if rank_zero_only.rank != 0:
        ckpt = latest_checkpoint(run_dir / "checkpoints") if resume else None
        return None if not resume else (read_resume_point(ckpt) if ckpt else ResumePoint(None, 0, 0))
    remove_interrupted_writes(run_dir)
    if not resume:
        if found := existing_run_artefacts(run_dir):
            raise FileExistsError(
                f"run_dir={run_dir} already holds a run ({found[0].name} and {len(found) - 1} more): "
                "continue it with resume=true, or choose a new run_dir"
            )
        return None
    ckpt = latest_checkpoint(run_dir / "checkpoints")
    if ckpt is None:
        log.warning("resume=true but no checkpoint in %s/checkpoints: starting from step 0", run_dir)
        point = ResumePoint(None, 0, 0)
    else:
        point = read_resume_point(ckpt)
    events = truncate_tensorboard(run_dir / "tensorboard", point.logger_step)
    rows = truncate_rollouts(run_dir / "rollouts", point.global_step)
    log.info(
        "resuming from %s at step %d: dropped %d TensorBoard events from step %d on and %d rollout "
        "files from step %d on (the resumed run writes them again)",
        point.checkpoint,
        point.global_step,
        events,
        point.logger_step,
        rows,
        point.global_step,
    )
    return point


def check_callback_states(point: ResumePoint, trainer) -> None:
    """Every callback whose state the checkpoint holds must be configured again: otherwise its
    state (a curriculum, a replay buffer, λ's window) would silently restart from scratch.
    Checkpoint callbacks are exempt (their key holds their settings, e.g. ``save_freq``)."""
    checkpointers = {type(cb).__qualname__ for cb in trainer.checkpoint_callbacks}
    present = {cb.state_key for cb in trainer.callbacks}
    missing = [
        key for key in point.callback_states if key not in present and key.split("{")[0] not in checkpointers
    ]
    if missing:
        raise ValueError(
            f"{point.checkpoint} holds the state of callbacks this run does not configure: {missing}; "
            "resume with the same overrides (see checkpoints/manifest.yaml: resume_command)"
        )
