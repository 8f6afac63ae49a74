import math

import pytest
import torch

from src.algorithms.losses import (
    KL_ESTIMATORS,
    SUPERVISED_TERMS,
    router_loss,
    token_log_probs_and_entropy,
)


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


def _family_ce_reference(logits: torch.Tensor, targets: torch.Tensor) -> float:
    """A plain per-row loop: -log(π(label) / (π(SEARCH) + π(CALCULATE))) over tool-labelled rows."""
    total, n = 0.0, 0
    for row, target in zip(logits.tolist(), targets.tolist(), strict=True):
        if target < 1:
            continue
        p = [math.exp(x) for x in row]
        total -= math.log(p[target] / (p[1] + p[2]))
        n += 1
    return total / n if n else 0.0


@pytest.mark.parametrize("seed", range(5))
def test_family_cross_entropy_matches_a_plain_loop(seed):
    g = torch.Generator().manual_seed(seed)
    logits = 3 * torch.randn(12, 3, generator=g)
    targets = torch.randint(-1, 3, (12,), generator=g)
    targets[:2] = torch.tensor([1, 2])  # at least one tool label
    got = SUPERVISED_TERMS.get("family")(torch.log_softmax(logits, -1), targets)
    assert got.item() == pytest.approx(_family_ce_reference(logits, targets), rel=1e-5)
    # the same rows through the router's loss, with no policy gradient and no entropy
    no_pg = torch.zeros(12, dtype=torch.long), torch.zeros(12)
    loss, parts = router_loss(logits, *no_pg, 0.0, 0.7, targets, "family")
    assert loss.item() == pytest.approx(0.7 * got.item(), rel=1e-6)
    assert parts["ce"].item() == pytest.approx(got.item(), rel=1e-6)


def test_family_cross_entropy_leaves_the_answer_logit_and_the_untooled_rows_alone():
    logits = rand(3, 6, 3).requires_grad_(True)
    targets = torch.tensor([0, -1, 1, 2, 0, 1])
    SUPERVISED_TERMS.get("family")(torch.log_softmax(logits, -1), targets).backward()
    # never pushes answer against tool (0 up to the rounding of log π's normaliser)
    torch.testing.assert_close(logits.grad[:, 0], torch.zeros(6), rtol=0, atol=1e-7)
    assert torch.equal(logits.grad[[0, 1, 4]], torch.zeros(3, 3))  # ANSWER / MIXED rows: no signal
    # equal and opposite on the two family logits, toward the label
    torch.testing.assert_close(logits.grad[:, 1], -logits.grad[:, 2])
    assert float(logits.grad[2, 1]) < 0 < float(logits.grad[3, 1])
    # the three-route term, by contrast, pushes a tool-labelled row's answer logit down
    logits.grad = None
    SUPERVISED_TERMS.get("route")(torch.log_softmax(logits, -1), targets).backward()
    assert float(logits.grad[2, 0]) > 0


def test_a_batch_without_tool_labels_gives_a_zero_term():
    log_probs = torch.log_softmax(rand(4, 5, 3), -1)
    for name in ("route", "family"):
        assert SUPERVISED_TERMS.get(name)(log_probs, torch.full((5,), -1)).item() == 0.0
    assert SUPERVISED_TERMS.get("family")(log_probs, torch.tensor([0, 0, -1, 0, 0])).item() == 0.0
    with pytest.raises(KeyError, match="unknown router supervised term 'label'"):
        SUPERVISED_TERMS.get("label")
