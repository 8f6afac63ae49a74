"""experiment=router_grpo with ``algorithm.dynamic_sampling`` on, as real subprocesses: the
``train/dynamic_*`` scalars and the marked rollout rows, and exact resume after a SIGKILL."""

from __future__ import annotations

import signal
from pathlib import Path

import pandas as pd
import pytest
from faults import fault_overrides
from jobhelpers import scalars
from test_resume_exact import SMALL, _assert_same_logs, _assert_same_training_state, _run

DYNAMIC = [*SMALL, "algorithm.dynamic_sampling.enable=true", "algorithm.dynamic_sampling.max_extra_batches=2"]


@pytest.fixture(scope="module")
def dynamic_run(tmp_path_factory) -> Path:
    run_dir = tmp_path_factory.mktemp("dynamic") / "uninterrupted"
    _run(run_dir, "trainer.save_freq=2", base=DYNAMIC)
    return run_dir


def test_dynamic_sampling_scalars_and_rollout_rows(dynamic_run):
    series = scalars(dynamic_run)
    for tag in ("train/groups_kept_frac", "train/dynamic_groups_kept_frac", "train/dynamic_extra_batches",
                "train/dynamic_groups_final"):  # fmt: skip
        assert [s for s, _ in series[tag]] == [0, 1, 2, 3], tag
    extra = [v for _, v in series["train/dynamic_extra_batches"]]
    assert all(0 <= v <= 2 for v in extra) and sum(extra) > 0  # dead groups were refilled
    n_prompts, g = 2, 4
    for step in range(4):
        rows = pd.read_parquet(dynamic_run / "rollouts" / f"step_{step:08d}.parquet")
        # every generated row is logged: the draw and each refill, n_prompts x G rows apiece
        assert sorted(rows["refill"].unique()) == list(range(int(extra[step]) + 1))
        assert len(rows) == (extra[step] + 1) * n_prompts * g
        assert rows["trained"].sum() == n_prompts * g  # the batch keeps n_prompts groups
        assert rows.groupby("uid")["trained"].nunique().max() == 1  # whole groups


@pytest.mark.slow  # two more training processes
def test_sigkill_with_dynamic_sampling_resumes_exactly(dynamic_run, tmp_path):
    run_dir = tmp_path / "run"
    _run(
        run_dir,
        "trainer.save_freq=2",
        *fault_overrides(3, "SIGKILL", "batch_end"),
        base=DYNAMIC,
        expect=-signal.SIGKILL,
    )
    _run(run_dir, "trainer.save_freq=2", "resume=true", base=DYNAMIC)
    _assert_same_training_state(dynamic_run, run_dir)
    _assert_same_logs(dynamic_run, run_dir)  # the refill rows of the rerun steps 2 and 3 included
    extra = [v for _, v in scalars(run_dir)["train/dynamic_extra_batches"]]
    assert sum(extra[2:]) > 0  # the rerun steps refilled: the comparison covers the refill draws
