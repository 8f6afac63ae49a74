import math

import pytest
import torch

from src.algorithms.losses import KL_ESTIMATORS, router_loss, token_log_probs_and_entropy


def rand(seed, *shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


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


@pytest.mark.parametrize("temperature", [0.7, 1.3])
def test_log_probs_and_entropy_at_a_temperature_are_softmax_of_scaled_logits(temperature):
    logits, targets = rand(8, 2, 3, 11), torch.randint(0, 11, (2, 3))
    per_row = torch.tensor([temperature, 1.0])
    logp, ent = token_log_probs_and_entropy(logits, targets, per_row)
    for b in range(2):
        for t in range(3):
            p = torch.softmax(logits[b, t] / float(per_row[b]), -1)
            assert logp[b, t].item() == pytest.approx(math.log(p[targets[b, t]]), abs=1e-5)
            assert ent[b, t].item() == pytest.approx(float(-(p * p.log()).sum()), abs=1e-5)
    with pytest.raises(ValueError, match="> 0"):
        token_log_probs_and_entropy(logits, targets, torch.tensor([0.0, 1.0]))


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
