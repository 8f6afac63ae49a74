"""ppo_clip (dual clip, log-ratio clamp) and gspo against plain loops; gspo's per-token gradient."""

import math

import pytest
import torch

from src.algorithms import aggregate, get_policy_loss_fn
from src.algorithms.losses import PPOClip


def case(seed, b=5, t=7, spread=0.4):
    g = torch.Generator().manual_seed(seed)
    logp = torch.randn(b, t, generator=g) * spread - 1
    old = torch.randn(b, t, generator=g) * spread - 1
    adv = torch.randn(b, t, generator=g)
    mask = (torch.rand(b, t, generator=g) > 0.3).float()
    mask[1] = 0  # an empty row
    return logp, old, adv, mask


def ref_ppo(lp, old, a, m, low, high, c, clamp):
    if not m:
        return 0.0, 0.0
    r = math.exp(min(max(lp - old, -clamp), clamp))
    unclipped, clipped = -a * r, -a * min(max(r, 1 - low), 1 + high)
    loss, was_clipped = max(unclipped, clipped), clipped > unclipped
    if c is not None and a < 0 and loss > -a * c:
        loss, was_clipped = -a * c, True
    return loss, float(was_clipped)


@pytest.mark.parametrize("clip_ratio_c", [None, 1.5, 3.0])
@pytest.mark.parametrize("seed", range(4))
def test_ppo_clip_matches_plain_loop(seed, clip_ratio_c):
    logp, old, adv, mask = case(seed, spread=0.8)
    out = get_policy_loss_fn("ppo_clip")(
        logp,
        old,
        adv,
        mask,
        PPOClip(clip_low=0.2, clip_high=0.28, clip_ratio_c=clip_ratio_c, log_ratio_clamp=0.9),
    )
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            args = (float(logp[b, t]), float(old[b, t]), float(adv[b, t]), float(mask[b, t]))
            loss, clipped = ref_ppo(*args, 0.2, 0.28, clip_ratio_c, 0.9)
            assert out.loss[b, t].item() == pytest.approx(loss, rel=1e-5, abs=1e-6)
            assert out.clipped[b, t].item() == clipped


def test_dual_clip_bounds_negative_advantage_losses_and_needs_c_above_one():
    logp, old = torch.tensor([[3.0, 3.0]]), torch.zeros(1, 2)  # ratio e^3 ~ 20
    adv, mask = torch.tensor([[-1.0, 1.0]]), torch.ones(1, 2)
    out = get_policy_loss_fn("ppo_clip")(logp, old, adv, mask, PPOClip(clip_ratio_c=3.0))
    assert out.loss[0, 0].item() == pytest.approx(3.0)  # min(20, 3)
    assert out.loss[0, 1].item() == pytest.approx(-1.2)  # positive A: the ordinary clip
    with pytest.raises(ValueError, match="clip_ratio_c"):
        PPOClip(clip_ratio_c=1.0)


def test_log_ratio_clamp_keeps_the_ratio_finite():
    logp, old = torch.tensor([[200.0]]), torch.tensor([[-200.0]])
    out = get_policy_loss_fn("ppo_clip")(logp, old, torch.ones(1, 1), torch.ones(1, 1))
    assert torch.isfinite(out.loss).all() and out.ratio.item() == pytest.approx(math.exp(20.0), rel=1e-5)


def ref_gspo(logp, old, adv, mask, low, high):
    out = []
    for b in range(logp.shape[0]):
        toks = [t for t in range(logp.shape[1]) if mask[b, t] > 0]
        s = math.exp(sum(float(logp[b, t] - old[b, t]) for t in toks) / len(toks)) if toks else 1.0
        row = []
        for t in range(logp.shape[1]):
            a = float(adv[b, t])
            row.append(max(-a * s, -a * min(max(s, 1 - low), 1 + high)) if mask[b, t] > 0 else 0.0)
        out.append(row)
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(4))
def test_gspo_matches_plain_loop(seed):
    logp, old, adv, mask = case(seed, spread=0.05)
    out = get_policy_loss_fn("gspo")(logp, old, adv, mask, clip_low=0.01, clip_high=0.02)
    torch.testing.assert_close(out.loss, ref_gspo(logp, old, adv, mask, 0.01, 0.02), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("seed", range(3))
def test_gspo_token_gradient_equals_the_sequence_level_objective(seed):
    """With one advantage per row, GSPO-token + seq-mean-token-mean has the gradient of
    mean_i max(-A_i s_i, -A_i clip(s_i)) with s_i = exp(mean_t (logp - old)) differentiated whole."""
    logp, old, _, mask = case(seed, spread=0.05)
    adv_row = torch.randn(logp.shape[0], generator=torch.Generator().manual_seed(seed + 50))
    adv = adv_row[:, None].expand_as(logp)
    a = logp.clone().requires_grad_(True)
    out = get_policy_loss_fn("gspo")(a, old, adv, mask, clip_low=0.01, clip_high=0.02)
    aggregate(out.loss, mask, "seq-mean-token-mean").backward()
    b = logp.clone().requires_grad_(True)
    n_tok = mask.sum(-1)
    s = torch.exp(((b - old) * mask).sum(-1) / n_tok.clamp(min=1))
    per_row = torch.maximum(-adv_row * s, -adv_row * s.clamp(0.99, 1.02))
    keep = n_tok > 0
    (per_row[keep].sum() / keep.sum()).backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo"])
def test_ratio_is_one_and_gradient_is_minus_advantage_at_the_old_policy(name):
    logp, _, adv, mask = case(3)
    x = logp.clone().requires_grad_(True)
    out = get_policy_loss_fn(name)(x, x.detach(), adv, mask)
    assert torch.equal(out.ratio, mask)
    out.loss.sum().backward()
    torch.testing.assert_close(x.grad, -adv * mask)
