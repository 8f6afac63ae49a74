"""A memory cap on a sandboxed command's whole process tree.

Where a memory cgroup can be created (cgroup v2 with the ``memory`` controller, or v1's ``memory``
hierarchy; normally as root), each command runs in a cgroup of its own whose limit is the
configured total (``memory_mb``): the kernel OOM-kills inside the group when its processes
together exceed it. Elsewhere the per-process limits are tightened so that the process cap times
the per-process address-space cap stays within the same total (``split_limits``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)

_ROOT = Path("/sys/fs/cgroup")
MIN_PROCESS_MB = 256  # below this an interpreter cannot start; the process cap shrinks instead


def split_limits(memory_mb: int, max_processes: int) -> tuple[int, int]:
    """(processes, MB per process) whose product is at most ``memory_mb``, for hosts without a cgroup."""
    processes = max(1, min(max_processes, memory_mb // MIN_PROCESS_MB))
    return processes, max(1, memory_mb // processes)


def _own_cgroup_dir() -> Path | None:
    """This process's cgroup directory with a memory limit we may set beneath it, or None."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "memory" and (_ROOT / "memory").is_dir():
            return _ROOT / "memory" / path.lstrip("/")
        if controllers == "" and (_ROOT / "cgroup.controllers").is_file():
            base = _ROOT / path.lstrip("/")
            if "memory" in (base / "cgroup.subtree_control").read_text().split():
                return base
    return None


def _limit_file(group: Path) -> Path:
    return group / ("memory.max" if (group / "memory.max").exists() else "memory.limit_in_bytes")


@contextlib.contextmanager
def memory_cgroup(memory_mb: int) -> Iterator[Path | None]:
    """A fresh memory cgroup limited to ``memory_mb`` (yielded; removed after), or None when the
    host offers none. Put a process in it with ``join(group)`` before it execs."""
    parent = _own_cgroup_dir()
    group = None
    if parent is not None:
        candidate = parent / f"sandbox-{os.getpid()}-{time.monotonic_ns()}"
        try:
            candidate.mkdir()
            _limit_file(candidate).write_text(str(memory_mb * 1024 * 1024))
            swap = candidate / "memory.memsw.limit_in_bytes"
            if swap.exists():  # v1: no escape into swap either
                with contextlib.suppress(OSError):
                    swap.write_text(str(memory_mb * 1024 * 1024))
            group = candidate
        except OSError as err:
            log.debug("no memory cgroup for the sandbox (%s): per-process limits split instead", err)
            with contextlib.suppress(OSError):
                candidate.rmdir()
    try:
        yield group
    finally:
        if group is not None:
            for _ in range(200):  # the processes are dead; the kernel may take a moment to detach them
                try:
                    group.rmdir()
                    break
                except OSError:
                    time.sleep(0.01)


def available() -> bool:
    """Whether commands here run under a memory cgroup (else the split per-process limits)."""
    with memory_cgroup(64) as group:
        return group is not None


def join(group: Path | None) -> None:
    """Move the calling process into ``group`` (a ``preexec_fn``: runs in the child before exec)."""
    if group is not None:
        (group / "cgroup.procs").write_text(str(os.getpid()))
