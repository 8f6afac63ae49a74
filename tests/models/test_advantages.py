import math

import pytest
import torch

from src.models.advantages import get_advantage, group_ids


def reference_grpo(rewards, uids, eps, norm):
    out = []
    for i, r in enumerate(rewards):
        grp = [rewards[j] for j in range(len(rewards)) if uids[j] == uids[i]]
        mean = sum(grp) / len(grp)
        if len(grp) > 1:
            std = math.sqrt(sum((g - mean) ** 2 for g in grp) / (len(grp) - 1))
        else:
            std = 1.0
        out.append((r - mean) / (std + eps) if norm else r - mean)
    return out


@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", range(5))
def test_grpo_matches_plain_loop(seed, norm):
    g = torch.Generator().manual_seed(seed)
    n = 37
    rewards = torch.randn(n, generator=g)
    uids = [f"u{int(x)}" for x in torch.randint(0, 9, (n,), generator=g)]
    got = get_advantage("grpo")(rewards, group_ids(uids), eps=1e-6, norm_by_std=norm)
    want = reference_grpo(rewards.tolist(), uids, 1e-6, norm)
    assert torch.allclose(got, torch.tensor(want), atol=1e-5)


def test_grpo_equal_rewards_and_singletons_are_finite_zero():
    rewards = torch.tensor([1.0, 1.0, 1.0, 5.0])
    adv = get_advantage("grpo")(rewards, group_ids(["a", "a", "a", "b"]))
    assert torch.isfinite(adv).all()
    assert torch.equal(adv, torch.zeros(4))


def test_unknown_estimator_names_known_ones():
    with pytest.raises(KeyError, match="grpo"):
        get_advantage("nope")
