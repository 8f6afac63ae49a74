import torch

from src.rollout.engine import (
    HFGenerateEngine,
    RolloutEngine,
    SamplingParams,
    mask_after_stop,
    sampling_log_probs,
)


def test_mask_after_stop_includes_first_stop_only():
    toks = torch.tensor([[5, 6, 2, 7, 2], [5, 5, 5, 5, 5]])
    assert mask_after_stop(toks, [2]).tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]]


def test_top_p_log_probs_renormalise_over_the_nucleus():
    logits = torch.log(torch.tensor([[[0.5, 0.3, 0.15, 0.05]]]))
    lp = sampling_log_probs(logits.expand(1, 3, 4).contiguous(), torch.tensor([[0, 1, 2]]), 1.0, 0.7)
    # nucleus for 0.7 = {0, 1} (0.5 < 0.7, then 0.8 crosses it); token 2 is outside
    assert torch.allclose(lp[0, :2].exp(), torch.tensor([0.5 / 0.8, 0.3 / 0.8]), atol=1e-6)
    assert lp[0, 2] == float("-inf")


def test_hf_engine_generates_left_padded_batches_with_logprobs(tiny):
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    assert isinstance(engine, RolloutEngine)
    prompts = [
        tok("hello there", add_special_tokens=False)["input_ids"],
        tok("a", add_special_tokens=False)["input_ids"],
    ]
    torch.manual_seed(0)
    out = engine.generate(prompts, SamplingParams(n=3, temperature=1.0, max_new_tokens=8))
    assert out.response_ids.shape[0] == 6 and out.response_ids.shape[1] <= 8
    assert ((out.log_probs <= 0) | (out.response_mask == 0)).all()
    assert (out.log_probs[out.response_mask == 0] == 0).all()
    # the sampling log-probs equal a teacher-forced pass over each sequence alone (no padding effects)
    i = 4  # a copy of the shorter, left-padded prompt
    seq = torch.tensor([prompts[1] + out.token_lists()[i]])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompts[1]) - 1 : -1]
    ref = torch.log_softmax(logits, -1).gather(-1, seq[0, len(prompts[1]) :, None]).squeeze(-1)
    n = len(out.token_lists()[i])
    assert torch.allclose(out.log_probs[i, :n], ref, atol=1e-4)


def test_greedy_is_deterministic(tiny):
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    p = [tok("route me", add_special_tokens=False)["input_ids"]]
    a = engine.generate(p, SamplingParams(n=1, temperature=0.0, max_new_tokens=6))
    b = engine.generate(p, SamplingParams(n=1, temperature=0.0, max_new_tokens=6))
    assert torch.equal(a.response_ids, b.response_ids)
