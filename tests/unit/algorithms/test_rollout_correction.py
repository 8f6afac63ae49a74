"""Rollout / trainer mismatch and truncated IS weights against plain per-token loops."""

import math

import pytest
import torch

from src.algorithms.losses import logprob_abs_diff, rollout_is_weights


def _inputs(seed: int, n: int = 5, t: int = 7):
    g = torch.Generator().manual_seed(seed)
    train = -torch.rand(n, t, generator=g) * 3
    rollout = train + torch.randn(n, t, generator=g) * 0.5
    mask = (torch.rand(n, t, generator=g) > 0.3).float()
    mask[0] = 0  # a row without response tokens
    return train, rollout, mask


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_abs_diff_equals_a_loop(seed):
    train, rollout, mask = _inputs(seed)
    total, biggest, count = logprob_abs_diff(train, rollout, mask)
    diffs = [
        abs(float(train[i, j]) - float(rollout[i, j]))
        for i in range(train.shape[0])
        for j in range(train.shape[1])
        if mask[i, j]
    ]
    assert float(count) == len(diffs)
    assert float(total) == pytest.approx(sum(diffs), rel=1e-5)
    assert float(biggest) == pytest.approx(max(diffs), rel=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("cap", [0.5, 1.5, 10.0])
def test_token_and_sequence_weights_equal_a_loop(seed, cap):
    train, rollout, mask = _inputs(seed)
    token = rollout_is_weights("token", train, rollout, mask, cap)
    seq = rollout_is_weights("sequence", train, rollout, mask, cap)
    for i in range(train.shape[0]):
        log_seq = sum(float(train[i, j] - rollout[i, j]) for j in range(train.shape[1]) if mask[i, j])
        for j in range(train.shape[1]):
            want_tok = min(math.exp(float(train[i, j] - rollout[i, j])), cap) if mask[i, j] else 0.0
            want_seq = min(math.exp(log_seq), cap) if mask[i, j] else 0.0
            assert float(token[i, j]) == pytest.approx(want_tok, rel=1e-5)
            assert float(seq[i, j]) == pytest.approx(want_seq, rel=1e-5)
    # truncation bites somewhere at the small caps: the test sees the cap
    if cap < 1:
        assert float(token.max()) == pytest.approx(cap)


def test_weights_are_detached_off_and_checked():
    train, rollout, mask = _inputs(0)
    train.requires_grad_(True)
    assert not rollout_is_weights("token", train, rollout, mask, 2.0).requires_grad
    assert rollout_is_weights(None, train, rollout, mask, 2.0) is None
    with pytest.raises(KeyError, match="rollout importance-sampling level"):
        rollout_is_weights("tokens", train, rollout, mask, 2.0)
    with pytest.raises(ValueError, match="rollout_is_cap"):
        rollout_is_weights("token", train, rollout, mask, 0.0)
