"""Resume's "changed:" line names what the command changed, not the paths a copied run moved."""

from __future__ import annotations

import yaml

from src.jobs.resume import changed_keys


def _manifest(tmp_path, config: dict):
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump({"config": config}))
    return path


def test_paths_under_a_moved_run_dir_are_not_changes(tmp_path):
    then = {
        "run_dir": "/old/run",
        "callbacks": {"rollout_log": {"out_dir": "/old/run/rollouts"}, "other": {"path": "/elsewhere/x"}},
        "router": {"mlp_hidden": 128},
    }
    now = {
        "run_dir": "/new/run",
        "callbacks": {"rollout_log": {"out_dir": "/new/run/rollouts"}, "other": {"path": "/elsewhere/y"}},
        "router": {"mlp_hidden": 64},
    }
    line = changed_keys(_manifest(tmp_path, then), now)
    assert "router.mlp_hidden: 128 -> 64" in line
    assert "callbacks.other.path: '/elsewhere/x' -> '/elsewhere/y'" in line  # not under run_dir
    assert "rollout_log" not in line
    # a path that only starts with the run_dir's text is not under it
    now["callbacks"]["rollout_log"]["out_dir"] = "/new/run2/rollouts"
    assert "callbacks.rollout_log.out_dir" in changed_keys(_manifest(tmp_path, then), now)
