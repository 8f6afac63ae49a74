"""A per-episode cap on the workspace's total bytes: the issue's attack (many files, each under the
per-file cap, 1.46 GiB in one 10-second command) fills at most the cap, and reaching it ends the
episode scored as failed. With a size-limited tmpfs (root hosts) the bytes never reach the host;
without one the usage is measured after the action and the episode stops all the same."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

import src.envs.workspace_cap as workspace_cap
from src.envs import LocalGameConfig, LocalGameEnv
from src.envs.base import EXIT_EVALUATION_ERROR

FLOOD = "for i in $(seq 1 12); do head -c 12000000 /dev/zero > f$i.bin; done; echo done"


def _env(tmp_path) -> LocalGameEnv:
    return LocalGameEnv(
        LocalGameConfig(
            simulations=50,
            command_timeout_s=20.0,
            workspace_mb=48,
            file_size_mb=16,
            workspace_root=str(tmp_path),
        )
    )


def _flood(env: LocalGameEnv) -> tuple[float, bool, dict, int]:
    env.reset(seed=0)
    workspace = env.workspace
    obs, reward, done, info = env.step(FLOOD)
    held = workspace_cap.used_bytes(workspace) if workspace is not None and workspace.exists() else 0
    return reward, done, info, held


def test_flood_is_capped_and_ends_the_episode(tmp_path):
    env = _env(tmp_path)
    reward, done, info, held = _flood(env)
    assert done and reward == 0.0 and info["workspace_full"] and info["exit_status"] == EXIT_EVALUATION_ERROR
    if workspace_cap.can_mount() or (os.geteuid() != 0 and workspace_cap.can_hold()):
        assert held <= 48 * 2**20  # the tmpfs refused the rest: 144 MB were attempted
    env.close()
    assert not list(tmp_path.iterdir())  # unmounted and removed


def test_without_a_tmpfs_the_measured_usage_ends_the_episode(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace_cap, "can_mount", lambda: False)
    monkeypatch.setattr(workspace_cap, "can_hold", lambda: False)
    env = _env(tmp_path)
    reward, done, info, held = _flood(env)
    assert done and reward == 0.0 and info["workspace_full"]
    env.close()


def test_ordinary_episode_is_not_affected(tmp_path):
    env = _env(tmp_path)
    env.reset(seed=0)
    obs, reward, done, info = env.step("head -c 1000000 /dev/zero > small.bin; ls")
    assert not done and "small.bin" in obs and "workspace_full" not in info
    env.step("cat > strategy.py << 'EOF'\ndef row_strategy(history):\n    return 0\nEOF")
    _, reward, done, info = env.step("submit")
    assert done and reward == pytest.approx(1.44, abs=0.15)
    env.close()


# Run by an unprivileged uid: two actions of 30 MB each against a 48 MB cap, in one episode.
UNPRIVILEGED_EPISODE = """
import json, os, sys, tempfile
sys.path.insert(0, sys.argv[1])
from src.envs import LocalGameConfig, LocalGameEnv, workspace_cap
root = sys.argv[2]
made = workspace_cap.make_capped(__import__("pathlib").Path(tempfile.mkdtemp(dir=root)), 1)
workspace_cap.remove(made)
env = LocalGameEnv(LocalGameConfig(simulations=20, command_timeout_s=20.0, workspace_mb=48, file_size_mb=40,
                                   workspace_root=root, confinement=sys.argv[3]))
env.reset(seed=0)
first = env.step("head -c 30000000 /dev/zero > a.bin; echo wrote")
second = env.step("head -c 30000000 /dev/zero > b.bin; echo wrote")
host_bytes = sum(os.path.getsize(os.path.join(r, f)) for r, _, fs in os.walk(root) for f in fs)
held = workspace_cap.used_bytes(env.workspace)
env.close()
print(json.dumps({"kind": made.kind, "first_done": first[2], "second": second[3], "held": held,
                  "host_bytes": host_bytes, "left": os.listdir(root)}))
"""


@pytest.mark.parametrize("backend", ["bwrap", "unshare"])
def test_without_root_a_namespace_tmpfs_caps_the_whole_episode(backend):
    """No root: an unprivileged user + mount namespace holds the episode's tmpfs, so the cap holds
    across actions and no byte reaches the host directory (run as uid 65534 from a root host)."""
    python = shutil.which("python3", path="/usr/bin:/bin")  # outside /root: the sandbox can mount it
    if os.geteuid() != 0 or python is None or shutil.which("setpriv") is None:
        pytest.skip("needs root to drop to an unprivileged uid, and a system python3")
    root = tempfile.mkdtemp(prefix="unprivileged-episode-")
    os.chmod(root, 0o777)
    try:
        done = subprocess.run(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                python,
                "-B",
                "-c",
                UNPRIVILEGED_EPISODE,
                str(Path(__file__).resolve().parents[3]),
                root,
                backend,
            ],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if done.returncode != 0 and "no usable confinement tool" in done.stderr:
        pytest.skip(f"{backend} does not work for an unprivileged user here")
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["kind"] == "namespace" and not got["first_done"], got
    assert got["second"]["workspace_full"] and got["second"]["exit_status"] == EXIT_EVALUATION_ERROR, got
    assert got["held"] <= 48 * 2**20 and got["host_bytes"] == 0 and got["left"] == [], got
