"""The router head's Polyak average (``router.ema_decay``): the update against a plain reference
loop, the averaged logits against the MLP with those weights loaded, and what it is (buffers)."""

import copy

import pytest
import torch

from src.config.schema import RouterHeadConfig
from src.models.router_policy import RouterPolicy

HIDDEN = 8


def head(ema_decay: float, seed: int = 0) -> RouterPolicy:
    torch.manual_seed(seed)
    return RouterPolicy(
        HIDDEN, RouterHeadConfig(enable=True, pooling="mean", mlp_hidden=6, ema_decay=ema_decay)
    )


def live_weights(policy: RouterPolicy) -> dict[str, torch.Tensor]:
    return {name: w.detach().clone() for name, w in policy.mlp.named_parameters()}


def test_average_follows_the_warmed_up_ema_of_the_live_weights():
    """avg_0 = the initial weights; after the t-th step (t = 0, 1, ...) avg = d_t·avg + (1 − d_t)·w
    with d_t = min(decay, (1 + t) / (10 + t)), on random weights step after step."""
    decay, policy = 0.9, head(0.9)
    want = live_weights(policy)
    g = torch.Generator().manual_seed(1)
    used = []
    for t in range(100):  # the warm-up reaches the decay at t = 81
        with torch.no_grad():
            for w in policy.mlp.parameters():
                w.copy_(torch.randn(w.shape, generator=g))
        used.append(policy.update_average())
        d = min(decay, (1 + t) / (10 + t))
        for name, w in live_weights(policy).items():
            want[name] = d * want[name] + (1 - d) * w
    assert used[0] == pytest.approx(0.1) and used[-1] == pytest.approx(decay)
    assert int(policy.ema_updates) == 100
    for name, w in want.items():
        torch.testing.assert_close(getattr(policy, "ema_" + name.replace(".", "_")), w)


def test_averaged_logits_are_the_mlp_with_the_averaged_weights():
    policy = head(0.5)
    g = torch.Generator().manual_seed(2)
    for _ in range(5):  # average and live weights now differ
        with torch.no_grad():
            for w in policy.mlp.parameters():
                w.add_(torch.randn(w.shape, generator=g))
        policy.update_average()
    averaged_mlp = copy.deepcopy(policy.mlp)
    with torch.no_grad():
        for name, w in averaged_mlp.named_parameters():
            w.copy_(getattr(policy, "ema_" + name.replace(".", "_")))
    hidden, mask = torch.randn(3, 5, HIDDEN, generator=g), torch.ones(3, 5, dtype=torch.long)
    pooled = policy.represent(hidden, mask)
    torch.testing.assert_close(policy(hidden, mask, averaged=True), averaged_mlp(pooled))
    torch.testing.assert_close(policy(hidden, mask), policy.mlp(pooled))  # training reads the live head
    torch.testing.assert_close(
        policy.mlp_with(dict(policy.mlp.named_parameters()), pooled), policy.mlp(pooled)
    )
    assert not torch.allclose(policy(hidden, mask, averaged=True), policy(hidden, mask))


def test_average_is_checkpointed_buffers_never_trained():
    policy = head(0.99)
    names = {n for n, _ in policy.named_parameters()}
    assert not any(n.startswith("ema_") for n in names)  # no optimizer, no gradient, no sharding
    state = policy.state_dict()
    assert {"ema_updates", "ema_1_weight", "ema_4_bias"} <= set(state)
    restored = head(0.99, seed=5)
    restored.load_state_dict(state)
    hidden, mask = torch.randn(2, 4, HIDDEN), torch.ones(2, 4, dtype=torch.long)
    torch.testing.assert_close(restored(hidden, mask, averaged=True), policy(hidden, mask, averaged=True))


def test_without_an_average_the_live_head_is_the_router():
    policy = head(0.0)
    assert not any(n.startswith("ema_") for n in policy.state_dict())
    hidden, mask = torch.randn(2, 4, HIDDEN), torch.ones(2, 4, dtype=torch.long)
    torch.testing.assert_close(policy(hidden, mask, averaged=True), policy(hidden, mask))
    with pytest.raises(ValueError, match="ema_decay=0"):
        policy.update_average()
