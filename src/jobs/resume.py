"""Preparing a run directory at start-up: a fresh run, or a resume from its latest checkpoint.

``resume=true`` continues from the checkpoint the manifest names (else, or when that one is
unreadable, the newest intact ``*.ckpt``): once the resume is accepted the logs are cut back to
that point (``src.callbacks.run_logs``), so the steps the resumed run repeats are logged once. A
run that already reached ``trainer.max_steps`` is left as it is. With no checkpoint yet (killed before the first one) the
run starts again from step 0 with a warning. A fresh run refuses a run_dir that already holds
one, so no earlier run's rows are overwritten.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import yaml
from lightning.fabric.utilities.rank_zero import rank_zero_only

from src.callbacks.checkpointing import latest_checkpoint
from src.callbacks.run_logs import (
    existing_run_artefacts,
    remove_interrupted_writes,
    truncate_event_file,
    truncate_rollouts,
    truncate_tensorboard,
)
from src.callbacks.step_scalars import StepScalars
from src.callbacks.validation_replay import CHECKPOINT_KEY as VALIDATION_KEY
from src.config.validate import UserError

__all__ = [
    "CutLogsOnceRestored",
    "ResumeError",
    "ResumePoint",
    "RunExistsError",
    "already_finished",
    "check_callback_states",
    "check_checkpoint_shapes",
    "cut_logs_back",
    "intact_resume_point",
    "logs_cut_once_restored",
    "prepare_run_dir",
    "read_resume_point",
]

log = logging.getLogger(__name__)


class ResumeError(UserError, ValueError):
    """A resume that cannot continue the run (no intact checkpoint, a model that does not fit the
    checkpoint): refused before anything of the run was changed; the entry point exits 2."""


class RunExistsError(UserError, FileExistsError):
    """A fresh run (no ``resume=true``) into a ``run_dir`` that already holds a run."""


@dataclass(frozen=True)
class ResumePoint:
    """Where a resumed run starts: ``global_step`` steps done; TensorBoard continues at
    ``logger_step``; ``callback_states`` are the callback state keys the checkpoint holds;
    ``validation``: the logger step of the validation after the checkpointed step that is not
    complete and is run again first (``src.callbacks.validation_replay``), else None."""

    checkpoint: Path | None
    global_step: int
    logger_step: int
    callback_states: tuple[str, ...] = ()
    validation: int | None = None


def read_resume_point(ckpt: Path) -> ResumePoint:
    """Step counters and callback keys of a checkpoint (a file is memory-mapped, not read whole)."""
    if ckpt.is_dir():  # sharded (DeepSpeed) checkpoint: the manifest recorded its step
        manifest = yaml.safe_load((ckpt.parent / "manifest.yaml").read_text())
        step = int(manifest["global_step"])
        return ResumePoint(ckpt, step, step)
    import torch

    state: dict[str, Any] = torch.load(ckpt, map_location="cpu", mmap=True, weights_only=False)
    step = int(state["global_step"])
    # the logger step the checkpointed step logs at (and its validation): Lightning's counter,
    # saved before its increment; older checkpoints: the carried scalars' step
    carried = StepScalars.from_checkpoint(state)
    loop = state.get("loops", {}).get("fit_loop", {}).get("epoch_loop.state_dict", {})
    logged = loop.get("_batches_that_stepped", carried.step if carried else step)
    validation = incomplete_validation(state.get(VALIDATION_KEY), ckpt.parent / "manifest.yaml")
    callbacks = tuple(state.get("callbacks", {}))
    return ResumePoint(ckpt, step, int(logged), callbacks, validation)


def incomplete_validation(due: int | None, manifest: Path) -> int | None:
    """``due`` (the logger step of the validation that follows a checkpoint, None: none) unless the
    manifest records it as complete (``validated_step``); an unreadable manifest records nothing."""
    if due is None:
        return None
    try:
        content = yaml.safe_load(manifest.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return int(due)
    done = content.get("validated_step") if isinstance(content, dict) else None
    return None if done == int(due) else int(due)


def intact_resume_point(checkpoint_dir: Path, warn: bool = True) -> ResumePoint | None:
    """The resume point of the manifest's checkpoint, else of the newest intact ``*.ckpt``.

    A checkpoint that cannot be read (empty, cut short, corrupt) is named in a warning and the
    next newest is tried; None when there is no checkpoint; ``ResumeError`` naming every one when
    none is intact. ``warn=False``: no warning (the entry point's start-up check, before logging is
    configured, would print them twice).
    """
    first = latest_checkpoint(checkpoint_dir)
    if first is None:
        return None
    others = sorted(
        (p for p in checkpoint_dir.glob("*.ckpt") if p.resolve() != first.resolve()),
        key=lambda p: p.stat().st_mtime,
        reverse=True,
    )
    broken: list[str] = []
    first_reason = ""
    for ckpt in (first, *others):
        try:
            point = read_resume_point(ckpt)
        except Exception as err:  # noqa: BLE001 - any unreadable checkpoint: try the next one
            reason = (
                f"{type(err).__name__}: {' '.join(str(err).split())[:160]}"  # one line: torch's span several
            )
            broken.append(ckpt.name)
            first_reason = first_reason or f"{ckpt.name}: {reason}"
            if warn:
                log.warning("checkpoint %s is not readable (%s); trying the next newest", ckpt, reason)
            continue
        if broken and warn:
            log.warning("resuming from %s instead of the unreadable %s", ckpt, ", ".join(broken))
        return point
    raise ResumeError(
        f"resume=true: no intact checkpoint in {checkpoint_dir} to resume from ({len(broken)} unreadable: "
        f"{', '.join(broken)}; {first_reason}); "
        "restore one, or start a new run (a new run_dir, without resume=true)"
    )


def prepare_run_dir(run_dir: str | Path, resume: bool) -> ResumePoint | None:
    """Clean interrupted writes; for a resume, find the (intact) checkpoint to continue from.

    Nothing logged is cut here: :func:`cut_logs_back` does that once the resume is accepted.
    Only the launching process (global rank 0) touches the directory: the ranks that a
    multi-process strategy starts later run this too, while rank 0 is already writing there.
    """
    run_dir = Path(run_dir)
    if rank_zero_only.rank != 0:
        return (intact_resume_point(run_dir / "checkpoints") or ResumePoint(None, 0, 0)) if resume else None
    remove_interrupted_writes(run_dir)
    if not resume:
        if found := existing_run_artefacts(run_dir):
            raise RunExistsError(
                f"run_dir={run_dir} already holds a run ({found[0].name} and {len(found) - 1} more): "
                "continue it with resume=true, or choose a new run_dir"
            )
        return None
    point = intact_resume_point(run_dir / "checkpoints")
    if point is None:
        log.warning("resume=true but no checkpoint in %s/checkpoints: starting from step 0", run_dir)
        point = ResumePoint(None, 0, 0)
    return point


def check_checkpoint_shapes(point: ResumePoint, module: pl.LightningModule, config: dict) -> None:
    """Refuse (``ResumeError``, one line) a resume whose model does not fit its checkpoint, e.g. a
    changed ``router.mlp_hidden``, before the trainer is built: Lightning would fail only inside the
    fit, after its logger opened a file in the run. Names the first tensor that differs and the keys
    whose values differ from the run's (its manifest's config). Sharded checkpoints are left to
    Lightning; ``config``: this command's resolved config."""
    if point.checkpoint is None or point.checkpoint.is_dir():
        return
    import torch

    saved = torch.load(point.checkpoint, map_location="cpu", mmap=True, weights_only=False)["state_dict"]
    own = module.state_dict()
    wrong = [
        (key, tuple(saved[key].shape), tuple(own[key].shape))
        for key in saved
        if key in own and hasattr(saved[key], "shape") and tuple(saved[key].shape) != tuple(own[key].shape)
    ]
    if not wrong:
        return
    key, theirs, ours = wrong[0]
    changed = changed_keys(point.checkpoint.parent / "manifest.yaml", config)
    raise ResumeError(
        f"resume=true: {point.checkpoint} does not fit this run's model ({len(wrong)} tensors differ, "
        f"e.g. {key}: {theirs} there, {ours} here){changed}; resume with the run's own overrides "
        "(checkpoints/manifest.yaml: resume_command)"
    )


