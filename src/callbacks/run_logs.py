"""A run directory's append-only logs, cut back to a checkpoint before a resume continues them.

A run killed after its last checkpoint has logged steps that the resumed run will run again.
Rather than leave two versions of those steps (TensorBoard event files are append-only, and
plain readers would show both), the resume first removes everything logged from the resume
point on: TensorBoard events at logger steps >= ``tb_step`` and rollout files of steps >=
``rollout_step``. The resumed run then writes those steps once. Everything before the resume
point, the killed run's points and rows, is kept as written. Leftover temporary files of saves
cut short by a kill are removed at start-up.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

from lightning.pytorch.loggers import TensorBoardLogger

__all__ = [
    "RunTensorBoardLogger",
    "existing_run_artefacts",
    "logger_step",
    "remove_interrupted_writes",
    "truncate_event_file",
    "truncate_rollouts",
    "truncate_tensorboard",
]

log = logging.getLogger(__name__)

VAL_PREFIX = "val/"  # the tags of a validation's points

_ROLLOUT_FILE = re.compile(r"step_(\d+)\.parquet")
# a validation's rollouts and held-out routes (rollouts/val/), named by the logger step (``logger_step``)
_VAL_FILE = re.compile(r"(?:rollouts|routes)_(\d+)\.parquet")
# AtomicCheckpointIO's and atomic_file's (rollout logs) ".<name>.<random>.tmp", the manifest's "<name>.tmp"
_TMP_GLOBS = ("*.tmp", ".*.tmp")


def remove_interrupted_writes(run_dir: str | os.PathLike) -> list[Path]:
    """Delete temporary files of interrupted atomic writes under checkpoints/, rollouts/, tensorboard/."""
    removed = []
    for sub in ("checkpoints", "rollouts", "rollouts/val", "tensorboard"):
        folder = Path(run_dir) / sub
        if not folder.is_dir():
            continue
        for path in sorted({p for pattern in _TMP_GLOBS for p in folder.glob(pattern)}):
            if path.is_file():
                path.unlink()
                removed.append(path)
    if removed:
        log.warning("removed %d temporary files of interrupted writes, e.g. %s", len(removed), removed[0])
    return removed


def existing_run_artefacts(run_dir: str | os.PathLike) -> list[Path]:
    """Checkpoints, rollout files and event files already in ``run_dir`` (a run was started there)."""
    run_dir = Path(run_dir)
    found = [
        *sorted((run_dir / "checkpoints").glob("*.ckpt")),
        *sorted((run_dir / "rollouts").glob("step_*.parquet")),
        *sorted((run_dir / "tensorboard").glob("events.out.tfevents.*")),
    ]
    return found


def logger_step(trainer) -> int:
    """The step Lightning logs the current scalars at: during a training step its index (the
    ``step`` of its rollout rows), during the validation that follows it the same index. A
    validation's files (``rollouts/val/*_XXXXXXXX.parquet``) are named by it, so a file and its
    TensorBoard points carry the same step."""
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def truncate_rollouts(
    rollout_dir: str | os.PathLike, keep_below: int, val_keep_below: int | None = None
) -> int:
    """Delete the ``step_XXXXXXXX.parquet`` files of steps >= ``keep_below`` and the validations'
    files (``val/``) of steps >= ``val_keep_below`` (None: ``keep_below``). Returns how many.

    A checkpoint after S steps (global step S) is saved before the validation that follows step
    S - 1 (named S - 1), from the same weights: a run resumed from it keeps that validation's files
    when it was complete, else it runs it again (``val_keep_below`` S - 1)."""
    val_keep_below = keep_below if val_keep_below is None else val_keep_below
    dropped = 0
    for path in sorted(Path(rollout_dir).glob("step_*.parquet")):
        match = _ROLLOUT_FILE.fullmatch(path.name)
        if match and int(match.group(1)) >= keep_below:
            path.unlink()
            dropped += 1
    for path in sorted(Path(rollout_dir).glob("val/*.parquet")):
        match = _VAL_FILE.fullmatch(path.name)
        if match and int(match.group(1)) >= val_keep_below:
            path.unlink()
            dropped += 1
    return dropped


def truncate_event_file(path: str | os.PathLike, keep_below: int, keep_validation: bool = True) -> int:
    """Rewrite one event file without the summaries at steps >= ``keep_below`` but the validation's
    at ``keep_below`` (``keep_validation``; else it goes too) and without a truncated last record.
    Returns the number of events dropped; untouched when nothing goes."""
    from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.summary.writer.record_writer import RecordWriter

    path = Path(path)
    records = list(RawEventFileLoader(str(path)).Load())  # stops at a record cut short by a kill
    kept = [r for r in records if _keep(Event.FromString(r), keep_below, keep_validation)]
    framed = sum(len(r) + 16 for r in records)  # 8 length + 4 crc + data + 4 crc per record
    if len(kept) == len(records) and framed == path.stat().st_size:
        return 0
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "wb") as f:
        writer = RecordWriter(f)
        for record in kept:
            writer.write(record)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    return len(records) - len(kept)


def _keep(event, keep_below: int, keep_validation: bool) -> bool:
    # file-version, graph and session events carry no scalars: keep them whatever their step.
    # At the resume step itself only the validation's points may stay: that validation ran after
    # the checkpoint was saved, from the same weights, and the resumed run runs it again only when
    # it was not complete (then they go); the step's training points are logged again from the
    # checkpoint (StepScalarCarry).
    if not event.HasField("summary") or event.step < keep_below:
        return True
    values = event.summary.value
    at_resume_step = keep_validation and event.step == keep_below
    return at_resume_step and bool(values) and all(v.tag.startswith(VAL_PREFIX) for v in values)


def truncate_tensorboard(tb_dir: str | os.PathLike, keep_below: int, keep_validation: bool = True) -> int:
    """:func:`truncate_event_file` on every event file of ``tb_dir``. Returns events dropped."""
    files = sorted(Path(tb_dir).glob("events.out.tfevents.*"))
    return sum(truncate_event_file(f, keep_below, keep_validation) for f in files)


class RunTensorBoardLogger(TensorBoardLogger):
    """Lightning's TensorBoard logger, with one ``epoch`` point per step: Lightning adds ``epoch``
    to every call that logs, so a step followed by a validation got two (the training step's and
    the validation's, at the same step), and a resume that keeps one validation but logs the step
    again could not tell them apart. The validation's call (only ``val/`` points) goes without it."""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        others = [k for k in metrics if k != "epoch"]
        if "epoch" in metrics and others and all(k.startswith(VAL_PREFIX) for k in others):
            metrics = {k: metrics[k] for k in others}
        super().log_metrics(metrics, step)
