"""Atomic writes for cached artefacts: a file or directory appears under its final name complete or
not at all, so a run killed mid-write leaves at worst a stray temporary that the next run ignores.

A cached artefact found broken anyway (written by an older version, or damaged by hand) is moved
aside and rebuilt rather than failing every later run: see ``discard_if_broken``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

log = logging.getLogger(__name__)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on a clean exit it is fsynced and renamed onto ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def atomic_dir(target: str | os.PathLike) -> Iterator[Path]:
    """Yield an empty temporary directory beside ``target``; on a clean exit it becomes ``target``.

    Losing a race to another builder (``target`` appeared meanwhile) keeps theirs.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.building-"))
    try:
        yield tmp
        try:
            os.replace(tmp, target)
        except OSError:
            if not target.exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def discard_if_broken(path: str | os.PathLike, is_intact: Callable[[Path], bool]) -> bool:
    """True when ``path`` exists and ``is_intact``; a broken one is logged and removed (to be rebuilt)."""
    path = Path(path)
    if not path.exists():
        return False
    if is_intact(path):
        return True
    log.warning("cached %s is broken (incomplete write?); rebuilding it", path)
    aside = path.with_name(f".{path.name}.broken-{os.getpid()}")
    os.replace(path, aside)
    if aside.is_dir():
        shutil.rmtree(aside, ignore_errors=True)
    else:
        aside.unlink(missing_ok=True)
    return False


def parquet_intact(path: Path) -> bool:
    """A parquet file whose footer reads (a cut write has none)."""
    import pyarrow.parquet as pq

    try:
        pq.read_metadata(path)
    except Exception:  # noqa: BLE001 - any unreadable footer means rebuild
        return False
    return True


def json_intact(path: Path) -> bool:
    import json

    try:
        json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return True


def hf_model_dir_intact(path: Path) -> bool:
    """A saved HF model + tokenizer directory: config JSON parses, weights and tokenizer present."""
    weights = list(path.glob("*.safetensors")) or list(path.glob("pytorch_model*.bin"))
    return (
        path.is_dir()
        and json_intact(path / "config.json")
        and bool(weights)
        and all(w.stat().st_size > 0 for w in weights)
        and json_intact(path / "tokenizer_config.json")
    )
