"""Shared fixtures: the repo root, the real data directory (skip when absent), the cached tiny model."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

# Under pytest-xdist the two workers share the two cores: a process one of them starts with a thread
# per core (torch's default) spin-waits on the core the other worker holds. Measured: infer.py
# --route-only on 256 prompts took 12 s alone, 23 s beside one busy core with two threads and 14 s
# with one (96 s inside the test tier). Every process a worker starts, and the worker itself, gets
# one thread (training runs set theirs with trainer.threads anyway).
if os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ.setdefault("OMP_NUM_THREADS", "1")

from jobhelpers import ROUTER_RUN_OVERRIDES  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"
CACHE = REPO / ".cache" / "toolrouter"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_data() -> Path:
    if not (SHARED_DATA / "rlla_4k" / "test.parquet").exists():
        pytest.skip("real data (../shared/data) not present")
    return SHARED_DATA


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return CACHE


@pytest.fixture(scope="session")
def tiny_model_dir(cache_dir) -> Path:
    from src.models.tiny import ensure_tiny_model

    return ensure_tiny_model(cache_dir)


@pytest.fixture(scope="session")
def tiny(tiny_model_dir):
    """(model, tokenizer) of the embedded default, fp32."""
    from src.models.loading import load_causal_lm, load_tokenizer

    return load_causal_lm(tiny_model_dir), load_tokenizer(tiny_model_dir)


def shared_run_root(tmp_path_factory, worker_id: str) -> Path:
    """A folder every pytest-xdist worker of this test run shares (this session's own without xdist)."""
    base = tmp_path_factory.getbasetemp()
    return base if worker_id == "master" else base.parent


@pytest.fixture(scope="session")
def router_run_with_resume(tmp_path_factory, worker_id):
    """A short router_grpo run (tiny SFT warm start): 4 steps, then resumed to 6.

    Returns (run_dir, the checkpoint dict at step 4). Shared by the router job, infer/evaluate and
    notebook tests, trained once per test run: the first worker to need it trains it under a file
    lock, the others wait and read it.
    """
    import shutil

    import torch
    from filelock import FileLock
    from jobhelpers import run_train

    root = shared_run_root(tmp_path_factory, worker_id)
    run_dir, first = root / "shared_router_run", root / "shared_router_run_step4.ckpt"
    with FileLock(str(root / "shared_router_run.lock")):
        if not (root / "shared_router_run.done").exists():
            run_train(*ROUTER_RUN_OVERRIDES, f"run_dir={run_dir}", "trainer.max_steps=4")
            shutil.copy(run_dir / "checkpoints" / "last.ckpt", first)
            run_train(*ROUTER_RUN_OVERRIDES, f"run_dir={run_dir}", "trainer.max_steps=6", "resume=true")
            (root / "shared_router_run.done").touch()
    return run_dir, torch.load(first, map_location="cpu", weights_only=False)


@pytest.fixture(scope="session")
def router_run(router_run_with_resume):
    return router_run_with_resume[0]


@pytest.fixture(scope="module")
def one_torch_thread():
    """Tiny models run ~10x faster on one thread when the 2 shared cores are busy."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def pytest_collection_modifyitems(config, items):
    """`gpu`-marked tests skip cleanly where CUDA is absent."""
    import torch

    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip)


def pytest_unconfigure(config):
    """vLLM shuts its engines down at interpreter exit and logs that through handlers whose stream
    was pytest's capture, closed by then: a "Logging error" traceback per line after the summary.
    Such errors are dropped once the tests are done (the library's own, documented switch)."""
    import logging

    logging.raiseExceptions = False