def changed_keys(manifest: Path, config: dict) -> str:
    """``"; changed: key: run's -> this command's, ..."`` for the config keys whose values differ
    from the run's manifest (the bookkeeping keys of a resume aside); "" when unknown."""
    try:
        recorded = yaml.safe_load(manifest.read_text()).get("config") or {}
    except (OSError, yaml.YAMLError, AttributeError):
        return ""
    then, now = _leaves(recorded), _leaves(config)
    # a run moved or copied: paths under its run_dir (the callbacks' ${run_dir}/...) move with it
    then, now = _under_run_dir(then, recorded.get("run_dir")), _under_run_dir(now, config.get("run_dir"))
    bookkeeping = {"resume", "run_dir", "trainer.max_steps"}
    diffs = [
        f"{k}: {then.get(k)!r} -> {now.get(k)!r}"
        for k in sorted(set(then) | set(now))
        if k not in bookkeeping and then.get(k) != now.get(k)
    ]
    return f"; changed: {', '.join(diffs[:4])}" if diffs else ""


def _under_run_dir(leaves: dict[str, Any], run_dir: Any) -> dict[str, Any]:
    """``leaves`` with string values under ``run_dir`` written relative to it (``${run_dir}/...``)."""
    if not isinstance(run_dir, str) or not run_dir:
        return leaves
    root = run_dir.rstrip("/")

    def relative(v: Any) -> Any:
        inside = isinstance(v, str) and (v == root or v.startswith(root + "/"))
        return "${run_dir}" + v[len(root) :] if inside else v

    return {k: relative(v) for k, v in leaves.items()}


