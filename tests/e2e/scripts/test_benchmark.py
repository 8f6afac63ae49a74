import json
import subprocess
import sys

import pytest

from scripts.benchmark import split_run_dir


def test_the_users_run_dir_is_kept_and_the_last_one_wins():
    run_dir, rest = split_run_dir(["experiment=grpo", "run_dir=/a", "trainer.max_steps=2", "run_dir=/b"])
    assert run_dir == "/b" and rest == ["experiment=grpo", "trainer.max_steps=2"]
    temp, rest = split_run_dir(["experiment=grpo"])
    assert "toolrouter-bench-" in temp and rest == ["experiment=grpo"]


@pytest.mark.slow
def test_benchmark_reads_the_scalars_of_the_run_dir_it_was_given(repo_root, tmp_path):
    run_dir = tmp_path / "bench"
    out = subprocess.run(
        [
            sys.executable,
            "scripts/benchmark.py",
            "experiment=grpo",
            "trainer.max_steps=2",
            "sampling.max_new_tokens=8",
            f"run_dir={run_dir}",
        ],
        cwd=repo_root,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["run_dir"] == str(run_dir) and (run_dir / "tensorboard").exists()
    for key in ("s_per_step", "generation_s", "training_s", "tokens_per_s", "generation_tokens_per_s"):
        assert result[key] == result[key] and result[key] > 0, key  # not NaN


def test_the_step_profiler_profiles_only_its_step_and_restores_the_methods(tmp_path):
    """``--profile``: the rollout and the actor update of the named step each get a kernel table, a
    trace and a line in profile.json; other steps run unprofiled, and the class is restored."""
    import torch

    from scripts.benchmark import StepProfiler, split_profile

    out, step, rest = split_profile(["--profile=" + str(tmp_path / "p"), "--profile-step=1", "a=1"])
    assert (out, step, rest) == (tmp_path / "p", 1, ["a=1"])
    with pytest.raises(SystemExit, match="--profile=DIR"):
        split_profile(["--profile", "a=1"])  # a flag without its value

    class Module:
        global_step = 0

        def pipeline_rollout(self, x):
            return torch.ones(8, 8) @ torch.ones(8, 8) + x

        def _actor_updates(self, x):
            return x * 2

    original = Module.pipeline_rollout
    with StepProfiler(out, step).watching(Module):
        m = Module()
        for m.global_step in range(3):
            assert float(m.pipeline_rollout(1)[0, 0]) == 9.0 and m._actor_updates(2) == 4
    assert Module.pipeline_rollout is original
    summary = json.loads((out / "profile.json").read_text())
    assert set(summary) == {"rollout", "actor"} and summary["rollout"]["step"] == 1
    assert "aten::mm" in (out / "rollout_kernels.txt").read_text()
    assert (out / "actor_trace.json.gz").stat().st_size > 0
