"""Issue 14 end to end through scripts/train.py: replay (colocated and with a Ray worker), the
on-policy limit, a worker crash surfacing in the trainer, the curriculum job and its start-up checks."""

from __future__ import annotations

import subprocess

import pytest
import torch
from jobhelpers import REPO, run_train, scalars, train_cmd

TINY = ("sampling.n_prompts=2", "sampling.max_new_tokens=16")
REPLAY = (
    "replay.capacity=256",
    "replay.max_samples_per_rollout=2",
    "replay.max_batch_latency=2",
    "algorithm.old_log_prob_source=rollout",
)


def _check_replay_bounds(run_dir, steps: int):
    s = scalars(run_dir)
    for tag in ("replay/size", "replay/reuse_mean", "replay/age_mean", "replay/age_max", "replay/dropped_stale"):
        assert [step for step, _ in s[tag]] == list(range(steps)), tag
    assert max(v for _, v in s["replay/reuse_mean"]) <= 2
    assert max(v for _, v in s["replay/age_max"]) <= 2
    return s


def test_replay_job_keeps_reuse_and_age_within_bounds(tmp_path):
    run_dir = tmp_path / "run"
    # alpha 0: a uniform draw, so older groups are replayed for sure within six steps
    run_train("experiment=grpo", *REPLAY, "replay.alpha=0", "trainer.max_steps=6", *TINY, f"run_dir={run_dir}")
    s = _check_replay_bounds(run_dir, 6)
    assert max(v for _, v in s["replay/age_max"]) >= 1  # older groups were really replayed
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    assert "generator" in state["rollout_pipeline"]["buffer"]["buffer"]  # contents and RNG are checkpointed


def test_capacity_zero_is_the_on_policy_step(tmp_path):
    plain, zero = tmp_path / "plain", tmp_path / "zero"
    run_train("experiment=grpo", "trainer.max_steps=2", *TINY, f"run_dir={plain}")
    run_train(
        "experiment=grpo", "trainer.max_steps=2", *TINY, "replay.capacity=0",
        "replay.max_samples_per_rollout=1", "replay.max_batch_latency=0", f"run_dir={zero}",
    )
    a, b = scalars(plain), scalars(zero)
    for tag in ("train/pg_loss", "train/entropy", "train/reward_task_mean"):
        assert a[tag] == b[tag], tag


def test_one_ray_worker_feeds_the_buffer_within_bounds(tmp_path):
    pytest.importorskip("ray")
    run_dir = tmp_path / "run"
    run_train("experiment=grpo", *REPLAY, "trainer.max_steps=6", *TINY, "rollout.workers=1", f"run_dir={run_dir}")
    _check_replay_bounds(run_dir, 6)


class _Exploding:
    """A worker policy whose collection fails deep inside (as a bug in a collector would)."""

    def load_policy_state(self, state_dict):
        pass

    def collect(self, request):
        return {}["no such key"]


def test_a_crash_in_a_worker_surfaces_in_the_trainer_with_its_traceback():
    pytest.importorskip("ray")
    from src.replay.buffer import RolloutWorkerError, RolloutWorkerPool

    pool = RolloutWorkerPool(1, _Exploding)
    try:
        pool.submit([{"uid": 0}], step=0, lam=0.0, seed=0)
        with pytest.raises(RolloutWorkerError) as err:
            pool.ready(block=True)
        msg = str(err.value)  # the worker's frames, down to the failing line
        assert "KeyError" in msg and 'return {}["no such key"]' in msg and "in collect" in msg
    finally:
        pool.shutdown()


def test_cyclic_lessons_exit_at_start_up_naming_the_cycle(tmp_path):
    cmd = train_cmd(
        "experiment=curriculum",
        "+curriculum.lessons.easy.dependencies=[{dependency_id: hard, reward_threshold: 0.0}]",
        f"run_dir={tmp_path / 'run'}",
    )
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    assert "dependency cycle easy -> hard -> easy" in proc.stderr + proc.stdout


def test_curriculum_job_logs_lesson_scalars_and_gates_the_hard_lesson(tmp_path):
    run_dir = tmp_path / "run"
    run_train(
        "experiment=curriculum", "trainer.max_steps=4", "curriculum.eval_frequency=2", "curriculum.eval_prompts=2",
        "sft.max_steps=2", "sampling.n_prompts=2", "sampling.max_new_tokens=16",
        "curriculum.lessons.hard.sampling.max_new_tokens=16", f"run_dir={run_dir}",
    )
    s = scalars(run_dir)
    for lesson in ("easy", "hard"):
        for what in ("active", "weight", "graduated"):
            assert len(s[f"curriculum/{lesson}/{what}"]) == 4
    assert s["curriculum/easy/active"][0][1] == 1.0
    assert "curriculum/easy/eval_reward" in s
    state = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    cur = state["rollout_pipeline"]["source"]
    assert set(cur["status"]) == {"easy", "hard"} and len(cur["history"]["easy"]) == 2
