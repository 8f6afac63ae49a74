"""The chunked log-prob / entropy: values and gradients against plain autograd on random inputs."""

import pytest
import torch

from src.algorithms import losses as token_stats
from src.algorithms.losses import token_log_probs_and_entropy


def plain(logits, targets, temperature):
    """The reference: float64 autograd through softmax(logits / T)."""
    x = logits.double()
    if temperature is not None:
        temp = torch.as_tensor(temperature, dtype=torch.float64)
        x = x / (temp[:, None, None] if temp.dim() == 1 else temp)
    logp_all = torch.log_softmax(x, -1)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    return logp, -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk", [1, 7, 40, 1 << 20])  # one row, part of a sequence, several, all
@pytest.mark.parametrize("temperature", [None, 0.6, "rows"])
def test_values_and_gradients_match_plain_autograd(monkeypatch, chunk, temperature):
    monkeypatch.setattr(token_stats, "CPU_CHUNK_ELEMENTS", chunk)
    g = torch.Generator().manual_seed(chunk)
    b, t, v = 3, 5, 13
    # a slice of a longer sequence, as the models' logits are: not contiguous
    logits = (torch.randn(b, t + 1, v, generator=g) * 3)[:, :-1]
    targets = torch.randint(0, v, (b, t), generator=g)
    temp = torch.rand(b, generator=g) + 0.3 if temperature == "rows" else temperature
    up_lp, up_h = torch.randn(b, t, generator=g), torch.randn(b, t, generator=g)

    ours = logits.clone().requires_grad_()
    logp, ent = token_log_probs_and_entropy(ours, targets, temp)
    ((logp * up_lp).sum() + (ent * up_h).sum()).backward()

    ref = logits.double().requires_grad_()
    ref_lp, ref_h = plain(ref, targets, temp)
    ((ref_lp * up_lp.double()).sum() + (ref_h * up_h.double()).sum()).backward()

    assert logp.dtype == ent.dtype == torch.float32
    torch.testing.assert_close(logp.double(), ref_lp.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ent.double(), ref_h.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(ours.grad.double(), ref.grad, atol=1e-5, rtol=1e-5)


def test_one_output_used_and_no_grad():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 4, 9, generator=g, requires_grad=True)
    targets = torch.randint(0, 9, (2, 4), generator=g)
    logp, _ = token_log_probs_and_entropy(logits, targets, 1.5)
    logp.sum().backward()  # the entropy's gradient is taken as zero
    ref = logits.detach().double().requires_grad_()
    plain(ref, targets, 1.5)[0].sum().backward()
    torch.testing.assert_close(logits.grad.double(), ref.grad, atol=1e-6, rtol=1e-5)
    with torch.no_grad():
        lp, h = token_log_probs_and_entropy(logits, targets)
    assert not lp.requires_grad and not h.requires_grad


def test_bfloat16_logits_get_a_bfloat16_gradient():
    logits = torch.randn(2, 3, 8, dtype=torch.bfloat16, requires_grad=True)
    logp, ent = token_log_probs_and_entropy(logits, torch.zeros(2, 3, dtype=torch.long))
    (logp.sum() + ent.sum()).backward()
    assert logp.dtype == torch.float32 and logits.grad.dtype == torch.bfloat16


def test_non_positive_temperature_is_refused():
    with pytest.raises(ValueError, match="> 0"):
        token_log_probs_and_entropy(torch.zeros(2, 1, 3), torch.zeros(2, 1, dtype=torch.long), torch.tensor([1.0, 0.0]))