def _leaves(node: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(node, dict):
        return {prefix: node}
    out: dict[str, Any] = {}
    for key, value in node.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def already_finished(point: ResumePoint | None, max_steps: int) -> bool:
    """Whether the checkpoint to resume from already reached ``trainer.max_steps`` with nothing left
    to do (logged when so). A checkpoint at max_steps whose validation after it was not complete is
    not finished: the fit runs that validation again (``ValidationAfterCheckpoint.setup``)."""
    done = point is not None and point.checkpoint is not None and 0 < max_steps <= point.global_step
    if done and point.validation is not None:
        log.info(
            "%s reached step %d (trainer.max_steps=%d); the validation after it was not complete: "
            "running it again",
            point.checkpoint,
            point.global_step,
            max_steps,
        )
        return False
    if done:
        log.warning(
            "%s already reached step %d (trainer.max_steps=%d): the run is finished, nothing to resume; "
            "nothing was changed (raise trainer.max_steps to train on)",
            point.checkpoint,
            point.global_step,
            max_steps,
        )
    return done


def cut_logs_back(run_dir: str | Path, point: ResumePoint, event_files: list[Path] | None = None) -> None:
    """Drop what the killed run logged from the resume point on (the resumed run writes it again).

    Called only once the resume is accepted (by :class:`CutLogsOnceRestored`: after Lightning
    restored every state of the checkpoint), so a refused resume or an already finished run leaves
    every log as it was. ``event_files``: only these TensorBoard files (those of the earlier runs;
    None: every one in the run's ``tensorboard``).
    """
    if rank_zero_only.rank != 0:
        return
    run_dir = Path(run_dir)
    # an incomplete validation goes whole (its points and files): the resumed run runs it again
    keep_validation = point.validation is None
    if event_files is None:
        events = truncate_tensorboard(run_dir / "tensorboard", point.logger_step, keep_validation)
    else:
        events = sum(truncate_event_file(f, point.logger_step, keep_validation) for f in event_files)
    val_below = point.global_step if keep_validation else point.validation
    rows = truncate_rollouts(run_dir / "rollouts", point.global_step, val_below)
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
        raise ResumeError(
            f"{point.checkpoint} holds the state of callbacks this run does not configure: {missing}; "
            "resume with the same overrides (see checkpoints/manifest.yaml: resume_command)"
        )


class CutLogsOnceRestored(pl.Callback):
    """Cuts the logs back to ``point`` (:func:`cut_logs_back`) at the start of the fit, i.e. after
    Lightning restored the checkpoint's weights, callback and datamodule states, optimizers and
    loops: a checkpoint that passed the start-up read but fails to load (a wrong shape, a callback
    that refuses its state) leaves every log as it was. Only the event files of earlier runs are
    cut (listed when built), never the one this run's logger opened meanwhile."""

    def __init__(self, run_dir: str | Path, point: ResumePoint):
        self.run_dir, self.point = Path(run_dir), point
        self.event_files = sorted((self.run_dir / "tensorboard").glob("events.out.tfevents.*"))
        self.accepted = False

    def on_train_start(self, trainer, pl_module) -> None:
        self.accepted = True
        cut_logs_back(self.run_dir, self.point, self.event_files)

    def remove_new_event_files(self) -> None:
        """The event files this refused attempt's logger opened (hyperparameters only)."""
        if rank_zero_only.rank != 0:
            return
        for path in (self.run_dir / "tensorboard").glob("events.out.tfevents.*"):
            if path not in self.event_files:
                path.unlink()


@contextlib.contextmanager
def logs_cut_once_restored(trainer, run_dir: str | Path, point: ResumePoint | None) -> Iterator[None]:
    """Run a fit (the ``with`` body) whose logs are cut back to ``point`` only once its checkpoint
    is restored (:class:`CutLogsOnceRestored`, first callback, so before anyone logs). A checkpoint
    that fails to load is named in the error; nothing was changed then."""
    if point is None:
        yield
        return
    guard = CutLogsOnceRestored(run_dir, point)
    trainer.callbacks.insert(0, guard)
    try:
        yield
    except Exception as err:
        if point.checkpoint is None or guard.accepted:
            raise
        guard.remove_new_event_files()
        raise RuntimeError(
            f"resuming from {point.checkpoint} failed while loading it ({type(err).__name__}: "
            f"{str(err)[:600]}); no log was cut, nothing was changed"
        ) from err
