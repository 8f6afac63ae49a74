"""Dynamic sampling's group filter against a plain loop over groups."""

from __future__ import annotations

import random

import pytest
import torch

from src.algorithms.dynamic_sampling import groups_kept_frac, informative_groups, select_rows


def _batch(seed: int, n_groups: int = 12, g: int = 4):
    rng = random.Random(seed)
    uids, rewards = [], []
    for k in rng.sample(range(100, 200), n_groups):
        dead = rng.random() < 0.4
        value = rng.choice([0.0, 1.0, -3.0])
        for _ in range(g):
            uids.append(k)
            rewards.append(value if dead else rng.choice([0.0, 1.0, -3.0, 0.5]))
    perm = list(range(len(uids)))
    rng.shuffle(perm)  # rows of a group need not be adjacent
    return torch.tensor([rewards[i] for i in perm]), torch.tensor([uids[i] for i in perm])


def _reference(rewards, uids, n_groups):
    order, seen = [], set()
    for u in uids.tolist():
        if u not in seen:
            seen.add(u)
            order.append(u)
    spread = {u: max(r for r, v in zip(rewards.tolist(), uids.tolist()) if v == u)
              - min(r for r, v in zip(rewards.tolist(), uids.tolist()) if v == u) for u in order}  # fmt: skip
    live = [u for u in order if spread[u] > 1e-6]
    dead = [u for u in order if spread[u] <= 1e-6]
    chosen = set(live[:n_groups] + dead[: max(0, n_groups - len(live[:n_groups]))])
    return [i for i, u in enumerate(uids.tolist()) if u in chosen], min(len(live), n_groups), live, order


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("n_groups", [1, 4, 8, 12])
def test_select_rows_matches_plain_loop(seed, n_groups):
    rewards, uids = _batch(seed)
    rows, n_live = select_rows(rewards, uids, n_groups)
    want_rows, want_live, live, order = _reference(rewards, uids, n_groups)
    assert rows.tolist() == want_rows and n_live == want_live
    groups, keep = informative_groups(rewards, uids)
    assert groups.tolist() == order and [u for u, k in zip(order, keep.tolist()) if k] == live
    assert groups_kept_frac(rewards, uids) == pytest.approx(len(live) / len(order))


def test_all_dead_batch_is_padded_and_bad_input_named():
    rewards, uids = torch.zeros(8), torch.tensor([1, 1, 2, 2, 3, 3, 4, 4])
    rows, n_live = select_rows(rewards, uids, 2)
    assert n_live == 0 and rows.tolist() == [0, 1, 2, 3]
    assert groups_kept_frac(rewards, uids) == 0.0
    with pytest.raises(ValueError, match="must be \\[N\\]"):
        informative_groups(torch.zeros(3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="empty"):
        groups_kept_frac(torch.zeros(0), torch.zeros(0, dtype=torch.long))


@pytest.mark.parametrize("seed", range(4))
def test_live_groups_and_select_live_rows_match_plain_loop_over_two_rewards(seed):
    from src.algorithms.dynamic_sampling import live_groups, select_live_rows

    actor, uids = _batch(seed)
    router, _ = _batch(seed + 100)  # another reward over the same rows (its own dead groups)
    router = router[torch.randperm(len(router), generator=torch.Generator().manual_seed(seed))]
    order = list(dict.fromkeys(uids.tolist()))

    def spread(rewards, u):
        values = [r for r, v in zip(rewards.tolist(), uids.tolist()) if v == u]
        return max(values) - min(values)

    want = [spread(actor, u) > 1e-6 or spread(router, u) > 1e-6 for u in order]
    groups, live = live_groups([actor, router], uids)
    assert groups.tolist() == order and live.tolist() == want
    for n_groups in (1, 5, 12):
        rows, n_live = select_live_rows([actor, router], uids, n_groups)
        alive = [u for u, w in zip(order, want) if w][:n_groups]
        dead = [u for u, w in zip(order, want) if not w][: n_groups - len(alive)]
        assert rows.tolist() == [i for i, u in enumerate(uids.tolist()) if u in set(alive + dead)]
        assert n_live == len(alive)
    with pytest.raises(ValueError, match="at least one"):
        live_groups([], uids)
