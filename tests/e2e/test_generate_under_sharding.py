"""Generation with sharded weights (FSDP2, DeepSpeed ZeRO-3), 2 real processes (gloo): every
forward all-gathers the weights, so a rank whose sequences stop early must keep stepping with the
others. Rank 0 stops after one token (every token is a stop token), rank 1 runs to the limit: both
finish, and rank 1's greedy output is the one of the whole, unsharded model. (transformers keeps
FSDP2 ranks in step by itself; ZeRO-3 under Lightning it does not see, and hangs without
``src.rollout.engines.hf.generate_kwargs_under_sharding``.)"""

from __future__ import annotations

import argparse
import importlib.util
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from src.config.sampling import SamplingParams
from src.models.loading import load_causal_lm
from src.models.sharding import fully_shard_policy
from src.rollout.engines.hf import HFGenerateEngine, sharding_of

PROMPTS = [[5, 17, 33, 41, 8], [9, 12]]
MAX_NEW = 8


def _greedy(model, stop: list[int], pad: int) -> torch.Tensor:
    engine = HFGenerateEngine(model, pad, [])
    params = SamplingParams(
        n_generations_per_prompt=1, temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=stop
    )
    return engine.generate(PROMPTS, params).response_ids


def _sharded(model, kind: str, rank: int):
    if kind == "fsdp2":
        from torch.distributed.device_mesh import init_device_mesh

        fully_shard_policy(model, None, init_device_mesh("cpu", (2,)))
        return model
    import deepspeed

    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE="2")  # what a launcher sets
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "zero_optimization": {"stage": 3},
        "zero_allow_untested_optimizer": True,
    }
    engine, *_ = deepspeed.initialize(
        args=argparse.Namespace(device_rank=rank),
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=0.0),
        config=config,
        dist_init_required=False,
    )
    return engine.module


def _worker(rank: int, kind: str, model_dir: str, store: str, out: str) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = _sharded(load_causal_lm(model_dir, "float32"), kind, rank)
        assert sharding_of(model) == kind
        stop = list(range(model.config.vocab_size)) if rank == 0 else []
        torch.save(_greedy(model, stop, 0), f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


# transformers keeps FSDP2 ranks in step by itself: that case is a slow regression check
@pytest.mark.parametrize("kind", [pytest.param("fsdp2", marks=pytest.mark.slow), "zero3"])
def test_ranks_stopping_at_different_lengths_all_finish_with_the_whole_models_output(
    kind, tiny_model_dir, tmp_path
):
    if kind == "zero3" and importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed not installed (make setup installs it)")
    out = str(tmp_path / "ids")
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(r, kind, str(tiny_model_dir), str(tmp_path / "store"), out))
        for r in (0, 1)
    ]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
    alive = [p for p in procs if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a rank hung: generation did not keep the ranks stepping together"
    assert [p.exitcode for p in procs] == [0, 0]
    first, second = torch.load(f"{out}.0"), torch.load(f"{out}.1")
    assert first.shape[1] == 1  # rank 0 stopped after one token
    whole = _greedy(load_causal_lm(tiny_model_dir, "float32"), [], 0)
    assert second.shape[1] == MAX_NEW and torch.equal(second, whole)
