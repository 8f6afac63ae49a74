"""Escape attempts through LocalGameEnv, on every confinement backend this machine has: none may work.

Each test acts as an agent would (a shell action, or a strategy file then ``validate``/``submit``)
and checks on the host that nothing leaked, persisted or scored.
"""

from __future__ import annotations

import math
import os
import secrets
import socket
import threading
from pathlib import Path

import pytest

from src.envs import LocalGameConfig, LocalGameEnv
from src.envs.base import EXIT_EVALUATION_ERROR
from src.envs.sandbox import SandboxUnavailableError, resolve_backend

REPO = Path(__file__).resolve().parents[3]


def _usable(backend: str) -> bool:
    try:
        resolve_backend(backend)
    except SandboxUnavailableError:
        return False
    return True


@pytest.fixture(params=["bwrap", "unshare"])
def backend(request) -> str:
    if not _usable(request.param):
        pytest.skip(f"{request.param} is not usable here (test_auto_backend_is_usable requires one of them)")
    return request.param


@pytest.fixture
def env(tmp_path, backend):
    config = LocalGameConfig(
        simulations=200,
        command_timeout_s=3.0,
        eval_timeout_s=10.0,
        workspace_root=str(tmp_path),
        max_steps=20,
        max_output_chars=4000,
        file_size_mb=8,
        max_processes=32,
        confinement=backend,
    )
    environment = LocalGameEnv(config)
    environment.reset(seed=0)
    yield environment
    environment.close()


def _write(body: str) -> str:
    return f"cat > strategy.py << 'EOF'\n{body}\nEOF"


