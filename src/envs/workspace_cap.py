"""An episode's workspace with a cap on its total bytes.

Where the host lets us mount (root), the workspace is a tmpfs of ``cap_mb``: writes beyond it fail
with "No space left on device" inside the sandbox, however many files or processes write. Without
root, an unprivileged user + mount namespace holds such a tmpfs for the episode and every action
enters it (``NamespaceWorkspace``). Where neither works, the workspace is a plain directory
whose usage is measured after every action. In both cases the
episode checks ``over_cap`` after each action and stops, scored as failed, once the cap is reached.

The namespace-held tmpfs: without root the host cannot mount a tmpfs, but a process in a user
namespace of its own can, in its own mount namespace. A small holder process (``unshare --user
--map-root-user --mount``) mounts a ``cap_mb`` tmpfs on the (empty) workspace directory and waits;
the tmpfs exists only in its mount namespace, for as long as it lives. Every action of the episode
enters that namespace first (``nsenter``: ``enter``), then confines itself as usual, so its writes
land in the tmpfs and fail with "No space left on device" at the cap, across all of the episode's
actions. The trainer reads and writes the workspace through ``/proc/<holder>/root/<path>``
(``host_path``). The holder reads its stdin until it closes, so it ends with the episode
(``close``) or with the trainer.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

_HOLD = 'mount -t tmpfs -o "size=$2m,mode=0700,nosuid,nodev" episode-workspace "$1" && echo ready && exec cat >/dev/null'


class NamespaceWorkspace:
    """The tmpfs on ``path`` held by an unprivileged namespace; see the module docstring."""

    def __init__(self, path: Path, cap_mb: int):
        self.path = Path(path)
        self._holder = subprocess.Popen(
            [
                shutil.which("unshare") or "unshare",
                "--user",
                "--map-root-user",
                "--mount",
                "--propagation=private",
                "/bin/sh",
                "-c",
                _HOLD,
                "workspace-holder",
                str(self.path),
                str(int(cap_mb)),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        if self._holder.stdout.readline().strip() != "ready":
            err = self._holder.stderr.read() if self._holder.wait(timeout=10) is not None else ""
            raise OSError(f"could not hold a tmpfs on {self.path} in a user namespace: {err.strip()[:300]}")

    @property
    def host_path(self) -> Path:
        """The workspace as the trainer's process sees it (through the holder's root)."""
        return Path(f"/proc/{self._holder.pid}/root") / self.path.relative_to("/")

    @property
    def enter(self) -> tuple[str, ...]:
        """The argv prefix that runs a command in the holder's namespaces (where the tmpfs is)."""
        nsenter = shutil.which("nsenter") or "nsenter"
        return (nsenter, f"--target={self._holder.pid}", "--user", "--mount", "--preserve-credentials", "--")

    def close(self) -> None:
        """End the holder: its mount namespace, and with it the tmpfs and its bytes, go."""
        if self._holder.poll() is None:
            self._holder.stdin.close()
            try:
                self._holder.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._holder.kill()
                self._holder.wait()
        for pipe in (self._holder.stdout, self._holder.stderr):
            pipe.close()


@functools.cache
def can_hold() -> bool:
    """Whether an unprivileged namespace can hold a capped tmpfs here (tried once)."""
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return False
    probe = Path(tempfile.mkdtemp(prefix="workspace-ns-probe-"))
    try:
        NamespaceWorkspace(probe, 1).close()
    except OSError as err:
        log.info("no namespace-held workspace tmpfs here (%s)", err)
        return False
    finally:
        shutil.rmtree(probe, ignore_errors=True)
    return True


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
    ``NamespaceWorkspace``) or "measured" (a plain directory, usage measured per action)."""

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
