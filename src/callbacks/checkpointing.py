"""Checkpoints that resume exactly: atomic writes, a save at the step boundary on SIGINT / SIGTERM,
and a ``manifest.yaml`` beside them that says how to resume.

Every checkpoint is taken at the end of a step (``on_train_batch_end``), never in the middle of
one: a mid-step state (an optimizer step taken, λ not yet updated, a batch half consumed) cannot
be resumed exactly. So an exception writes nothing (the last periodic checkpoint stays the
resume point), and a signal lets the running step finish, saves, and stops the run; the job
then exits with 128 + the signal number (130 for SIGINT, 143 for SIGTERM), never 0, so a
scheduler can tell pre-emption from completion and requeue the resume command.

``StopOnSignal`` is the one signal handler of a fit, RL and SFT alike: the first SIGINT / SIGTERM
is latched (``SignalLatch``) and acted on at the step boundary, a second SIGINT stops at once;
``Preempted`` carries the exit code. Before any fit, the entry point's ``exit_on_signals``
(scripts/train.py) ends the job with the same codes.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import tempfile
import threading
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import Checkpoint, ModelCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)


class Preempted(SystemExit):
    """The run stopped on a signal; exit code 128 + signal."""

    def __init__(self, signum: int):
        super().__init__(128 + int(signum))
        self.signum = int(signum)


class SignalLatch:
    """Installs SIGINT / SIGTERM handlers for a fit (``install`` / ``restore``); ``received`` is
    the first signal, or None. ``then`` says what the owner does at the step boundary (logged)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, then: str):
        self.then = then
        self.received: int | None = None
        self._previous: dict[int, Any] = {}

    def _on_signal(self, signum: int, frame) -> None:
        if self.received is not None and signum == signal.SIGINT:
            # asked twice: stop now. Not KeyboardInterrupt: Lightning turns that into exit 1,
            # and a scheduler must see 130.
            raise Preempted(signal.SIGINT)
        self.received = signum
        log.warning(
            "%s received: finishing this step, then %s (Ctrl-C again: stop now)",
            signal.Signals(signum).name,
            self.then,
        )

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return  # signals reach the main thread only; Lightning's handlers stay in charge
        for sig in self.SIGNALS:
            self._previous[sig] = signal.getsignal(sig)
            signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}


PACKAGES = (
    "torch",
    "lightning",
    "transformers",
    "peft",
    "hydra-core",
    "tokenizers",
    "pandas",
    "pyarrow",
    "vllm",
    "deepspeed",
)


