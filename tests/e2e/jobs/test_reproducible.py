"""Same command, same result: two uninterrupted runs of one job at the default thread setting
(``trainer.threads``, applied with ``torch.set_num_threads`` at start) end with bit-identical
checkpoints (every tensor: weights, optimizer and scheduler states, λ) and identical rollout rows
(``router_prob`` included). At 2 threads two such runs differed in the last bits (issue 20)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pandas as pd
import pytest
import torch
from jobhelpers import REPO, train_cmd

JOB = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=4",
    "sampling.max_new_tokens=32",
    "router.lambda_lr=5.0",
    "trainer.max_steps=3",
    "trainer.save_freq=100",
]


def _tensors(obj, prefix: str = ""):
    if isinstance(obj, torch.Tensor):
        yield prefix, obj
    elif isinstance(obj, dict):
        for k, v in obj.items():
            yield from _tensors(v, f"{prefix}.{k}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _tensors(v, f"{prefix}[{i}]")


def _final(run_dir: Path) -> dict:
    ckpt = torch.load(run_dir / "checkpoints" / "last.ckpt", map_location="cpu", weights_only=False)
    return {k: ckpt[k] for k in ("state_dict", "optimizer_states", "lr_schedulers")}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("repro")
    for name in ("a", "b"):
        proc = subprocess.run(
            train_cmd(*JOB, f"run_dir={base / name}"), cwd=REPO, capture_output=True, text=True, timeout=900
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "a", base / "b"


def test_every_tensor_of_the_final_checkpoint_is_identical(two_runs):
    a, b = (_final(d) for d in two_runs)
    ta, tb = dict(_tensors(a)), dict(_tensors(b))
    assert ta.keys() == tb.keys() and len(ta) > 30
    differing = {
        k: float((ta[k].double() - tb[k].double()).abs().max()) for k in ta if not torch.equal(ta[k], tb[k])
    }
    assert differing == {}, f"{len(differing)} tensors differ: {sorted(differing.items())[:5]}"


def test_rollout_rows_are_identical(two_runs):
    a, b = two_runs
    files = sorted(p.name for p in (a / "rollouts").glob("step_*.parquet"))
    assert files == sorted(p.name for p in (b / "rollouts").glob("step_*.parquet")) and len(files) == 3
    for name in files:
        fa, fb = pd.read_parquet(a / "rollouts" / name), pd.read_parquet(b / "rollouts" / name)
        timing = [c for c in fa.columns if "time" in c or c.endswith("_s")]
        pd.testing.assert_frame_equal(fa.drop(columns=timing), fb.drop(columns=timing), check_exact=True)


def test_a_run_that_builds_its_warm_start_equals_one_that_finds_it_cached(tmp_path):
    """The first run of a command builds the tiny model, the data and the SFT warm start in its own
    process (drawing from the global RNG); a second run finds them cached. Both start the router
    head from the same weights and end bit-identical."""
    import sys

    cache = tmp_path / "cache"
    runs = []
    for name in ("builds", "cached"):
        cmd = [sys.executable, str(REPO / "scripts" / "train.py"), f"cache_dir={cache}"]
        proc = subprocess.run(
            [*cmd, *JOB, f"run_dir={tmp_path / name}"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        runs.append(tmp_path / name)
    assert "building the SFT warm start" in (runs[0] / "train.log").read_text()
    assert "building the SFT warm start" not in (runs[1] / "train.log").read_text()
    ta, tb = (dict(_tensors(_final(d))) for d in runs)
    assert [k for k in ta if not torch.equal(ta[k], tb[k])] == []
    fa, fb = (pd.read_parquet(d / "rollouts" / "step_00000000.parquet") for d in runs)
    assert fa["router_prob"].tolist() == fb["router_prob"].tolist()
