"""Run an agent's shell command, or the agent's code, inside a confinement tool.

The boundary (built by bubblewrap or by util-linux ``unshare``; ``SandboxConfig.confinement``
picks one, ``auto`` prefers bwrap; the mount plan and both tools' argv are in ``sandbox_backends``):

* file system: only the episode's workspace is writable. Readable, read-only: ``/usr`` and the
  ``/bin``/``/lib*`` links, the dynamic linker's config, ``/etc/alternatives``, and the Python
  installation (``sys.base_prefix``). Not the repository, the venv, ``/work``, ``/root``,
  ``/home``, the host's ``/tmp`` or the rest of ``/etc``. ``/tmp`` is a private size-capped tmpfs.
* no network: a fresh network namespace whose loopback is not the host's.
* no privileges: as root, the command runs as an unprivileged uid of its own (derived from the
  workspace path), with every capability dropped and ``no_new_privs``.
* memory: ``memory_mb`` caps the whole process tree: a memory cgroup of its own where the host
  offers one (``sandbox_backends.memory_cgroup``), else per-process address-space and process caps
  whose product stays within it.
* limits per process: processes of that uid (``max_processes``), file size (``file_size_mb``),
  CPU seconds (``cpu_time_s``), no core files.
* lifetime: a PID namespace; when the command ends or times out the namespace's init dies and
  the kernel kills every descendant, including ones that called ``setsid``. The runner waits for
  that before returning.
* environment: scrubbed to PATH, HOME/TMPDIR (the workspace) and a UTF-8 locale; output merged,
  drained continuously, and cut to its head and tail (``max_output_chars``; ``CappedReader`` keeps
  a bounded head and tail of the pipe, the middle is cut).

What it is not: not a defence against kernel exploits (the kernel is shared; no seccomp filter);
CPU time is a per-process limit, so a bounded number of processes can use that many times it
until the step's timeout; the Python installation's own
site-packages are readable. If neither tool works, ``resolve_backend`` raises
``SandboxUnavailableError`` at start-up: nothing ever runs unconfined.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import signal
import subprocess
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import src.envs.sandbox_backends as backends
from src.envs.sandbox_backends import build_plan, memory_cgroup, sandbox_python, split_limits
from src.envs.sandbox_backends import join as cgroup_join

__all__ = [
    "SandboxConfig",
    "SandboxResult",
    "SandboxUnavailableError",
    "resolve_backend",
    "run_command",
    "run_process",
    "run_session",
    "sandbox_python",
    "truncate_middle",
]

T = TypeVar("T")
_BASH = "/bin/bash"
_UID_BASE, _UID_SPAN = 2_000_000, 1_000_000  # far above real users and the usual subuid ranges


class SandboxUnavailableError(RuntimeError):
    """No confinement tool is usable; raised at start-up instead of running anything unconfined."""


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one command; ``cpu_time_s=None`` means ``ceil(timeout_s) + 1``."""

    timeout_s: float = 10.0
    max_output_chars: int = 1000
    memory_mb: int = 4096
    file_size_mb: int = 64
    max_processes: int = 64
    cpu_time_s: int | None = None
    tmp_size_mb: int = 64
    confinement: str = "auto"  # auto | bwrap | unshare
    # argv prefix run before the confinement tool: enters the namespace that holds the workspace's
    # tmpfs where the host cannot mount one (``src.envs.workspace_cap.NamespaceWorkspace``); empty: none
    enter: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"SandboxConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_chars < 20:
            raise ValueError(f"SandboxConfig.max_output_chars must be >= 20, got {self.max_output_chars}")
        for name in ("memory_mb", "file_size_mb", "max_processes", "tmp_size_mb"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"SandboxConfig.{name} must be an int >= 1, got {value!r}")
        if self.cpu_time_s is not None and self.cpu_time_s < 1:
            raise ValueError(f"SandboxConfig.cpu_time_s must be >= 1 or None, got {self.cpu_time_s}")
        if self.confinement not in backends.CHOICES:
            raise ValueError(
                f"SandboxConfig.confinement must be one of {list(backends.CHOICES)}, got {self.confinement!r}"
            )

    def limits(self, whole_tree_capped: bool = False) -> backends.Limits:
        """Per-process kernel limits. ``memory_mb`` is the whole tree's total: with a memory cgroup
        holding the tree (``whole_tree_capped``) each process may use all of it; without one, the
        process cap and the per-process cap are split so that their product stays within it."""
        cpu = self.cpu_time_s if self.cpu_time_s is not None else math.ceil(self.timeout_s) + 1
        processes, per_process_mb = (
            (self.max_processes, self.memory_mb)
            if whole_tree_capped
            else split_limits(self.memory_mb, self.max_processes)
        )
        return backends.Limits(
            max_processes=processes,
            memory_bytes=per_process_mb * 1024 * 1024,
            file_size_bytes=self.file_size_mb * 1024 * 1024,
            cpu_seconds=cpu,
        )


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one command: merged output (already truncated), exit code, whether it was killed."""

    output: str
    exit_code: int | None  # None when killed by the timeout
    timed_out: bool
    truncated: bool


def scrubbed_env(workspace: Path) -> dict[str, str]:
    """Minimal environment: no inherited secrets or config variables."""
    python_dir = os.path.dirname(sandbox_python())
    return {
        "PATH": f"{python_dir}:/usr/local/bin:/usr/bin:/bin",
        "HOME": str(workspace),
        "TMPDIR": str(workspace),
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "TERM": "dumb",
    }


def identity_for(workspace: Path) -> backends.SandboxIdentity:
    """As root: an unprivileged uid/gid per workspace (so process limits are per sandbox); else None."""
    if not backends.host_is_root():
        return backends.SandboxIdentity(uid=None, gid=None)
    uid = _UID_BASE + zlib.crc32(str(workspace).encode()) % _UID_SPAN
    return backends.SandboxIdentity(uid=uid, gid=uid)


@functools.cache
def resolve_backend(choice: str = "auto") -> str:
    """The backend to use for ``choice``, verified by running ``/bin/true`` in a real sandbox once.

    Raises ``SandboxUnavailableError`` naming what is missing and how to install it.
    """
    if choice not in backends.CHOICES:
        raise ValueError(f"confinement must be one of {list(backends.CHOICES)}, got {choice!r}")
    candidates = backends.BACKENDS if choice == "auto" else (choice,)
    problems = []
    for backend in candidates:
        problem = _probe(backend)
        if problem is None:
            return backend
        problems.append(f"{backend}: {problem}")
    raise SandboxUnavailableError(
        f"no usable confinement tool for confinement={choice!r} ({'; '.join(problems)}). Agent commands "
        "never run unconfined: install bubblewrap (`make setup` does: apt-get install -y bubblewrap) "
        "or allow Linux namespaces for util-linux `unshare`."
    )


def _probe(backend: str) -> str | None:
    missing = backends.missing_tools(backend)
    if missing:
        return f"{', '.join(missing)} not installed"
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as ws:
        config = SandboxConfig(timeout_s=20.0, confinement=backend)
        result = _run_confined(backend, ["/bin/true"], Path(ws), config, None, ())
    if result.exit_code != 0:
        return f"a test run failed (exit code {result.exit_code}): {result.output.strip()[:300]}"
    return None


def run_process(
    argv: list[str],
    workspace: Path,
    config: SandboxConfig,
    stdin_text: str | None = None,
    extra_ro: tuple[tuple[str, str], ...] = (),
) -> SandboxResult:
    """Run ``argv`` (paths as seen inside the sandbox) confined, cwd = workspace; never raises on failure.

    ``extra_ro`` holds ``(host_path, sandbox_path)`` pairs mounted read-only (e.g. a runner script).
    """
    backend = resolve_backend(config.confinement)
    return _run_confined(backend, argv, Path(workspace), config, stdin_text, extra_ro)


def run_command(command: str, workspace: Path, config: SandboxConfig) -> SandboxResult:
    """Run one shell command in a fresh non-interactive bash (state such as ``cd`` does not persist)."""
    return run_process([_BASH, "--noprofile", "--norc", "-c", command], workspace, config)


@contextlib.contextmanager
def _confined_argv(
    backend: str,
    argv: list[str],
    workspace: Path,
    config: SandboxConfig,
    extra_ro: tuple[tuple[str, str], ...],
):
    """The host command line that runs ``argv`` confined by ``backend`` (yielded; cleaned up after)."""
    ws = Path(workspace).resolve()
    identity = identity_for(ws)
    _hand_over(ws, identity)
    plan = build_plan(ws, config.tmp_size_mb, extra_ro)
    with memory_cgroup(config.memory_mb) as group:
        inner = backends.inner_argv(
            identity, config.limits(whole_tree_capped=group is not None), str(ws), argv
        )
        if backend == "bwrap":
            yield [*config.enter, *backends.bwrap_argv(plan, identity, inner)], group
            return
        stage = tempfile.mkdtemp(prefix="sandbox-root-")
        try:
            yield [*config.enter, *backends.unshare_argv(plan, identity, inner, stage)], group
        finally:
            os.rmdir(stage)  # the tmpfs on it lived only in the sandbox's mount namespace


def _run_confined(
    backend: str,
    argv: list[str],
    workspace: Path,
    config: SandboxConfig,
    stdin_text: str | None,
    extra_ro: tuple[tuple[str, str], ...],
) -> SandboxResult:
    ws = Path(workspace).resolve()
    with _confined_argv(backend, argv, ws, config, extra_ro) as (host_argv, group):
        return _run(host_argv, ws, config, stdin_text, group)


def run_session(
    argv: list[str],
    workspace: Path,
    config: SandboxConfig,
    talk: Callable[[Callable[[], str], Callable[[str], None]], T],
    extra_ro: tuple[tuple[str, str], ...] = (),
    line_limit: int = 1 << 20,
) -> tuple[T | None, BaseException | None, bool]:
    """Run ``argv`` confined and converse with it line by line: ``talk(recv, send)`` runs here, in
    the caller's process, for at most ``config.timeout_s``; then every process of the sandbox is
    killed. Returns (talk's result, talk's exception, timed out). ``recv`` returns "" at the end."""
    backend = resolve_backend(config.confinement)
    ws = Path(workspace).resolve()
    with _confined_argv(backend, argv, ws, config, extra_ro) as (host_argv, group):
        proc = subprocess.Popen(
            host_argv,
            cwd="/",
            env=scrubbed_env(ws),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=functools.partial(cgroup_join, group),
        )
        outcome: dict[str, Any] = {}

        def recv() -> str:
            return proc.stdout.readline(line_limit).decode("utf-8", errors="replace").strip()

        def send(line: str) -> None:
            proc.stdin.write((line + "\n").encode())
            proc.stdin.flush()

        def converse() -> None:
            try:
                outcome["value"] = talk(recv, send)
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                outcome["error"] = exc

        worker = threading.Thread(target=converse, daemon=True)
        worker.start()
        worker.join(timeout=config.timeout_s)
        timed_out = worker.is_alive()
        _kill_group(proc.pid)
        proc.wait()
        _wait_group_gone(proc.pid)
        for pipe in (proc.stdin, proc.stdout):
            try:
                pipe.close()
            except OSError:
                pass
        worker.join(timeout=2.0)
    return outcome.get("value"), outcome.get("error"), timed_out


def _hand_over(ws: Path, identity: backends.SandboxIdentity) -> None:
    """Give the sandbox uid the workspace and the files the trainer put in it (not recursive: the
    trainer only writes top-level files; ``lchown`` so an agent's symlink is never followed)."""
    if identity.uid is None:
        return
    os.chown(ws, identity.uid, identity.gid)
    with os.scandir(ws) as entries:
        for entry in entries:
            if entry.stat(follow_symlinks=False).st_uid != identity.uid:
                os.lchown(entry.path, identity.uid, identity.gid)


def _run(
    argv: list[str], workspace: Path, config: SandboxConfig, stdin_text: str | None, group: Path | None
) -> SandboxResult:
    cap = 4 * config.max_output_chars + 4096  # bytes; generous so multi-byte text survives decoding
    proc = subprocess.Popen(
        argv,
        cwd="/",
        env=scrubbed_env(workspace),
        stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # new session => new process group whose id is proc.pid
        preexec_fn=functools.partial(cgroup_join, group),  # the whole tree shares one memory cap
    )
    reader = CappedReader(proc.stdout, cap)
    reader.start()
    _feed(proc, stdin_text)
    timed_out = False
    try:
        proc.wait(timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)
        proc.wait()
        _wait_group_gone(proc.pid)
    reader.join(timeout=2.0)
    head = bytes(reader.head).decode("utf-8", errors="replace")
    tail = bytes(reader.tail).decode("utf-8", errors="replace")
    dropped = reader.total - len(reader.head) - len(reader.tail)
    output, truncated = assemble(head, tail, dropped, config.max_output_chars)
    return SandboxResult(
        output=output,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        truncated=truncated,
    )


def _feed(proc: subprocess.Popen, stdin_text: str | None) -> None:
    if stdin_text is None:
        return
    try:
        proc.stdin.write(stdin_text.encode())
        proc.stdin.close()
    except BrokenPipeError:
        pass


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def _wait_group_gone(pgid: int, limit_s: float = 5.0) -> None:
    """Wait until no live process is left in ``pgid``. The namespace's init is in that group; once it
    is dead (or a zombie) the kernel has already killed and reaped the rest of the namespace."""
    deadline = time.monotonic() + limit_s
    while _live_members(pgid) and time.monotonic() < deadline:
        time.sleep(0.01)


def _live_members(pgid: int) -> bool:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="ascii", errors="replace") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` (len <= max_chars plus a one-line marker)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"


class CappedReader(threading.Thread):
    """Drains a pipe, keeping at most ``cap`` bytes of its head and of its tail."""

    def __init__(self, stream, cap: int) -> None:
        super().__init__(daemon=True)
        self._stream, self._cap = stream, cap
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def run(self) -> None:
        while True:
            chunk = self._stream.read1(65536) if hasattr(self._stream, "read1") else self._stream.read(65536)
            if not chunk:
                return
            self.total += len(chunk)
            room = self._cap - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            if chunk:
                self.tail += chunk
                if len(self.tail) > self._cap:
                    del self.tail[: len(self.tail) - self._cap]


def assemble(head: str, tail: str, dropped_bytes: int, max_chars: int) -> tuple[str, bool]:
    """Join the kept head and tail into at most ``max_output_chars`` characters (plus a marker line)."""
    if dropped_bytes <= 0:  # nothing was dropped while reading: head + tail is the whole output
        text = head + tail
        return truncate_middle(text, max_chars), len(text) > max_chars
    # Both buffers are full (cap bytes >= max_output_chars characters), so the slices below are exact.
    half = max_chars // 2
    rest = max_chars - half
    cut = dropped_bytes + (len(head) - half) + (len(tail) - rest)
    return f"{head[:half]}\n[... about {cut} characters cut ...]\n{tail[len(tail) - rest :]}", True