class AtomicCheckpointIO(TorchCheckpointIO):
    """Write to a temporary file in the same directory, fsync, then rename over the target."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path, storage_options=None) -> None:
        path = Path(path)
        if get_filesystem(str(path)).protocol not in ("file", ("file", "local")) and "://" in str(path):
            return super().save_checkpoint(checkpoint, path, storage_options)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        os.close(fd)
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
            with open(tmp, "rb") as f:
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.remove(tmp)


def git_commit(cwd: str | os.PathLike | None = None) -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return versions


def relative_to_run_dir(path: str | os.PathLike, run_dir: Path) -> str:
    """``path`` relative to ``run_dir`` when inside it (else absolute), POSIX separators."""
    path, run_dir = Path(path).resolve(), run_dir.resolve()
    try:
        return path.relative_to(run_dir).as_posix()
    except ValueError:
        return str(path)


def manifest_checkpoint(checkpoint_dir: Path, named: str) -> Path:
    """The manifest's ``latest_checkpoint`` as a path: relative ones are under the run directory.

    An absolute path from an older manifest that is not in this run's checkpoint folder (the run
    directory was copied or moved) is read as the file of that name in this folder.
    """
    path = Path(named)
    if not path.is_absolute():
        return checkpoint_dir.parent / path
    if path.parent.resolve() != checkpoint_dir.resolve() and (checkpoint_dir / path.name).exists():
        log.warning("manifest names %s outside this run; using %s", path, checkpoint_dir / path.name)
        return checkpoint_dir / path.name
    return path


class ManifestWriter:
    """Writes ``manifest.yaml``: resolved config, commit, versions, step, λ, latest checkpoint, resume command."""

    def __init__(self, dirpath: str | os.PathLike, config: dict | None, resume_command: str, source_dir=None):
        self.path = Path(dirpath) / "manifest.yaml"
        self.config = config or {}
        self.resume_command = resume_command
        self.commit = git_commit(source_dir)
        self.saved_step: int | None = None  # global step of the last checkpoint written through this

    def write(self, trainer, ckpt_path: str | os.PathLike, reason: str) -> None:
        self.saved_step = int(trainer.global_step)
        if not trainer.is_global_zero:
            return
        module = trainer.lightning_module
        lam = module.current_lambda()  # ToolRouterModule's λ, present with the router off too
        manifest = {
            # relative to the run directory, so a copied or moved run resumes from its own files
            "latest_checkpoint": relative_to_run_dir(ckpt_path, self.path.parent.parent),
            "reason": reason,
            "global_step": int(trainer.global_step),
            "lambda": float(lam),
            "written_at": datetime.now(timezone.utc).isoformat(),
            "git_commit": self.commit,
            "packages": package_versions(),
            "resume_command": self.resume_command,
            "config": self.config,
        }
        self._replace(manifest)

    def mark_validated(self, trainer) -> None:
        """Record in the manifest that the validation at the current logger step has written all
        its outputs (files, flushed TensorBoard points): a resume from the checkpoint it followed
        need not run it again (``src.callbacks.validation_replay``)."""
        from src.callbacks.run_logs import logger_step

        if not trainer.is_global_zero or not self.path.exists():
            return
        manifest = yaml.safe_load(self.path.read_text())
        if isinstance(manifest, dict):  # a broken manifest stays as it is: the resume then validates again
            self._replace({**manifest, "validated_step": logger_step(trainer)})

    def _replace(self, manifest: dict) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump(manifest, sort_keys=False))
        os.replace(tmp, self.path)


class ManifestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, plus the manifest after each save, saving at step ends only.

    Every ``every_n_train_steps`` steps and at the last step (``max_steps``), in
    ``on_train_batch_end``. Lightning's other save points (epoch end, validation end, train end)
    are off: their states come after the step's end hooks (an epoch counted as finished, a
    stopped loop) and would not resume exactly. So a checkpoint comes before the validation of its
    step: at the end of that validation the manifest records it as complete
    (``validated_step``); a resume finding it incomplete runs it again
    (``src.callbacks.validation_replay``).
    """

    def __init__(self, manifest: ManifestWriter, **kwargs):
        # A kill between a checkpoint file and its manifest entry leaves the file; the resumed run
        # saving that step again must replace it (atomically), not add ``step_...-v1.ckpt``.
        kwargs.setdefault("enable_version_counter", False)
        super().__init__(**kwargs)
        self.manifest = manifest

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self.manifest.write(trainer, filepath, reason="periodic")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        last_step = 0 < trainer.max_steps <= trainer.global_step
        if last_step and self._last_global_step_saved != trainer.global_step:
            candidates = self._monitor_candidates(trainer)
            self._save_topk_checkpoint(trainer, candidates)
            self._save_last_checkpoint(trainer, candidates)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        return

    def on_validation_end(self, trainer, pl_module) -> None:
        # after Lightning wrote (and flushed) the validation's points and every callback its files
        if not trainer.sanity_checking:
            self.manifest.mark_validated(trainer)

    def on_train_end(self, trainer, pl_module) -> None:
        return


