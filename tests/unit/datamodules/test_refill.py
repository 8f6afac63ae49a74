"""The refill draw: a function of (seed, step, k) only, skipping the step's uids, sharded by rank."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from src.datamodules.position import RefillDraw, refill_records, refill_seed
from src.datamodules.rlla_datamodule import RLLADataset


def _dataset(n: int = 50, repeat: int = 0) -> RLLADataset:
    rows = [{"uid": i, "messages": [], "prompt_ids": [i], "extra_info": {}} for i in range(n)]
    rows += [{"uid": i, "messages": [], "prompt_ids": [-i], "extra_info": {}} for i in range(repeat)]
    return RLLADataset(rows)


def test_same_seed_step_k_same_prompts_and_any_other_differs():
    ds = _dataset()
    uids = [r["uid"] for r in refill_records(ds, 3, (7, 1, 8), set())]
    assert uids == [r["uid"] for r in refill_records(ds, 3, (7, 1, 8), set())] and len(set(uids)) == 8
    for other in ((3, (7, 2, 8)), (3, (8, 1, 8)), (4, (7, 1, 8))):
        assert [r["uid"] for r in refill_records(ds, *other, set())] != uids
    assert (
        len({refill_seed(s, t, k) for s in range(3) for t in range(200) for k in range(1, 4)}) == 3 * 200 * 3
    )


def test_skips_the_steps_uids_and_repeats_and_returns_fewer_when_the_set_runs_out():
    ds = _dataset(10, repeat=10)  # every uid twice
    got = refill_records(ds, 0, (0, 1, 20), {0, 1, 2})
    assert sorted(r["uid"] for r in got) == list(range(3, 10))


def test_ranks_take_disjoint_shares_of_one_order():
    ds = _dataset(60)
    world = [refill_records(ds, 1, (2, 1, 5), set(), (rank, 3)) for rank in range(3)]
    uids = [r["uid"] for part in world for r in part]
    assert len(uids) == len(set(uids)) == 15


def test_refill_draw_reads_the_datamodule_at_call_time():
    dm = SimpleNamespace(train_dataset=None, trainer=None)
    draw = RefillDraw(dm, seed=0)
    with pytest.raises(RuntimeError, match="train_dataset"):
        draw(0, 1, 4, set())
    dm.train_dataset = _dataset()
    assert [r["uid"] for r in draw(0, 1, 4, set())] == [
        r["uid"] for r in refill_records(dm.train_dataset, 0, (0, 1, 4), set())
    ]
