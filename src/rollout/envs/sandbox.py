"""Run an agent's shell command (or an evaluator) in a confined subprocess.

What it does:
* runs in a fresh process group (``start_new_session``); on timeout the whole group gets SIGKILL
  via ``os.killpg``, and the group is killed after normal exit too, so background jobs (``cmd &``)
  cannot outlive the step;
* cwd is the workspace; the environment is scrubbed to a few variables (PATH with the interpreter's
  directory so ``python`` works, HOME and TMPDIR pointing at the workspace, a UTF-8 locale);
* ``ulimit`` caps virtual memory and file size when configured;
* output (stdout + stderr, merged) is drained continuously, and only its head and tail are kept
  and truncated to ``max_output_chars`` characters, so ``yes`` or ``cat big.bin`` cannot flood memory;
* ``confinement_violation`` refuses commands that mention ``..`` path components, absolute paths
  outside the workspace, or a few escape tools (sudo, ln, setsid, ...).

Limits (best effort, NOT a security boundary): the path check is textual, so code run by the
command (``python -c "import os; os.chdir(os.path.dirname(os.getcwd()))"``) can still reach the
rest of the file system with the user's permissions; network access is not blocked; a process that
calls setsid() itself escapes the group kill. Use the MLGym container adapter for real isolation.
Heredoc bodies (the file text in ``cat > f << 'EOF' ... EOF``) are data and are not checked, so
Python code like ``x /len(h)`` inside a heredoc is not refused.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

_BASH = "/bin/bash" if Path("/bin/bash").exists() else "/bin/sh"

# A path token that starts with "/" (not preceded by a word char, so "a/b" and "1/2" are fine).
_ABS_PATH = re.compile(r"""(?<![\w.~$})\]-])(/[^\s'"`;|&<>()]*)""")
# ".." as a whole path component.
_PARENT = re.compile(r"""(?:^|[\s/'"=:`(])\.\.(?=$|[/\s'"`;|&)])""")
_DENIED_WORDS = ("sudo", "su", "ln", "chroot", "mount", "setsid", "nohup", "disown", "pkill", "killall")
_DENIED = re.compile(r"(?:^|[\s;|&(`])(" + "|".join(_DENIED_WORDS) + r")(?=$|\s)")
_HEREDOC_START = re.compile(r"<<-?\s*(['\"]?)([A-Za-z_][A-Za-z0-9_]*)\1")
_ALLOWED_ABS = ("/dev/null",)


@dataclass(frozen=True)
class SandboxConfig:
    """Limits for one command. ``None`` disables a ulimit."""

    timeout_s: float = 10.0
    max_output_chars: int = 1000
    memory_mb: int | None = 4096
    file_size_mb: int | None = 64

    def __post_init__(self) -> None:
        if self.timeout_s <= 0:
            raise ValueError(f"SandboxConfig.timeout_s must be > 0, got {self.timeout_s}")
        if self.max_output_chars < 20:
            raise ValueError(f"SandboxConfig.max_output_chars must be >= 20, got {self.max_output_chars}")


@dataclass(frozen=True)
class SandboxResult:
    """Outcome of one command: merged output (already truncated), exit code, whether it was killed."""

    output: str
    exit_code: int | None  # None when killed by the timeout
    timed_out: bool
    truncated: bool


def strip_heredoc_bodies(command: str) -> str:
    """Drop the bodies of heredocs (``<< 'EOF' ... EOF``), keeping the command lines around them."""
    lines = command.split("\n")
    kept: list[str] = []
    i = 0
    while i < len(lines):
        kept.append(lines[i])
        delimiters = [m.group(2) for m in _HEREDOC_START.finditer(lines[i])]
        i += 1
        for delim in delimiters:
            while i < len(lines) and lines[i].strip() != delim:
                i += 1
            i += 1  # skip the delimiter line itself
    return "\n".join(kept)


def confinement_violation(command: str, workspace: Path) -> str | None:
    """Why ``command`` is refused, or None when it looks confined to ``workspace`` (textual check only)."""
    text = strip_heredoc_bodies(command)
    if _PARENT.search(text):
        return "it refers to a parent directory ('..')"
    ws = str(Path(workspace).resolve())
    for match in _ABS_PATH.finditer(text):
        path = match.group(1)
        if len(path) == 1:  # a lone "/" operator, e.g. "4 / 2"
            continue
        if path in _ALLOWED_ABS or path == ws or path.startswith(ws + "/"):
            continue
        return f"it uses the absolute path {path!r} outside the workspace"
    denied = _DENIED.search(text)
    if denied:
        return f"the command {denied.group(1)!r} is not allowed here"
    return None


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of ``text`` (len <= max_chars plus a one-line marker)."""
    if len(text) <= max_chars:
        return text
    head = max_chars // 2
    tail = max_chars - head
    cut = len(text) - head - tail
    return f"{text[:head]}\n[... {cut} characters cut ...]\n{text[len(text) - tail :]}"


def scrubbed_env(workspace: Path) -> dict[str, str]:
    """Minimal environment: no inherited secrets or config variables."""
    python_dir = str(Path(sys.executable).parent)
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


class _CappedReader(threading.Thread):
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


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass  # already gone


def run_process(
    argv: list[str], workspace: Path, config: SandboxConfig, stdin_text: str | None = None
) -> SandboxResult:
    """Run ``argv`` with cwd=workspace under ``config``'s limits; never raises on timeout or failure exit."""
    # bash applies the ulimits and then exec()s argv (no preexec_fn: unsafe in threaded trainers).
    wrapped = [_BASH, "--noprofile", "--norc", "-c", _ulimit_prefix(config) + 'exec "$@"', "sandbox", *argv]
    return _run(wrapped, Path(workspace), config, stdin_text)


def run_command(command: str, workspace: Path, config: SandboxConfig) -> SandboxResult:
    """Run one shell command in a fresh non-interactive bash (state such as ``cd`` does not persist)."""
    script = _ulimit_prefix(config) + command
    return _run([_BASH, "--noprofile", "--norc", "-c", script], Path(workspace), config, None)


def _run(argv: list[str], workspace: Path, config: SandboxConfig, stdin_text: str | None) -> SandboxResult:
    cap = 4 * config.max_output_chars + 4096  # bytes; generous so multi-byte text survives decoding
    proc = subprocess.Popen(
        argv,
        cwd=workspace,
        env=scrubbed_env(workspace),
        stdin=subprocess.PIPE if stdin_text is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,  # new session => new process group whose id is proc.pid
    )
    reader = _CappedReader(proc.stdout, cap)
    reader.start()
    if stdin_text is not None:
        try:
            proc.stdin.write(stdin_text.encode())
            proc.stdin.close()
        except BrokenPipeError:
            pass
    timed_out = False
    try:
        proc.wait(timeout=config.timeout_s)
    except subprocess.TimeoutExpired:
        timed_out = True
    finally:
        _kill_group(proc.pid)
        proc.wait()
    reader.join(timeout=2.0)  # a setsid()-escaped child could hold the pipe; do not wait on it forever
    head = bytes(reader.head).decode("utf-8", errors="replace")
    tail = bytes(reader.tail).decode("utf-8", errors="replace")
    output, truncated = _assemble(head, tail, reader.total - len(reader.head) - len(reader.tail), config)
    return SandboxResult(
        output=output,
        exit_code=None if timed_out else proc.returncode,
        timed_out=timed_out,
        truncated=truncated,
    )


def _assemble(head: str, tail: str, dropped_bytes: int, config: SandboxConfig) -> tuple[str, bool]:
    """Join the kept head and tail into at most ``max_output_chars`` characters (plus a marker line)."""
    if dropped_bytes <= 0:  # nothing was dropped while reading: head + tail is the whole output
        text = head + tail
        return truncate_middle(text, config.max_output_chars), len(text) > config.max_output_chars
    # Both buffers are full (cap bytes >= max_output_chars characters), so the slices below are exact.
    half = config.max_output_chars // 2
    rest = config.max_output_chars - half
    cut = dropped_bytes + (len(head) - half) + (len(tail) - rest)
    return f"{head[:half]}\n[... about {cut} characters cut ...]\n{tail[len(tail) - rest :]}", True


def _ulimit_prefix(config: SandboxConfig) -> str:
    parts = []
    if config.memory_mb is not None:
        parts.append(f"ulimit -v {config.memory_mb * 1024} 2>/dev/null")
    if config.file_size_mb is not None:
        parts.append(f"ulimit -f {config.file_size_mb * 1024} 2>/dev/null")  # bash counts 1 KiB blocks
    return "; ".join(parts) + ("\n" if parts else "")