class StopOnSignal(Checkpoint):
    """SIGINT / SIGTERM during a fit: finish the running step, save the full training state to
    ``save_to`` at its end (atomically through the trainer's checkpoint IO; not when the run just
    finished or the periodic checkpoint saved this very step; None: save nothing), point the
    ``manifest`` at it (RL runs) and stop the trainer. ``stopped_by`` is then the signal number
    (the job exits 128 + it); ``saved_step`` the step saved. A second SIGINT stops at once without
    saving (exit 130; the last checkpoint stays valid).

    Exceptions write nothing: see the module docstring. Being a ``Checkpoint``, Lightning runs it
    after every other callback's ``on_train_batch_end`` (rollout log, periodic save); with no
    other checkpoint callback (SFT) it is the trainer's only one.
    """

    def __init__(self, what: str, save_to: str | os.PathLike | None, manifest: ManifestWriter | None = None):
        self.save_to = None if save_to is None else Path(save_to)
        self.manifest = manifest
        self.stopped_by: int | None = None
        self.saved_step: int | None = None
        self.latch = SignalLatch(f"{'saving and ' if save_to else ''}stopping {what}")

    def on_train_start(self, trainer, pl_module) -> None:
        # installed after Lightning's own SIGTERM handler (registered just before the loop) so
        # that the stop happens here, at the step boundary, on every rank at the same step
        self.latch.install()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        received = self.latch.received
        if not trainer.strategy.reduce_boolean_decision(received is not None, all=False):
            return
        self.stopped_by = received or signal.SIGTERM  # other ranks: the signal went to rank 0
        finished = 0 < trainer.max_steps <= trainer.global_step
        saved_now = self.manifest is not None and self.manifest.saved_step == trainer.global_step
        if self.save_to is not None and not finished and not saved_now:
            trainer.save_checkpoint(self.save_to)
            self.saved_step = int(trainer.global_step)
            if self.manifest is not None:
                reason = f"signal:{signal.Signals(self.stopped_by).name}"
                self.manifest.write(trainer, self.save_to, reason=reason)
        skip_validation(trainer, keep_scheduled=finished)
        if self.manifest is not None:
            log.warning(
                "stopped after step %d; resume: %s", trainer.global_step, self.manifest.resume_command
            )
        trainer.should_stop = True

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        if self.manifest is None:
            return
        log.error(
            "%s at global step %d: no checkpoint written (a mid-step state cannot be resumed exactly); "
            "resuming continues from the last checkpoint (step %s)",
            type(exception).__name__,
            trainer.global_step,
            self.manifest.saved_step,
        )

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self.latch.restore()


def skip_validation(trainer, keep_scheduled: bool) -> None:
    """No validation after the step now ending, before a stop: Lightning validates when a batch
    ends with ``trainer.should_stop`` set, off its schedule, and an uninterrupted run has no such
    validation. ``keep_scheduled``: a validation due on schedule still runs (the run's last step:
    nothing resumes after it); otherwise the resume runs it (``src.callbacks.validation_replay``).
    Lightning's own flag for skipping the next validation (set by its restart logic) does it."""
    from src.callbacks.validation_replay import scheduled_validation

    if not (keep_scheduled and scheduled_validation(trainer)):
        trainer.fit_loop.epoch_loop._skip_next_val = True


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: the manifest's, else the newest ``*.ckpt``.

    A checkpoint is a file, or a directory under sharded strategies (FSDP2, DeepSpeed)."""
    checkpoint_dir = Path(checkpoint_dir)
    named = _manifest_latest(checkpoint_dir / "manifest.yaml")
    if named:
        path = manifest_checkpoint(checkpoint_dir, named)
        if path.is_file() or path.is_dir():  # FSDP2 and DeepSpeed checkpoints are directories
            return path
        log.warning("manifest names %s, which is missing; using the newest checkpoint instead", path)
    candidates = sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None


def _manifest_latest(manifest: Path) -> str | None:
    """The manifest's ``latest_checkpoint``; None when there is no manifest or it is broken (cut
    short, hand-edited): then it is named in a warning, the newest intact checkpoint is used and the
    next checkpoint writes the manifest anew."""
    if not manifest.exists():
        return None
    try:
        content = yaml.safe_load(manifest.read_text())
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        log.warning("%s does not parse (%s); using the newest intact checkpoint", manifest, str(err)[:120])
        return None
    if not isinstance(content, dict):
        log.warning("%s holds no mapping; using the newest intact checkpoint", manifest)
        return None
    return content.get("latest_checkpoint") or None
