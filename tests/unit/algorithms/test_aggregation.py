"""Aggregation modes against plain loops, empty rows included; micro-batches sum to the whole."""

import pytest
import torch

from src.algorithms import LOSS_AGG, aggregate, normaliser

MODES = ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]


def ref_aggregate(loss, mask, mode, norm_len=None):
    """Plain Python over lists of floats."""
    rows = [[(float(l), float(m)) for l, m in zip(lr, mr)] for lr, mr in zip(loss, mask)]
    width = len(rows[0])
    nonempty = [r for r in rows if sum(m for _, m in r) > 0]
    if mode == "token-mean":
        n_tok = sum(m for r in rows for _, m in r)
        return sum(l * m for r in rows for l, m in r) / max(n_tok, 1)
    if mode == "seq-mean-token-sum":
        per = [sum(l * m for l, m in r) for r in nonempty]
    elif mode == "seq-mean-token-mean":
        per = [sum(l * m for l, m in r) / sum(m for _, m in r) for r in nonempty]
    else:
        per = [sum(l * m for l, m in r) / (norm_len or width) for r in nonempty]
    return sum(per) / max(len(per), 1)


def random_case(seed, b=7, t=9):
    g = torch.Generator().manual_seed(seed)
    loss = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.4).float()
    mask[int(torch.randint(0, b, (1,), generator=g))] = 0  # a row with no response token
    mask[0] = 0
    return loss, mask


def test_all_modes_are_registered():
    assert sorted(MODES) == LOSS_AGG.names()


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(5))
def test_mode_matches_plain_loop_with_empty_rows(mode, seed):
    loss, mask = random_case(seed)
    want = ref_aggregate(loss, mask, mode)
    assert aggregate(loss, mask, mode).item() == pytest.approx(want, rel=1e-5, abs=1e-6)
    if mode == "seq-mean-token-sum-norm":
        want = ref_aggregate(loss, mask, mode, norm_len=32)
        assert aggregate(loss, mask, mode, norm_len=32).item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("mode", MODES)
def test_empty_rows_neither_bias_nor_count(mode):
    loss, mask = random_case(11)
    padded_loss = torch.cat([loss, torch.randn(3, loss.shape[1])])
    padded_mask = torch.cat([mask, torch.zeros(3, mask.shape[1])])
    torch.testing.assert_close(aggregate(padded_loss, padded_mask, mode), aggregate(loss, mask, mode))


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("seed", range(4))
def test_micro_batches_with_the_minibatch_normaliser_sum_to_the_whole(mode, seed):
    loss, mask = random_case(seed, b=10)
    whole = aggregate(loss, mask, mode)
    norm = normaliser(mask, mode)
    g = torch.Generator().manual_seed(seed)
    cuts = sorted(set(torch.randint(1, 10, (3,), generator=g).tolist()))
    parts = torch.tensor_split(torch.arange(10), cuts)
    total = sum(aggregate(loss[p], mask[p], mode, norm) for p in parts)
    torch.testing.assert_close(total, whole)


def test_all_empty_batch_is_zero_not_nan():
    for mode in MODES:
        assert aggregate(torch.randn(2, 3), torch.zeros(2, 3), mode).item() == 0.0
