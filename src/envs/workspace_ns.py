"""A size-capped episode workspace without root: a tmpfs held by an unprivileged user + mount
namespace for the whole episode.

Without root the host cannot mount a tmpfs, but a process in a user namespace of its own can, in
its own mount namespace. A small holder process (``unshare --user --map-root-user --mount``)
mounts a ``cap_mb`` tmpfs on the (empty) workspace directory and waits; the tmpfs exists only in
its mount namespace, for as long as it lives. Every action of the episode enters that namespace
first (``nsenter``: ``enter``), then confines itself as usual, so its writes land in the tmpfs and
fail with "No space left on device" at the cap, across all of the episode's actions. The trainer
reads and writes the workspace through ``/proc/<holder>/root/<path>`` (``host_path``). The holder
reads its stdin until it closes, so it ends with the episode (``close``) or with the trainer.
"""

from __future__ import annotations

import functools
import logging
import shutil
import subprocess
import tempfile
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
