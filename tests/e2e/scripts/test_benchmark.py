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
