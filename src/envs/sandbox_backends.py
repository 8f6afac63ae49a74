"""Turn a mount plan and an inner command into an argv for bubblewrap or for util-linux ``unshare``.

Both backends give the same boundary: new mount, PID, network, IPC and UTS namespaces; the mount
plan of ``sandbox_mounts`` as the whole file system; every capability dropped and
``no_new_privs`` set before the command runs. When the trainer runs as root, the command also
switches to an unprivileged uid of its own (``SandboxIdentity.uid``), so that what the kernel sees
is not root even for files the plan exposes, and so that the process limit counts only this
sandbox's processes. When the trainer is not root, a user namespace maps the caller to root inside
and capabilities are dropped the same way.

With a PID namespace, the command's first process is (or is the only child of) the namespace's
init: when it exits, or when the runner kills it, the kernel kills every other process in the
namespace, including ones that called ``setsid``.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
from dataclasses import dataclass

from src.envs.sandbox_mounts import DEV, DEV_NODES, DIR, PROC, RO, RW, SYMLINK, TMPFS, Mount

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