def _host_processes_with(marker: str) -> list[int]:
    """Live host processes whose command line contains ``marker``."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            continue
    return found


def test_auto_backend_is_usable():
    assert resolve_backend("auto") in ("bwrap", "unshare")


@pytest.mark.parametrize(
    "command",
    [
        "cat /etc/passwd",
        "python -c \"print(open(chr(47) + 'etc' + chr(47) + 'passwd').read())\"",
        "cat \"$(printf '\\x2fetc\\x2fpasswd')\"",
        "printf '\\x2fetc\\x2fpasswd' | xargs cat",
        "cd / && cd etc && cat passwd",
        "python -c \"import os; os.chdir('..'); os.chdir('..'); os.chdir('..'); print(open('etc/passwd').read())\"",
    ],
    ids=["plain", "chr47", "printf_subst", "printf_xargs", "cd_chain", "python_chdir"],
)
def test_host_passwd_is_not_readable(env, command):
    obs, _, _, _ = env.step(command)
    assert "root:x:0:0" not in obs


def test_repository_is_not_readable(env):
    pyproject = REPO / "pyproject.toml"
    assert "[project]" in pyproject.read_text()
    obs, _, _, _ = env.step(f"cat {pyproject}; ls {REPO}; ls /work; ls /root; cat ../../../../pyproject.toml")
    assert "[project]" not in obs and "src" not in obs.split() and "tests" not in obs.split()


def test_host_tmp_is_not_listable(env):
    with open(f"/tmp/host-marker-{secrets.token_hex(6)}", "w") as marker:
        name = os.path.basename(marker.name)
        obs, _, _, _ = env.step("ls -a /tmp; python -c \"import os; print(os.listdir(chr(47) + 'tmp'))\"")
    os.unlink(marker.name)
    assert name not in obs


def test_writes_outside_the_workspace_do_not_reach_the_host(env, tmp_path):
    token = secrets.token_hex(6)
    ws = Path(env.workspace).resolve()
    targets = [
        Path(f"/tmp/escape-{token}"),
        ws.parent / f"escape-{token}",
        Path(f"/usr/local/escape-{token}"),
    ]
    command = "; ".join(f"echo x > {t}" for t in targets)
    command += (
        f"; python -c \"open(chr(47) + 'tmp' + chr(47) + 'py-{token}', 'w').write('x')\"; echo x > ok.txt"
    )
    obs, _, _, _ = env.step(command)
    assert (ws / "ok.txt").read_text() == "x\n"  # the workspace itself is writable
    for target in [*targets, Path(f"/tmp/py-{token}")]:
        assert not target.exists(), obs


def test_no_network_to_the_host(env):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    server.settimeout(3.0)
    port = server.getsockname()[1]
    accepted: list = []
    thread = threading.Thread(target=lambda: accepted.append(_accept(server)))
    thread.start()
    code = f"import socket; s = socket.socket(); s.settimeout(2); s.connect(('127.0.0.1', {port})); print('CONNECTED')"
    obs, _, _, _ = env.step(
        f'python -c "{code}"; (echo hi > /dev/tcp/127.0.0.1/{port}) && echo BASH_CONNECTED'
    )
    thread.join()
    server.close()
    assert "CONNECTED" not in obs and accepted == [None]


def _accept(server: socket.socket):
    try:
        conn, _ = server.accept()
    except OSError:
        return None
    conn.close()
    return "accepted"


def test_setsid_and_daemon_children_die_with_the_step(env):
    marker = f"9{secrets.randbelow(10**6)}.{secrets.randbelow(10**6)}"
    daemon = f"import os, time; os.fork() and os._exit(0); os.setsid(); os.fork() and os._exit(0); time.sleep({marker})"
    obs, _, _, info = env.step(
        f"setsid sleep {marker} & nohup sleep {marker} > /dev/null 2>&1 & setsid -f sleep {marker}; "
        f'python -c "{daemon}"; echo started'
    )
    assert "started" in obs and not info["timed_out"]
    assert _host_processes_with(marker) == []  # no polling: dead when step() returns


def test_fork_bomb_is_bounded_by_the_process_limit(env):
    counter = (
        "import os, time\nn = 0\ntry:\n    while n < 5000:\n        if os.fork() == 0:\n"
        "            time.sleep(60)\n            os._exit(0)\n        n += 1\nexcept OSError as e:\n"
        "    print('stopped after', n, type(e).__name__)\n"
    )
    obs, _, _, _ = env.step(_write(counter).replace("strategy.py", "bomb.py") + "\npython bomb.py")
    stopped = [line for line in obs.splitlines() if line.startswith("stopped after")]
    assert stopped and int(stopped[0].split()[2]) < 32, obs
    obs, _, done, info = env.step(":(){ :|:& };:")  # the classic one: the step still ends
    assert not done and "step" in info
    obs, _, _, _ = env.step("echo alive")
    assert obs.startswith("alive")


def test_huge_file_is_bounded_by_the_file_size_limit(env):
    env.step(
        "head -c 100M /dev/zero > big.bin; python -c \"open('big2.bin', 'wb').write(bytes(50 * 2**20))\""
    )
    for name in ("big.bin", "big2.bin"):
        path = Path(env.workspace) / name
        assert not path.exists() or path.stat().st_size <= 8 * 2**20


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ("def row_strategy(history):\n    return float('nan')", "must return the int 0 or 1"),
        ("def row_strategy(history):\n    return float('inf')", "must return the int 0 or 1"),
        ("def row_strategy(history):\n    return 1e9", "must return the int 0 or 1"),
    ],
    ids=["nan", "inf", "huge"],
)
def test_cheating_strategies_are_rejected(env, body, expected):
    env.step(_write(body))
    obs, _, _, info = env.step("validate")
    assert "validation_score" not in info and expected in info["eval_error"], obs
    obs, reward, done, info = env.step("submit")
    assert done and reward == 0.0 and info["exit_status"] == EXIT_EVALUATION_ERROR
    assert math.isfinite(reward)


def test_honest_scores_are_unchanged(env):
    _, _, _, info = env.step("validate")
    assert info["validation_score"] == pytest.approx(1.02, abs=0.1)
    env.step(_write("def row_strategy(history):\n    return 0"))
    _, reward, done, _ = env.step("submit")
    assert done and reward == pytest.approx(1.44, abs=0.1)


def test_no_usable_tool_is_a_start_up_error(monkeypatch, tmp_path):
    from src.envs import sandbox_backends

    monkeypatch.setattr(sandbox_backends, "missing_tools", lambda backend: [backend])
    resolve_backend.cache_clear()
    try:
        with pytest.raises(SandboxUnavailableError, match="bwrap.*unshare.*never run unconfined"):
            LocalGameEnv(LocalGameConfig(workspace_root=str(tmp_path)))
    finally:
        resolve_backend.cache_clear()


def test_bad_confinement_choice_is_named():
    with pytest.raises(ValueError, match="confinement"):
        LocalGameEnv(LocalGameConfig(confinement="none"))
