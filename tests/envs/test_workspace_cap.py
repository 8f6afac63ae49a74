"""A per-episode cap on the workspace's total bytes: the issue's attack (many files, each under the
per-file cap, 1.46 GiB in one 10-second command) fills at most the cap, and reaching it ends the
episode scored as failed. With a size-limited tmpfs (root hosts) the bytes never reach the host;
without one the usage is measured after the action and the episode stops all the same."""

from __future__ import annotations

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
    if workspace_cap.can_mount():
        assert held <= 48 * 2**20  # the tmpfs refused the rest: 144 MB were attempted
    env.close()
    assert not list(tmp_path.iterdir())  # unmounted and removed


def test_without_a_tmpfs_the_measured_usage_ends_the_episode(tmp_path, monkeypatch):
    monkeypatch.setattr(workspace_cap, "can_mount", lambda: False)
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
