"""The module's loss path with the rollout / trainer mismatch: its metrics and the truncated IS
correction (algorithm.rollout_is), on the real tiny model."""

import math

import pytest
import torch
from test_module_loss import make_module, random_rollout

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _one_chunk_loss(module, rb):
    chunks = module._minibatches(len(rb))
    inputs = module._loss_inputs(rb, len(chunks))
    mask = inputs.mask
    return module._micro_loss(rb, chunks[0], inputs, module.loss_module.normaliser(mask), mask.sum())


def _trainer_log_probs(module, rb):
    width = rb.response_mask.shape[1]
    with torch.no_grad():
        logp, _ = module._token_stats(module.actor, rb.input_ids, rb.attention_mask, width, None)
    return logp


def test_mismatch_metrics_equal_a_loop(tiny):
    module = make_module(tiny)
    rb = random_rollout(tiny)
    _, parts = _one_chunk_loss(module, rb)
    logp = _trainer_log_probs(module, rb)
    diffs = [
        abs(float(logp[i, j] - rb.rollout_log_probs[i, j]))
        for i in range(len(rb))
        for j in range(rb.response_mask.shape[1])
        if rb.response_mask[i, j]
    ]
    assert float(parts["rollout/logprob_abs_diff_mean"]) == pytest.approx(sum(diffs) / len(diffs), rel=1e-4)
    assert float(parts["rollout/logprob_abs_diff_max"]) == pytest.approx(max(diffs), rel=1e-4)
    assert "rollout/is_weight_mean" not in parts  # correction off by default


def test_token_is_scales_the_policy_loss_by_the_capped_ratio(tiny):
    rb = random_rollout(tiny)
    off = make_module(tiny)
    rb.rollout_log_probs = _trainer_log_probs(off, rb)  # engine == trainer
    base, parts = _one_chunk_loss(off, rb)
    assert float(parts["rollout/logprob_abs_diff_max"]) < 1e-5
    token = make_module(tiny, rollout_is="token", rollout_is_cap=2.0)
    same, parts = _one_chunk_loss(token, rb)
    assert float(same) == pytest.approx(float(base), rel=1e-5)
    assert float(parts["rollout/is_weight_mean"]) == pytest.approx(1.0, abs=1e-5)
    # pi_rollout = 2 pi_train on every token: weight 1/2 (under the cap), a token-mean loss halves
    rb.rollout_log_probs = rb.rollout_log_probs + math.log(2.0)
    half, _ = _one_chunk_loss(token, rb)
    assert float(half) == pytest.approx(float(base) / 2, rel=1e-4)
    # pi_rollout = pi_train / 4: ratio 4 truncated at the cap
    rb.rollout_log_probs = rb.rollout_log_probs - math.log(8.0)
    capped, parts = _one_chunk_loss(token, rb)
    assert float(capped) == pytest.approx(float(base) * 2, rel=1e-4)
    assert float(parts["rollout/is_weight_mean"]) == pytest.approx(2.0, rel=1e-5)


def test_sequence_is_weights_a_row_by_the_product_of_its_ratios(tiny):
    rb = random_rollout(tiny)
    base, _ = _one_chunk_loss(make_module(tiny), rb)
    rb.rollout_log_probs = _trainer_log_probs(make_module(tiny), rb) - 0.1  # every ratio e^0.1 > 1
    seq = make_module(tiny, rollout_is="sequence", rollout_is_cap=1.0)  # the cap of 1 takes every row
    capped, parts = _one_chunk_loss(seq, rb)
    assert float(capped) == pytest.approx(float(base), rel=1e-5)
    big = make_module(tiny, rollout_is="sequence", rollout_is_cap=100.0)
    _, parts = _one_chunk_loss(big, rb)
    lengths = rb.response_mask.sum(-1)
    want = sum(math.exp(0.1 * n) * n for n in lengths.tolist()) / float(lengths.sum())
    assert float(parts["rollout/is_weight_mean"]) == pytest.approx(want, rel=1e-4)
