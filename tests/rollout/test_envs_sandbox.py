"""Sandboxed command runner: confinement check, timeout + process-group kill, scrubbed env, truncation."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from src.rollout.envs.sandbox import (
    SandboxConfig,
    confinement_violation,
    run_command,
    run_process,
    strip_heredoc_bodies,
    truncate_middle,
)

FAST = SandboxConfig(timeout_s=1.0, max_output_chars=200)


@pytest.mark.parametrize(
    "command",
    [
        "cat strategy.py",
        "ls -la",
        "python -c 'print(4 / 2, 1/2)'",
        "cat > strategy.py << 'EOF'\ndef row_strategy(h):\n    return 0 if len(h) /2 < 3 else 1  # /etc\nEOF",
        "echo hi > /dev/null",
        "cd sub && ls",
        "cd ~ && ls",
        "python strategy.py ...",
    ],
)
def test_confinement_allows_workspace_commands(command, tmp_path):
    assert confinement_violation(command, tmp_path) is None


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("cd ..", "parent directory"),
        ("cat ../secret", "parent directory"),
        ("ls sub/../..", "parent directory"),
        ("cat /etc/passwd", "'/etc/passwd'"),
        ("cd /tmp && ls", "'/tmp'"),
        ("python -c \"open('/root/x')\"", "'/root/x'"),
        ("sudo ls", "'sudo'"),
        ("ln -s x y", "'ln'"),
        ("ls; setsid sleep 9", "'setsid'"),
    ],
)
def test_confinement_refuses_escapes(command, reason, tmp_path):
    violation = confinement_violation(command, tmp_path)
    assert violation is not None and reason in violation


def test_absolute_paths_inside_workspace_are_allowed(tmp_path):
    assert confinement_violation(f"cat {tmp_path.resolve()}/strategy.py", tmp_path) is None


def test_strip_heredoc_bodies_keeps_surrounding_lines():
    command = "cat > a.py << 'EOF'\nx = '/etc'\nEOF\ncat /etc/hosts"
    assert strip_heredoc_bodies(command) == "cat > a.py << 'EOF'\ncat /etc/hosts"


def test_truncate_middle():
    assert truncate_middle("abc", 10) == "abc"
    text = "a" * 50 + "b" * 50
    out = truncate_middle(text, 20)
    assert out.startswith("a" * 10) and out.endswith("b" * 10) and "80 characters cut" in out


def test_runs_in_workspace_with_exit_code(tmp_path):
    result = run_command("pwd; echo err >&2; exit 3", tmp_path, FAST)
    assert Path(result.output.splitlines()[0]).resolve() == tmp_path.resolve()
    assert "err" in result.output
    assert result.exit_code == 3 and not result.timed_out and not result.truncated


def test_scrubbed_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("TOOLROUTER_SECRET_FOR_TEST", "leak")
    result = run_command("env", tmp_path, SandboxConfig(timeout_s=1.0, max_output_chars=2000))
    assert "leak" not in result.output
    assert f"HOME={tmp_path}" in result.output
    assert run_command("python -c 'print(7*6)'", tmp_path, FAST).output.strip() == "42"


def test_timeout_kills_infinite_loop(tmp_path):
    start = time.monotonic()
    result = run_command("echo started; while true; do :; done", tmp_path, FAST)
    assert result.timed_out and result.exit_code is None
    assert "started" in result.output
    assert time.monotonic() - start < 4.0


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] == "Z"  # zombie awaiting its reaper counts as dead
    except FileNotFoundError:
        return True


def test_background_children_are_killed_with_the_group(tmp_path):
    result = run_command("sleep 30 & echo $!", tmp_path, FAST)
    pid = int(result.output.strip())
    deadline = time.monotonic() + 2.0
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(pid)
    if not _gone(pid):  # pragma: no cover - cleanup if the assertion above is ever removed
        os.kill(pid, 9)


def test_output_is_truncated_head_and_tail(tmp_path):
    result = run_command("python -c \"print('A' * 3000 + 'B' * 100000 + 'Z' * 3000)\"", tmp_path, FAST)
    assert result.truncated
    assert result.output.startswith("A" * 100)
    assert result.output.rstrip().endswith("Z" * 50)
    assert "characters cut" in result.output
    assert len(result.output) < 300


def test_config_validation():
    with pytest.raises(ValueError, match="timeout_s"):
        SandboxConfig(timeout_s=0)
    with pytest.raises(ValueError, match="max_output_chars"):
        SandboxConfig(max_output_chars=5)


def test_memory_limit_applies_to_commands_and_processes(tmp_path):
    config = SandboxConfig(timeout_s=2.0, max_output_chars=2000, memory_mb=512)
    hog = "x = bytearray(2 * 1024**3)"
    result = run_command(f'python -c "{hog}"', tmp_path, config)
    assert result.exit_code != 0 and "MemoryError" in result.output
    result = run_process([sys.executable, "-c", hog], tmp_path, config)
    assert result.exit_code != 0 and "MemoryError" in result.output


def test_run_process_passes_stdin_and_argv(tmp_path):
    code = "import sys; print(sys.argv[1], sys.stdin.readline().strip())"
    result = run_process([sys.executable, "-c", code, "a b"], tmp_path, FAST, stdin_text="nonce\n")
    assert result.output.strip() == "a b nonce" and result.exit_code == 0
