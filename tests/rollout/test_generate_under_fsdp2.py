"""Generation with FSDP2-sharded weights, 2 real processes (gloo): every forward all-gathers the
weights, so a rank whose sequences stop early must keep stepping with the others. Rank 0 stops
after one token (every token is a stop token), rank 1 runs to the limit: both finish, and rank 1's
greedy output is the one of the whole, unsharded model."""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from src.models.loading import load_causal_lm
from src.models.sharding import fully_shard_policy
from src.rollout.engines.hf import HFGenerateEngine
from src.rollout.engines.sharding import sharding_of
from src.rollout.engines.types import SamplingParams

PROMPTS = [[5, 17, 33, 41, 8], [9, 12]]
MAX_NEW = 8


def _greedy(model, stop: list[int], pad: int) -> torch.Tensor:
    engine = HFGenerateEngine(model, pad, [])
    params = SamplingParams(n=1, temperature=0.0, max_new_tokens=MAX_NEW, stop_token_ids=stop)
    return engine.generate(PROMPTS, params).response_ids


def _worker(rank: int, model_dir: str, store: str, out: str) -> None:
    from torch.distributed.device_mesh import init_device_mesh

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        model = load_causal_lm(model_dir, "float32")
        vocab, pad = model.config.vocab_size, 0
        fully_shard_policy(model, None, init_device_mesh("cpu", (2,)))
        assert sharding_of(model) == "fsdp2"
        ids = _greedy(model, list(range(vocab)) if rank == 0 else [], pad)
        torch.save(ids, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_ranks_stopping_at_different_lengths_all_finish_with_the_whole_models_output(
    tiny_model_dir, tmp_path
):
    out = str(tmp_path / "ids")
    ctx = mp.get_context("spawn")
    procs = [
        ctx.Process(target=_worker, args=(r, str(tiny_model_dir), str(tmp_path / "store"), out))
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
