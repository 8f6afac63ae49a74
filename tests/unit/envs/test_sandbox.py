"""Sandboxed command runner: timeout, kill of every descendant, scrubbed env, truncation, limits, config."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from src.envs.sandbox import SandboxConfig, run_command, run_process, sandbox_python, truncate_middle

FAST = SandboxConfig(timeout_s=1.0, max_output_chars=200)


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
    result = run_command("echo started; while true; do :; done", tmp_path, FAST)
    assert result.timed_out and result.exit_code is None
    assert "started" in result.output


def _host_processes_with(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    if marker.encode() in f.read():
                        found.append(int(entry))
            except OSError:
                continue
    return found


def test_background_children_are_killed_when_the_command_ends(tmp_path):
    marker = "30.424242"
    result = run_command(f"sleep {marker} & echo $!", tmp_path, FAST)
    assert result.exit_code == 0 and result.output.strip().isdigit()
    assert _host_processes_with(marker) == []


def test_cpu_time_limit_stops_a_busy_process(tmp_path):
    config = SandboxConfig(timeout_s=20.0, cpu_time_s=1)
    result = run_command("python -c 'while True: pass'", tmp_path, config)
    assert not result.timed_out and result.exit_code not in (0, None)


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
    with pytest.raises(ValueError, match="max_processes"):
        SandboxConfig(max_processes=0)
    with pytest.raises(ValueError, match="confinement.*'none'"):
        SandboxConfig(confinement="none")


def test_memory_limit_applies_to_commands_and_processes(tmp_path):
    config = SandboxConfig(timeout_s=2.0, max_output_chars=2000, memory_mb=512)
    hog = "x = bytearray(2 * 1024**3)"
    result = run_command(f'python -c "{hog}"', tmp_path, config)
    assert result.exit_code != 0 and "MemoryError" in result.output
    result = run_process([sandbox_python(), "-c", hog], tmp_path, config)
    assert result.exit_code != 0 and "MemoryError" in result.output


def test_run_process_passes_stdin_and_argv(tmp_path):
    code = "import sys; print(sys.argv[1], sys.stdin.readline().strip())"
    result = run_process([sandbox_python(), "-c", code, "a b"], tmp_path, FAST, stdin_text="nonce\n")
    assert result.output.strip() == "a b nonce" and result.exit_code == 0


def test_mount_plan_exposes_only_system_python_and_workspace(tmp_path):
    from src.envs.sandbox_backends import RO, RW, build_plan, python_prefix

    plan = build_plan(tmp_path, tmp_size_mb=16)
    readable = {m.target for m in plan if m.kind in (RO, RW)}
    assert {m.target for m in plan if m.kind == RW} == {str(tmp_path.resolve())}
    assert "/usr" in readable
    assert any(python_prefix() == t or python_prefix().startswith(t + "/") for t in readable)
    for forbidden in ("/etc", "/etc/passwd", "/root", "/work", "/home", "/tmp", str(Path.cwd())):
        assert forbidden not in readable
