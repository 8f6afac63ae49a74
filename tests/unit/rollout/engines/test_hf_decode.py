"""The HF engine's own decode loop (``decode=loop``) against ``generate`` and a teacher-forced pass."""

import pytest
import torch

from src.config.sampling import SamplingParams
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.hf_decode import draw, sampling_log_probs

LOOP = HFEngineSettings(decode="loop")
GENERATE = HFEngineSettings(decode="generate")


def _prompts(tok):
    return [
        tok("hello there, how are you today", add_special_tokens=False)["input_ids"],
        tok("a", add_special_tokens=False)["input_ids"],
        tok("route me to the cheapest tool", add_special_tokens=False)["input_ids"],
    ]


def _engine(model, tok, settings, eos=None):
    return HFGenerateEngine(
        model, tok.pad_token_id, [tok.eos_token_id] if eos is None else eos, settings=settings
    )


def test_draw_samples_the_given_distribution_and_never_a_zero_probability_token():
    probs = torch.tensor([0.5, 0.0, 0.2, 0.0, 0.3])
    logp = probs.log().expand(200_000, 5).contiguous()
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(draw(logp, g), minlength=5).float() / logp.shape[0]
    assert counts[1] == 0 and counts[3] == 0
    # 200k draws: the standard error of each frequency is < 0.0012
    assert torch.allclose(counts, probs, atol=0.006), counts


@pytest.mark.parametrize("min_new", [0, 10])
def test_greedy_loop_emits_the_tokens_of_generate(tiny, min_new):
    model, tok = tiny
    prompts = _prompts(tok)
    plain = _engine(model, tok, GENERATE, eos=[]).generate(
        prompts, SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=10)
    )
    # a token greedy decoding emits early declared as a second stop id, so rows stop at different steps
    eos = [tok.eos_token_id, plain.token_lists()[0][3]]
    sampling = SamplingParams(
        n_generations_per_prompt=2, temperature=0.0, max_new_tokens=10, min_new_tokens=min_new
    )
    ref = _engine(model, tok, GENERATE, eos=eos).generate(prompts, sampling)
    got = _engine(model, tok, LOOP, eos=eos).generate(prompts, sampling)
    assert got.token_lists() == ref.token_lists()
    assert (got.log_probs == 0).all()
    if min_new:
        assert all(len(t) == 10 for t in got.token_lists())
    else:
        first = plain.token_lists()[0]
        assert got.token_lists()[0] == first[: first.index(eos[1]) + 1]  # the stop id is kept


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_loop_log_probs_equal_a_teacher_forced_pass(tiny, temperature, top_p):
    model, tok = tiny
    prompts = _prompts(tok)
    torch.manual_seed(0)
    out = _engine(model, tok, LOOP).generate(
        prompts,
        SamplingParams(n_generations_per_prompt=3, temperature=temperature, top_p=top_p, max_new_tokens=9),
    )
    assert out.response_ids.shape[0] == 9
    assert (out.log_probs[out.response_mask == 0] == 0).all()
    for i, resp in enumerate(out.token_lists()):  # every copy, the left-padded prompts included
        seq = torch.tensor([prompts[i // 3] + resp])
        with torch.no_grad():
            logits = model(seq).logits[:, len(prompts[i // 3]) - 1 : -1]
        ref = sampling_log_probs(logits, seq[:, len(prompts[i // 3]) :], temperature, top_p)[0]
        assert torch.isfinite(out.log_probs[i, : len(resp)]).all()
        assert torch.allclose(out.log_probs[i, : len(resp)], ref, atol=1e-4), i


def test_loop_stops_each_row_at_its_stop_token_and_min_new_tokens_holds_it_off(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    torch.manual_seed(2)
    free = _engine(model, tok, LOOP, eos=[]).generate(
        prompts, SamplingParams(n_generations_per_prompt=4, max_new_tokens=12)
    )
    common = torch.mode(free.response_ids[:, :6].flatten()).values.item()  # a token rows do sample
    engine = _engine(model, tok, LOOP, eos=[common])
    torch.manual_seed(2)
    out = engine.generate(prompts, SamplingParams(n_generations_per_prompt=4, max_new_tokens=12))
    for resp in out.token_lists():
        assert common not in resp[:-1] and (len(resp) == 12 or resp[-1] == common)
    assert any(len(r) < 12 for r in out.token_lists())
    exact = engine.generate(
        prompts, SamplingParams(n_generations_per_prompt=4, max_new_tokens=12, min_new_tokens=12)
    )
    assert all(len(r) == 12 and common not in r for r in exact.token_lists())


def test_loop_setting_refuses_the_generate_only_keys():
    with pytest.raises(ValueError, match="rollout.engines.hf.compile"):
        HFEngineSettings(decode="loop", cache_implementation="static")
    with pytest.raises(ValueError, match="rollout.engines.hf.decode"):
        HFEngineSettings(decode="fast")


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_the_full_vocabulary_sample_draws_what_draw_draws_from_the_log_probs(temperature):
    """``DecodeStep.sample`` without a nucleus skips the [N, V] log-softmax: same tokens under one
    seed as ``draw(log_probs)``, the drawn token's log-prob that of the sampling distribution, and
    the stop tokens held off before ``min_new_tokens``."""
    from src.rollout.engines.hf_decode import DecodeStep

    sampling = SamplingParams(
        n_generations_per_prompt=1, temperature=temperature, max_new_tokens=4, min_new_tokens=2
    )
    step = DecodeStep(sampling, [0, 3], pad_id=0, synced=False)
    logits = torch.randn(64, 50, generator=torch.Generator().manual_seed(1)) * 3
    logits[:, 3] = 20.0  # a stop token that would win every draw when allowed
    for t in (0, 1, 2):
        torch.manual_seed(t)
        ref_logp = step.log_probs(logits.clone(), t)
        ref_tok = draw(ref_logp)
        torch.manual_seed(t)
        tok, logp = step.sample(logits.clone(), t)
        assert torch.equal(tok, ref_tok)
        torch.testing.assert_close(logp, ref_logp.gather(-1, tok[:, None]).squeeze(-1), atol=1e-5, rtol=1e-5)
        held_off = t < sampling.min_new_tokens
        assert bool(torch.isin(tok, step.stop).any()) != held_off
