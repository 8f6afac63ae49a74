"""Every outcome estimator against a plain-loop reference on random, uneven, non-contiguous groups."""

import math

import pytest
import torch

from src.algorithms import get_advantage_fn
from src.algorithms.loss_module import group_ids


def _groups(rewards, index):
    return {g: [r for r, h in zip(rewards, index) if h == g] for g in set(index)}


def ref_grpo(rewards, index, norm_by_std=True, eps=1e-6):
    groups, out = _groups(rewards, index), []
    for r, g in zip(rewards, index):
        grp = groups[g]
        if len(grp) == 1:
            out.append(0.0)
            continue
        mean = sum(grp) / len(grp)
        std = math.sqrt(sum((x - mean) ** 2 for x in grp) / (len(grp) - 1))
        out.append((r - mean) / (std + eps) if norm_by_std else r - mean)
    return out


def ref_dr_grpo(rewards, index):
    return ref_grpo(rewards, index, norm_by_std=False)


def ref_rloo(rewards, index):
    groups, out = _groups(rewards, index), []
    for r, g in zip(rewards, index):
        grp = groups[g]
        out.append(0.0 if len(grp) == 1 else r - (sum(grp) - r) / (len(grp) - 1))
    return out


def ref_reinforce_pp(rewards, index, eps=1e-6):
    groups = _groups(rewards, index)
    centred = [r - sum(groups[g]) / len(groups[g]) for r, g in zip(rewards, index)]
    kept = [c for c, g in zip(centred, index) if len(groups[g]) > 1]
    if len(kept) < 2:
        return [0.0] * len(rewards)
    mean = sum(kept) / len(kept)
    std = math.sqrt(sum((c - mean) ** 2 for c in kept) / (len(kept) - 1))
    return [(c - mean) / (std + eps) if len(groups[g]) > 1 else 0.0 for c, g in zip(centred, index)]


REFERENCES = {
    "grpo": ref_grpo,
    "dr_grpo": ref_dr_grpo,
    "rloo": ref_rloo,
    "reinforce_pp": ref_reinforce_pp,
}


def random_case(seed: int):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(5, 40, (1,), generator=g))
    rewards = torch.randn(n, generator=g) * 2
    # arbitrary (negative, large, sparse) ids; uneven sizes; singletons likely; rows interleaved
    pool = [-7, 3, 1000, 42, 5, 999_999, 0]
    index = [pool[int(i)] for i in torch.randint(0, len(pool), (n,), generator=g)]
    return rewards, index


@pytest.mark.parametrize("name", sorted(REFERENCES))
@pytest.mark.parametrize("seed", range(8))
def test_estimator_matches_plain_loop(name, seed):
    rewards, index = random_case(seed)
    got = get_advantage_fn(name)(rewards, index)
    want = torch.tensor(REFERENCES[name](rewards.tolist(), index))
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # the index may also be a tensor of ints
    torch.testing.assert_close(get_advantage_fn(name)(rewards, torch.tensor(index)), got)


@pytest.mark.parametrize("seed", range(3))
def test_grpo_without_std_is_dr_grpo(seed):
    rewards, index = random_case(seed)
    torch.testing.assert_close(
        get_advantage_fn("grpo")(rewards, index, norm_by_std=False),
        get_advantage_fn("dr_grpo")(rewards, index),
    )


@pytest.mark.parametrize("name", sorted(REFERENCES))
def test_group_of_one_gets_zero_and_equal_rewards_are_finite(name):
    rewards = torch.tensor([1.0, 1.0, 1.0, 5.0, 2.0, 0.0])
    adv = get_advantage_fn(name)(rewards, [0, 0, 0, 1, 2, 2])
    assert torch.isfinite(adv).all()
    assert adv[3] == 0  # the singleton
    if name != "reinforce_pp":  # whitening shifts the equal group by the batch mean
        assert torch.equal(adv[:3], torch.zeros(3))
    assert torch.equal(get_advantage_fn(name)(torch.tensor([3.0]), [9]), torch.zeros(1))


def test_group_ids_are_dense_in_first_seen_order():
    assert group_ids(["b", "a", "b", 7]).tolist() == [0, 1, 0, 2]


def test_unknown_estimator_names_known_ones():
    with pytest.raises(KeyError, match="rloo"):
        get_advantage_fn("nope")
