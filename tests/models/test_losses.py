import math

import pytest
import torch

from src.models.losses import KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, router_loss, token_log_probs_and_entropy


def rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def test_ppo_clip_matches_plain_loop():
    logp, old, adv = rand(0, 4, 7) * 0.3, rand(1, 4, 7) * 0.3, rand(2, 4, 7)
    loss, clipped = POLICY_LOSSES.get("ppo_clip")(logp, old, adv, 0.2, 0.28)
    for b in range(4):
        for t in range(7):
            r = math.exp(logp[b, t] - old[b, t])
            a = float(adv[b, t])
            want = max(-a * r, -a * min(max(r, 0.8), 1.28))
            assert loss[b, t].item() == pytest.approx(want, rel=1e-5, abs=1e-6)
            assert clipped[b, t].item() == float(-a * min(max(r, 0.8), 1.28) > -a * r)


@pytest.mark.parametrize("seed", range(3))
def test_loss_aggregation_modes_match_plain_loops(seed):
    loss = rand(seed, 5, 6)
    mask = (rand(seed + 10, 5, 6) > 0).float()
    mask[2] = 0  # a sequence with no trained token
    rows = [[(float(loss[b, t]), float(mask[b, t])) for t in range(6)] for b in range(5)]
    tok = sum(l * m for r in rows for l, m in r) / sum(m for r in rows for _, m in r)
    seq_sum = sum(sum(l * m for l, m in r) for r in rows) / 5
    per = [sum(l * m for l, m in r) / sum(m for _, m in r) for r in rows if sum(m for _, m in r) > 0]
    seq_mean = sum(per) / len(per)
    assert LOSS_AGG.get("token-mean")(loss, mask).item() == pytest.approx(tok, rel=1e-5)
    assert LOSS_AGG.get("seq-mean-token-sum")(loss, mask).item() == pytest.approx(seq_sum, rel=1e-5)
    assert LOSS_AGG.get("seq-mean-token-mean")(loss, mask).item() == pytest.approx(seq_mean, rel=1e-5)


def test_kl_estimators_match_formulas():
    logp, ref = rand(3, 3, 4), rand(4, 3, 4)
    for b in range(3):
        for t in range(4):
            d = float(ref[b, t] - logp[b, t])
            assert KL_ESTIMATORS.get("k1")(logp, ref)[b, t].item() == pytest.approx(-d, abs=1e-6)
            assert KL_ESTIMATORS.get("k2")(logp, ref)[b, t].item() == pytest.approx(0.5 * d * d, abs=1e-6)
            assert KL_ESTIMATORS.get("low_var_kl")(logp, ref)[b, t].item() == pytest.approx(
                min(max(math.exp(d) - d - 1, -10), 10), rel=1e-4, abs=1e-6
            )
    assert (KL_ESTIMATORS.get("k3")(logp, logp) == 0).all()


def test_log_probs_and_entropy_match_softmax():
    logits, targets = rand(5, 2, 3, 11), torch.randint(0, 11, (2, 3))
    logp, ent = token_log_probs_and_entropy(logits, targets)
    for b in range(2):
        for t in range(3):
            p = torch.softmax(logits[b, t], -1)
            assert logp[b, t].item() == pytest.approx(math.log(p[targets[b, t]]), abs=1e-5)
            assert ent[b, t].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)


def test_router_loss_matches_reference():
    logits, actions, adv = rand(6, 8, 3), torch.randint(0, 3, (8,)), rand(7, 8)
    targets = torch.tensor([0, -1, 2, 1, -1, 0, 2, -1])
    loss, parts = router_loss(logits, actions, adv, entropy_coef=0.05, sup_coef=0.3, sup_targets=targets)
    pg = ent = ce = 0.0
    n_lab = 0
    for i in range(8):
        lp = torch.log_softmax(logits[i], -1)
        pg -= float(lp[actions[i]] * adv[i]) / 8
        ent -= float((lp.exp() * lp).sum()) / 8
        if targets[i] >= 0:
            ce -= float(lp[targets[i]])
            n_lab += 1
    want = pg - 0.05 * ent + 0.3 * ce / n_lab
    assert loss.item() == pytest.approx(want, rel=1e-5)
    assert parts["entropy"].item() == pytest.approx(ent, rel=1e-5)
