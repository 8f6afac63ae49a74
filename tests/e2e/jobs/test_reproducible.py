"""Same command, same result: two uninterrupted runs of one job at the default thread setting
(``trainer.threads``, applied with ``torch.set_num_threads`` at start) end with bit-identical
checkpoints (every tensor: weights, optimizer and scheduler states, λ) and identical rollout rows
(``router_prob`` included). At 2 threads two such runs differed in the last bits (issue 20).

The first run builds everything it caches (tiny model, data, SFT warm start, the router's SIF
fit) in its own process, drawing from the global RNG; the second finds them cached: the two runs
also show that a cached artefact gives the run the bits a freshly built one does."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch
from jobhelpers import REPO

JOB = [
    "experiment=router_grpo",
    "sft.max_steps=2",
    "sampling.n_prompts=4",
    "sampling.max_new_tokens=32",
    "router.lambda_lr=5.0",
    "trainer.max_steps=3",
    "trainer.save_freq=100",
    # a small synthetic split: the first run builds it and fits the router's SIF on it (2,048
    # prompts would only lengthen both)
    "data.synthetic.n_train=256",
    "data.synthetic.n_test=32",
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
    """(the run that builds its cache, the same command finding it cached)."""
    base = tmp_path_factory.mktemp("repro")
    cache = base / "cache"
    for name in ("builds", "cached"):
        cmd = [sys.executable, str(REPO / "scripts" / "train.py"), f"cache_dir={cache}"]
        proc = subprocess.run(
            [*cmd, *JOB, f"run_dir={base / name}"],
            check=False,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    return base / "builds", base / "cached"


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


def test_the_second_run_found_its_warm_start_and_sif_fit_cached(two_runs):
    builds, cached = ((d / "train.log").read_text() for d in two_runs)
    assert "building the SFT warm start" in builds and "building the SFT warm start" not in cached
    assert "SIF pooling fitted" in builds and "read from the cache" not in builds
    assert "read from the cache" in cached
