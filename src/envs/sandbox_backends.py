"""What a sandboxed command runs in: the mount plan, the bubblewrap or util-linux ``unshare`` argv
that builds it, and the memory cgroup that caps the whole process tree.

**Mount plan** (independent of the tool that builds it): a list of ``Mount`` operations applied in
order to an empty root:

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

**Backends**: both give the same boundary: new mount, PID, network, IPC and UTS namespaces; the
mount plan as the whole file system; every capability dropped and ``no_new_privs`` set before the
command runs. When the trainer runs as root, the command also switches to an unprivileged uid of
its own (``SandboxIdentity.uid``), so that what the kernel sees is not root even for files the plan
exposes, and so that the process limit counts only this sandbox's processes. When the trainer is
not root, a user namespace maps the caller to root inside and capabilities are dropped the same
way. With a PID namespace, the command's first process is (or is the only child of) the
namespace's init: when it exits, or when the runner kills it, the kernel kills every other process
in the namespace, including ones that called ``setsid``.

**Memory cap on the whole tree**: where a memory cgroup can be created (cgroup v2 with the
``memory`` controller, or v1's ``memory`` hierarchy; normally as root), each command runs in a
cgroup of its own whose limit is the configured total (``memory_mb``): the kernel OOM-kills inside
the group when its processes together exceed it. Elsewhere the per-process limits are tightened so
that the process cap times the per-process address-space cap stays within the same total
(``split_limits``).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
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


BACKENDS = ("bwrap", "unshare")
CHOICES = ("auto", *BACKENDS)
_UNSHARE_TOOLS = ("unshare", "setpriv", "prlimit", "chroot")


@dataclass(frozen=True)
class SandboxIdentity:
    """Who the command runs as: ``uid``/``gid`` when the trainer is root, else ``None`` (user namespace)."""

    uid: int | None
    gid: int | None


@dataclass(frozen=True)
class Limits:
    """Kernel resource limits for every process in the sandbox; ``None`` leaves one unset."""

    max_processes: int | None
    memory_bytes: int | None
    file_size_bytes: int | None
    cpu_seconds: int | None


def tool_path(name: str) -> str | None:
    """Absolute path of a host tool, also looking in the sbin directories a root PATH may lack."""
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin:/usr/bin:/bin")


def missing_tools(backend: str) -> list[str]:
    """The host programs ``backend`` needs that are not installed."""
    needed = ("bwrap", "setpriv", "prlimit") if backend == "bwrap" else _UNSHARE_TOOLS
    return [t for t in needed if tool_path(t) is None]


def inner_argv(identity: SandboxIdentity, limits: Limits, workspace: str, argv: list[str]) -> list[str]:
    """Drop privileges, apply the limits, enter the workspace, then exec ``argv`` (paths inside the sandbox)."""
    drop = ["/usr/bin/setpriv"]
    if identity.uid is not None:
        drop += [f"--reuid={identity.uid}", f"--regid={identity.gid}", "--clear-groups"]
    drop += ["--bounding-set=-all", "--inh-caps=-all", "--no-new-privs", "--"]
    limit = ["/usr/bin/prlimit", "--core=0:0"]
    for flag, value in (
        ("nproc", limits.max_processes),
        ("as", limits.memory_bytes),
        ("fsize", limits.file_size_bytes),
        ("cpu", limits.cpu_seconds),
    ):
        if value is not None:
            limit.append(f"--{flag}={value}:{value}")
    return [*drop, *limit, "--", "/usr/bin/env", f"--chdir={workspace}", "--", *argv]


def bwrap_argv(plan: list[Mount], identity: SandboxIdentity, inner: list[str]) -> list[str]:
    """``bwrap`` command line: namespaces, the plan's mounts, then ``inner``."""
    args = [tool_path("bwrap") or "bwrap", "--die-with-parent", "--new-session"]
    args += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts"]
    if identity.uid is None:
        args.append("--unshare-user")
    else:  # root: keep just what setpriv needs to switch uid; it then drops everything
        for cap in ("CAP_SETUID", "CAP_SETGID", "CAP_SETPCAP"):
            args += ["--cap-add", cap]
    for m in plan:
        args += _bwrap_mount(m)
    return [*args, "--", *inner]


