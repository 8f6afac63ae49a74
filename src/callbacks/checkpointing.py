"""Checkpoints that survive crashes: atomic writes, a save on exception / Ctrl-C, and a
``manifest.yaml`` beside them that says how to resume."""

from __future__ import annotations

import logging
import os
import subprocess
import tempfile
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path
from typing import Any

import yaml
from lightning.fabric.utilities.cloud_io import get_filesystem
from lightning.pytorch.callbacks import ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.plugins.io import TorchCheckpointIO

log = logging.getLogger(__name__)

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


class ManifestWriter:
    """Writes ``manifest.yaml``: resolved config, commit, versions, step, λ, latest checkpoint, resume command."""

    def __init__(self, dirpath: str | os.PathLike, config: dict | None, resume_command: str, source_dir=None):
        self.path = Path(dirpath) / "manifest.yaml"
        self.config = config or {}
        self.resume_command = resume_command
        self.commit = git_commit(source_dir)

    def write(self, trainer, ckpt_path: str | os.PathLike, reason: str) -> None:
        if not trainer.is_global_zero:
            return
        module = trainer.lightning_module
        lam = getattr(module, "lagrange_lambda", None)
        manifest = {
            "latest_checkpoint": str(Path(ckpt_path).resolve()),
            "reason": reason,
            "global_step": int(trainer.global_step),
            "lambda": float(lam) if lam is not None else None,
            "written_at": datetime.now(timezone.utc).isoformat(),
            "git_commit": self.commit,
            "packages": package_versions(),
            "resume_command": self.resume_command,
            "config": self.config,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".yaml.tmp")
        tmp.write_text(yaml.safe_dump(manifest, sort_keys=False))
        os.replace(tmp, self.path)


class ManifestCheckpoint(ModelCheckpoint):
    """Lightning's ModelCheckpoint, plus the manifest after each save."""

    def __init__(self, manifest: ManifestWriter, **kwargs):
        super().__init__(**kwargs)
        self.manifest = manifest

    def _save_checkpoint(self, trainer, filepath: str) -> None:
        super()._save_checkpoint(trainer, filepath)
        self.manifest.write(trainer, filepath, reason="periodic")


class ManifestOnExceptionCheckpoint(OnExceptionCheckpoint):
    """Lightning's save-on-exception (Ctrl-C included), plus the manifest."""

    def __init__(self, manifest: ManifestWriter, dirpath, filename: str = "on_exception"):
        super().__init__(dirpath=dirpath, filename=filename)
        self.manifest = manifest

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        log.warning("%s during training: saving %s", type(exception).__name__, self.ckpt_path)
        super().on_exception(trainer, pl_module, exception)
        self.manifest.write(trainer, self.ckpt_path, reason=f"exception:{type(exception).__name__}")


def latest_checkpoint(checkpoint_dir: str | os.PathLike) -> Path | None:
    """The checkpoint to resume from: the manifest's, else the newest ``*.ckpt``."""
    checkpoint_dir = Path(checkpoint_dir)
    manifest = checkpoint_dir / "manifest.yaml"
    if manifest.exists():
        path = Path(yaml.safe_load(manifest.read_text()).get("latest_checkpoint", ""))
        if path.is_file():
            return path
        log.warning("manifest names %s, which is missing; using the newest checkpoint instead", path)
    candidates = sorted(checkpoint_dir.glob("*.ckpt"), key=lambda p: p.stat().st_mtime)
    return candidates[-1] if candidates else None
