"""An episode's workspace with a cap on its total bytes.

Where the host lets us mount (root), the workspace is a tmpfs of ``cap_mb``: writes beyond it fail
with "No space left on device" inside the sandbox, however many files or processes write. Elsewhere
the workspace is a plain directory whose usage is measured after every action. In both cases the
episode checks ``over_cap`` after each action and stops, scored as failed, once the cap is reached.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
from pathlib import Path

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


def make_capped(path: Path, cap_mb: int) -> bool:
    """Turn the empty directory ``path`` into a ``cap_mb`` tmpfs when possible; True if it is one."""
    return can_mount() and _mount(path, cap_mb)


def remove(path: str | os.PathLike, mounted: bool) -> None:
    """Unmount (when it is a tmpfs) and delete a workspace."""
    if mounted:
        _unmount(Path(path))
    shutil.rmtree(path, ignore_errors=True)


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
