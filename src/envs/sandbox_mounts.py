"""What a sandboxed process can see: a mount plan, independent of the tool that builds it.

The plan is a list of ``Mount`` operations applied in order to an empty root:

* the system's programs and libraries read-only (``/usr`` and the ``/bin``, ``/lib*``, ``/sbin``
  entries, which are symlinks into ``/usr`` on merged-/usr systems);
* the dynamic linker's configuration and ``/etc/alternatives`` read-only, and nothing else of
  ``/etc`` (no ``passwd``, no ``hosts``, no credentials);
* the Python installation the trainer runs on (``sys.base_prefix``) read-only, so ``python3``
  works; NOT the virtual environment, the repository, ``/root``, ``/work`` or ``/home``;
* a private, size-capped tmpfs on ``/tmp``; a fresh ``/proc`` (of the sandbox's own PID
  namespace) and a minimal ``/dev`` (null, zero, full, random, urandom);
* the episode's workspace read-write at its own (resolved) path, and any extra read-only files
  the caller names (the game runner script).

Missing parent directories of mount points are created with mode 0755 so that the unprivileged
sandbox user can traverse them even when the host's are private (``/root`` is 0700).
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

RO, RW, TMPFS, SYMLINK, DIR, PROC, DEV = "ro", "rw", "tmpfs", "symlink", "dir", "proc", "dev"

_SYSTEM_TOP = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")
DEV_NODES = ("null", "zero", "full", "random", "urandom")


@dataclass(frozen=True)
class Mount:
    """One operation on the new root. ``source`` is a host path (ro/rw) or a link target (symlink)."""

    kind: str
    target: str
    source: str = ""
    size_mb: int = 0


def python_prefix() -> str:
    """The real (symlink-free) installation prefix of the running interpreter."""
    return os.path.realpath(sys.base_prefix)


def sandbox_python() -> str:
    """Path of an interpreter that exists inside the sandbox (the venv's symlink resolved)."""
    return os.path.realpath(sys.executable)


def _system_mounts() -> list[Mount]:
    mounts = [Mount(RO, "/usr", "/usr")]
    for name in _SYSTEM_TOP:
        path = f"/{name}"
        if os.path.islink(path):
            mounts.append(Mount(SYMLINK, path, os.readlink(path)))
        elif os.path.isdir(path):
            mounts.append(Mount(RO, path, path))
    mounts += [Mount(RO, p, p) for p in _ETC_FILES if os.path.exists(p)]
    return mounts


def _under(path: str, mounts: list[Mount]) -> bool:
    return any(
        m.kind == RO and (path == m.target or path.startswith(m.target.rstrip("/") + "/")) for m in mounts
    )


def build_plan(workspace: Path, tmp_size_mb: int, extra_ro: tuple[tuple[str, str], ...] = ()) -> list[Mount]:
    """The ordered mount operations for one sandboxed run (see the module docstring)."""
    mounts = _system_mounts()
    for path in (python_prefix(), os.path.dirname(sandbox_python())):
        if not _under(path, mounts):
            mounts.append(Mount(RO, path, path))
    mounts.append(Mount(TMPFS, "/tmp", size_mb=tmp_size_mb))
    ws = str(Path(workspace).resolve())
    mounts.append(Mount(RW, ws, ws))
    mounts += [Mount(RO, target, source) for source, target in extra_ro]
    mounts += [Mount(PROC, "/proc"), Mount(DEV, "/dev")]
    return with_parent_dirs(mounts)


def with_parent_dirs(mounts: list[Mount]) -> list[Mount]:
    """Insert a 0755 ``DIR`` for every missing ancestor of each mount point, just before it."""
    out: list[Mount] = []
    made: set[str] = {"/"}
    for mount in mounts:
        for parent in reversed(Path(mount.target).parents):
            p = str(parent)
            if p not in made and not _under(p, out):
                out.append(Mount(DIR, p))
                made.add(p)
        out.append(mount)
        made.add(mount.target)
    return out
