"""An episode's workspace with a cap on its total bytes.

Where the host lets us mount (root), the workspace is a tmpfs of ``cap_mb``: writes beyond it fail
with "No space left on device" inside the sandbox, however many files or processes write. Without
root, an unprivileged user + mount namespace holds such a tmpfs for the episode and every action
enters it (``src.envs.workspace_ns``). Where neither works, the workspace is a plain directory
whose usage is measured after every action. In both cases the
episode checks ``over_cap`` after each action and stops, scored as failed, once the cap is reached.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from src.envs.workspace_ns import NamespaceWorkspace, can_hold

log = logging.getLogger(__name__)


@functools.cache
def can_mount() -> bool:
    """Whether a size-limited tmpfs can be mounted here (tried once on a scratch directory)."""
    import tempfile

    probe = Path(tempfile.mkdtemp(prefix="workspace-cap-probe-"))
    try:
        mounted = _mount(probe, 1)
        if mounted:
            _unmount(probe)
        return mounted
    finally:
        shutil.rmtree(probe, ignore_errors=True)


def _mount(path: Path, cap_mb: int) -> bool:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    options = f"size={int(cap_mb)}m,mode=0700,nosuid,nodev"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "episode-workspace", str(path)],
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


def _unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True, check=False)


@dataclass(frozen=True)
class CappedWorkspace:
    """An episode's workspace: ``created`` is the host directory; the trainer reaches it at
    ``access``; commands that must see its tmpfs start with ``enter`` (``kind`` "namespace").
    ``kind``: "tmpfs" (mounted here, root), "namespace" (held by an unprivileged namespace,
    ``src.envs.workspace_ns``) or "measured" (a plain directory, usage measured per action)."""

    created: Path
    access: Path
    kind: str
    enter: tuple[str, ...] = ()
    holder: NamespaceWorkspace | None = None


def make_capped(path: Path, cap_mb: int) -> CappedWorkspace:
    """The empty directory ``path`` as a ``cap_mb`` tmpfs: mounted here (root), else held by an
    unprivileged user + mount namespace, else a plain directory measured after each action."""
    if can_mount() and _mount(path, cap_mb):
        return CappedWorkspace(path, path, "tmpfs")
    # as root the sandbox switches to a uid of its own, which the holder's namespace does not map
    if os.geteuid() != 0 and can_hold():
        try:
            held = NamespaceWorkspace(path, cap_mb)
        except OSError as err:
            log.warning("workspace %s: %s; its usage is measured after each action instead", path, err)
        else:
            return CappedWorkspace(path, held.host_path, "namespace", held.enter, held)
    return CappedWorkspace(path, path, "measured")


def remove(workspace: CappedWorkspace) -> None:
    """Unmount its tmpfs or end its holder, and delete the workspace."""
    if workspace.kind == "tmpfs":
        _unmount(workspace.created)
    if workspace.holder is not None:
        workspace.holder.close()
    shutil.rmtree(workspace.created, ignore_errors=True)


def used_bytes(path: Path) -> int:
    """Bytes the workspace holds: the file system's own count for a tmpfs, else a walk."""
    if os.path.ismount(path):
        st = os.statvfs(path)
        return (st.f_blocks - st.f_bfree) * st.f_frsize
    total = 0
    for root, _, files in os.walk(path, onerror=lambda err: None):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except OSError:
                continue
    return total


def over_cap(path: Path, cap_mb: int) -> bool:
    """Whether the workspace reached its cap (a full tmpfs counts: it refuses further writes)."""
    if not path.exists():
        return False
    return used_bytes(path) >= int(cap_mb) * 1024 * 1024 - 4096 * 4