def _bwrap_mount(m: Mount) -> list[str]:
    if m.kind == RO:
        return ["--ro-bind", m.source, m.target]
    if m.kind == RW:
        return ["--bind", m.source, m.target]
    if m.kind == TMPFS:
        return ["--perms", "1777", "--size", str(m.size_mb * 1024 * 1024), "--tmpfs", m.target]
    if m.kind == SYMLINK:
        return ["--symlink", m.source, m.target]
    if m.kind == DIR:
        return ["--perms", "0755", "--dir", m.target]
    if m.kind == PROC:
        return ["--proc", m.target]
    if m.kind == DEV:
        return ["--dev", m.target]
    raise ValueError(f"unknown mount kind {m.kind!r}")


def unshare_argv(plan: list[Mount], identity: SandboxIdentity, inner: list[str], stage: str) -> list[str]:
    """``unshare`` command line whose PID-1 shell builds the plan under ``stage`` and chroots into it.

    ``stage`` is an empty host directory; the tmpfs mounted on it exists only in the new mount
    namespace. The shell ``exec``s into the command, so the command itself is the namespace's init.
    """
    ns = ["--pid", "--fork", "--kill-child", "--mount", "--propagation=private", "--net", "--ipc", "--uts"]
    if identity.uid is None:
        ns = ["--user", "--map-root-user", *ns]
    script = "\n".join(
        [
            "set -eu",
            "umask 022",
            f"R={shlex.quote(stage)}",
            'mount -t tmpfs -o mode=0755,size=4m sandbox-root "$R"',
            *(_unshare_mount(m) for m in plan),
            'mount -o remount,bind,ro "$R"',
            'exec "$@"',
        ]
    )
    chroot = [tool_path("chroot") or "chroot", stage]
    return [
        tool_path("unshare") or "unshare",
        *ns,
        "--",
        "/bin/sh",
        "-c",
        script,
        "sandbox-setup",
        *chroot,
        *inner,
    ]


def _unshare_mount(m: Mount) -> str:
    t = f'"$R"{shlex.quote(m.target)}'
    src = shlex.quote(m.source)
    if m.kind in (RO, RW):
        make = f"mkdir -p {t}" if os.path.isdir(m.source) else f'mkdir -p "$(dirname {t})"; : > {t}'
        flags = "remount,bind,ro,nosuid,nodev" if m.kind == RO else "remount,bind,nosuid,nodev"
        return f"{make}; mount --bind {src} {t}; mount -o {flags} {t}"
    if m.kind == TMPFS:
        return f"mkdir -p {t}; mount -t tmpfs -o mode=1777,nosuid,nodev,size={m.size_mb}m tmpfs {t}"
    if m.kind == SYMLINK:
        return f"ln -s {src} {t}"
    if m.kind == DIR:
        return f"mkdir -p -m 0755 {t}"
    if m.kind == PROC:
        ro = "; ".join(  # bwrap does the same: the kernel knobs under /proc stay read-only
            f"if [ -e {t}/{p} ]; then mount --bind {t}/{p} {t}/{p}; mount -o remount,bind,ro {t}/{p}; fi"
            for p in ("sys", "sysrq-trigger", "irq", "bus")
        )
        return f"mkdir -p {t}; mount -t proc -o nosuid,nodev,noexec proc {t}; {ro}"
    if m.kind == DEV:
        nodes = "; ".join(f": > {t}/{n}; mount --bind /dev/{n} {t}/{n}" for n in DEV_NODES)
        links = "; ".join(
            f"ln -s /proc/self/fd/{i} {t}/{n}" for i, n in enumerate(("stdin", "stdout", "stderr"))
        )
        return f"mkdir -p {t}; {nodes}; ln -s /proc/self/fd {t}/fd; {links}"
    raise ValueError(f"unknown mount kind {m.kind!r}")


@functools.cache
def host_is_root() -> bool:
    return os.geteuid() == 0


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
