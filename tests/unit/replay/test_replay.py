"""Replay buffer: staleness, reuse bounds, recency bias, exact on-policy limit, checkpoint state."""

from __future__ import annotations

import io

import pytest
import torch

from src.replay.buffer import ReplayBuffer
from src.rollout.batch import RolloutBatch, concat_batches, select_rows, split_groups

PAD = 0


def make_batch(n_prompts: int, g: int, seed: int, uid_base: int = 0) -> RolloutBatch:
    """Random left-padded prompts + right-padded responses, some responses empty."""
    gen = torch.Generator().manual_seed(seed)
    rows_prompt = [int(torch.randint(1, 6, (1,), generator=gen)) for _ in range(n_prompts)]
    n = n_prompts * g
    lp, t = max(rows_prompt), 7
    ids = torch.zeros(n, lp + t, dtype=torch.long)
    attn = torch.zeros(n, lp + t, dtype=torch.long)
    resp = torch.zeros(n, t, dtype=torch.long)
    for i in range(n):
        plen = rows_prompt[i // g]
        rlen = int(torch.randint(0, t + 1, (1,), generator=gen))
        ids[i, lp - plen : lp] = torch.randint(1, 50, (plen,), generator=gen)
        attn[i, lp - plen : lp] = 1
        ids[i, lp : lp + rlen] = torch.randint(1, 50, (rlen,), generator=gen)
        attn[i, lp : lp + rlen] = 1
        resp[i, :rlen] = 1
    return RolloutBatch(
        input_ids=ids,
        attention_mask=attn,
        response_mask=resp,
        rewards=torch.randn(n, generator=gen),
        uids=[uid_base + i // g for i in range(n)],
        rollout_log_probs=-torch.rand(n, t, generator=gen) * resp,
        temperatures=torch.full((n,), 0.7),
        rows=[{"i": i} for i in range(n)],
    )


def tokens(rb: RolloutBatch) -> list[tuple[list[int], list[int]]]:
    """Each row's (prompt tokens, response tokens) with padding removed."""
    w = rb.prompt_width
    out = []
    for i in range(len(rb)):
        p = rb.input_ids[i, :w][rb.attention_mask[i, :w].bool()].tolist()
        r = rb.input_ids[i, w:][rb.response_mask[i].bool()].tolist()
        out.append((p, r))
    return out


def test_split_then_concat_keeps_every_token():
    rb = make_batch(4, 3, seed=1)
    groups = split_groups(rb)
    assert [len(gr) for gr in groups] == [3, 3, 3, 3]
    joined = concat_batches(groups, PAD)
    assert tokens(joined) == tokens(rb)
    assert torch.equal(joined.rewards, rb.rewards)
    assert joined.uids == rb.uids
    lp = [joined.rollout_log_probs[i][joined.response_mask[i].bool()] for i in range(len(rb))]
    ref = [rb.rollout_log_probs[i][rb.response_mask[i].bool()] for i in range(len(rb))]
    assert all(torch.equal(a, b) for a, b in zip(lp, ref))


def test_select_rows_trims_unused_padding():
    rb = make_batch(3, 2, seed=2)
    part = select_rows(rb, [0, 1])
    assert part.attention_mask[:, 0].any()  # no all-padding prompt column left
    assert part.response_mask.shape[1] == 0 or part.response_mask[:, -1].any() or part.attention_mask[:, -1].any()


def test_on_policy_limit_returns_the_fresh_batch_exactly():
    buf = ReplayBuffer(capacity=64, alpha=3.0, max_samples_per_rollout=1, max_batch_latency=0, pad_id=PAD)
    for step in range(3):
        fresh = make_batch(4, 2, seed=10 + step, uid_base=100 * step)
        buf.add(fresh, version=step)
        sample = buf.sample(4, version=step)
        assert tokens(sample.batch) == tokens(fresh)
        assert sample.batch.uids == fresh.uids
        assert torch.equal(sample.batch.rewards, fresh.rewards)
        assert len(buf) == 0


def test_reuse_and_staleness_bounds_hold():
    buf = ReplayBuffer(capacity=256, alpha=1.0, max_samples_per_rollout=2, max_batch_latency=2, pad_id=PAD)
    uses: dict = {}
    for step in range(12):
        buf.add(make_batch(4, 2, seed=step, uid_base=100 * step), version=step)
        sample = buf.sample(4, version=step)
        assert max(sample.ages) <= 2
        assert max(sample.uses) <= 2
        for uid in dict.fromkeys(sample.batch.uids):
            uses[uid] = uses.get(uid, 0) + 1
        m = buf.metrics(sample)
        assert m["replay/reuse_mean"] <= 2 and m["replay/age_max"] <= 2
    assert max(uses.values()) <= 2
    assert buf.dropped_stale > 0  # with 4 new groups a step and 4 drawn, some age out unused


def test_capacity_evicts_oldest():
    buf = ReplayBuffer(capacity=5, alpha=0.0, max_samples_per_rollout=4, max_batch_latency=100, pad_id=PAD)
    buf.add(make_batch(4, 2, seed=0, uid_base=0), version=0)
    buf.add(make_batch(4, 2, seed=1, uid_base=100), version=1)
    assert len(buf) == 5 and buf.evicted == 3
    assert {g.version for g in buf.groups} == {0, 1}
    assert sum(g.version == 1 for g in buf.groups) == 4


def test_recency_bias_prefers_fresh_groups():
    counts = {0: 0, 9: 0}
    for trial in range(200):
        buf = ReplayBuffer(capacity=64, alpha=3.0, max_samples_per_rollout=4, max_batch_latency=100,
                           pad_id=PAD, seed=trial)
        buf.add(make_batch(1, 2, seed=0, uid_base=0), version=0)
        buf.add(make_batch(1, 2, seed=1, uid_base=1), version=9)
        sample = buf.sample(1, version=9)
        counts[9 - sample.ages[0]] += 1
    # weights 1 : 10^-3 -> the fresh group nearly always
    assert counts[9] > 190


def test_state_round_trip_continues_identically():
    def run(buf, steps):
        out = []
        for step in steps:
            buf.add(make_batch(3, 2, seed=step, uid_base=100 * step), version=step)
            s = buf.sample(3, version=step)
            out.append((s.batch.uids, s.ages, s.uses))
        return out

    a = ReplayBuffer(64, 1.0, 3, 3, PAD, seed=5)
    full = run(a, range(8))
    b = ReplayBuffer(64, 1.0, 3, 3, PAD, seed=5)
    run(b, range(4))
    blob = io.BytesIO()
    torch.save(b.state_dict(), blob)
    blob.seek(0)
    c = ReplayBuffer(64, 1.0, 3, 3, PAD, seed=999)
    c.load_state_dict(torch.load(blob, weights_only=True))
    assert run(c, range(4, 8)) == full[4:]


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="max_samples_per_rollout"):
        ReplayBuffer(capacity=8, alpha=1.0, max_samples_per_rollout=0, max_batch_latency=1, pad_id=PAD)
