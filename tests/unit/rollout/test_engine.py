import pytest
import torch

from src.config.sampling import SamplingParams
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.hf_decode import sampling_log_probs, warped_log_probs
from src.rollout.engines.types import (
    RolloutEngine,
    draw_key,
    eos_token_ids,
    keyed_uniforms,
    left_pad,
    mask_after_stop,
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


def test_warped_log_probs_match_a_plain_loop():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 13, generator=g) * 3
    for temperature, top_p in [(1.0, 1.0), (0.7, 0.9), (1.3, 0.5)]:
        got = warped_log_probs(logits, temperature, top_p)
        for row in range(logits.shape[0]):
            probs = torch.softmax(logits[row] / temperature, -1).tolist()
            order = sorted(range(len(probs)), key=lambda i: -probs[i])
            kept, mass = [], 0.0
            for i in order:
                if mass >= top_p:
                    break
                kept.append(i)
                mass += probs[i]
            total = sum(probs[i] for i in kept)
            for i in range(len(probs)):
                if i in kept:
                    assert abs(got[row, i].exp().item() - probs[i] / total) < 1e-5
                else:
                    assert got[row, i] == float("-inf")


def test_eos_ids_join_the_generation_config_list_and_the_tokenizer():
    class Cfg:
        eos_token_id = [7, 3]

    class Tok:
        eos_token_id = 5

    assert eos_token_ids(Cfg(), Tok()) == [3, 5, 7]
    Cfg.eos_token_id = 5
    assert eos_token_ids(Cfg(), Tok()) == [5]
    assert eos_token_ids(None, Tok()) == [5]


def test_left_pad_buckets_the_width():
    ids, mask = left_pad([[1, 2, 3], [4]], 0, multiple_of=4)
    assert ids.tolist() == [[0, 1, 2, 3], [0, 0, 0, 4]]
    assert mask.tolist() == [[0, 1, 1, 1], [0, 0, 0, 1]]


def test_settings_reject_bad_values_naming_the_key():
    with pytest.raises(ValueError, match="rollout.engines.hf.cache_implementation"):
        HFEngineSettings(cache_implementation="paged")
    with pytest.raises(ValueError, match="rollout.engines.hf.compile"):
        HFEngineSettings(decode="generate", compile=True)
    with pytest.raises(ValueError, match="rollout.engines.hf.logprobs_from"):
        HFEngineSettings(logprobs_from="nowhere")


def _prompts(tok):
    return [
        tok("hello there, how are you", add_special_tokens=False)["input_ids"],
        tok("a", add_special_tokens=False)["input_ids"],
    ]


def _teacher_forced(model, prompt, response):
    seq = torch.tensor([prompt + response])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, seq[0, len(prompt) :, None]).squeeze(-1)


@pytest.mark.parametrize(
    "settings",
    [
        HFEngineSettings(),  # recorded scores, shared prefill
        HFEngineSettings(decode="generate", share_prefill=False, pad_to_multiple_of=8),
        HFEngineSettings(decode="generate", share_prefill=False, logprobs_from="forward"),
        HFEngineSettings(decode="generate", cache_implementation="static", pad_to_multiple_of=8),
    ],
    ids=["scores-shared", "scores-bucketed", "forward", "static"],
)
def test_hf_engine_log_probs_equal_a_teacher_forced_pass(tiny, settings):
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id], settings=settings)
    assert isinstance(engine, RolloutEngine)
    prompts = _prompts(tok)
    torch.manual_seed(0)
    out = engine.generate(
        prompts, SamplingParams(n_generations_per_prompt=3, temperature=1.0, max_new_tokens=8)
    )
    assert out.response_ids.shape[0] == 6 and out.response_ids.shape[1] <= 8
    assert (out.log_probs[out.response_mask == 0] == 0).all()
    for i in range(6):  # every copy, both the long and the left-padded short prompt
        resp = out.token_lists()[i]
        ref = _teacher_forced(model, prompts[i // 3], resp)
        assert torch.allclose(out.log_probs[i, : len(resp)], ref, atol=1e-4), i


def test_recorded_log_probs_follow_temperature_and_top_p(tiny):
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    prompts = _prompts(tok)
    torch.manual_seed(1)
    out = engine.generate(
        prompts, SamplingParams(n_generations_per_prompt=2, temperature=0.7, top_p=0.9, max_new_tokens=6)
    )
    for i in range(4):
        resp = out.token_lists()[i]
        seq = torch.tensor([prompts[i // 2] + resp])
        with torch.no_grad():
            logits = model(seq).logits[:, len(prompts[i // 2]) - 1 : -1]
        ref = sampling_log_probs(logits, seq[:, len(prompts[i // 2]) :], 0.7, 0.9)[0]
        assert torch.isfinite(out.log_probs[i, : len(resp)]).all()
        assert torch.allclose(out.log_probs[i, : len(resp)], ref, atol=1e-4)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shared_prefill_and_static_cache_sample_the_plain_tokens(tiny, temperature):
    model, tok = tiny
    prompts = _prompts(tok)
    sampling = SamplingParams(n_generations_per_prompt=3, temperature=temperature, max_new_tokens=10)
    outs = []
    for s in (
        HFEngineSettings(decode="generate", share_prefill=False),
        HFEngineSettings(decode="generate", share_prefill=True),
        HFEngineSettings(decode="generate", cache_implementation="static", pad_to_multiple_of=16),
    ):
        torch.manual_seed(3)  # same draws: the three paths compute the same distributions
        outs.append(
            HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id], settings=s).generate(
                prompts, sampling
            )
        )
    for other in outs[1:]:
        assert other.token_lists() == outs[0].token_lists()
        assert torch.allclose(other.log_probs, outs[0].log_probs, atol=1e-4)
    if temperature == 0.0:
        assert outs[0].token_lists()[0] == outs[0].token_lists()[2]


def test_generation_stops_on_every_eos_id_and_min_new_tokens_holds_it_off(tiny):
    model, tok = tiny
    prompt = [tok("route me", add_special_tokens=False)["input_ids"]]
    free = HFGenerateEngine(model, tok.pad_token_id, [], settings=HFEngineSettings())
    plain = free.generate(
        prompt, SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=8)
    ).token_lists()[0]
    second_eos = plain[2]  # a token greedy decoding emits: declared as a second EOS id
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id, second_eos])
    stopped = engine.generate(
        prompt, SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=8)
    ).token_lists()[0]
    assert stopped == plain[: plain.index(second_eos) + 1]
    exact = engine.generate(
        prompt,
        SamplingParams(n_generations_per_prompt=1, temperature=1.0, max_new_tokens=8, min_new_tokens=8),
    ).token_lists()[0]
    assert len(exact) == 8


def test_greedy_is_deterministic(tiny):
    model, tok = tiny
    engine = HFGenerateEngine(model, tok.pad_token_id, [tok.eos_token_id])
    p = [tok("route me", add_special_tokens=False)["input_ids"]]
    a = engine.generate(p, SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=6))
    b = engine.generate(p, SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=6))
    assert torch.equal(a.response_ids, b.response_ids)


def test_keyed_uniforms_are_each_rows_own_stream():
    keys = [draw_key(3, uid, copy, "tokens") for uid in ("a", 7) for copy in range(2)]
    assert len(set(keys)) == 4 and all(0 <= k < 2**63 for k in keys)
    assert draw_key(3, "a", 0, "tokens") != draw_key(3, "a", 0, "route") != draw_key(4, "a", 0, "route")
    u = keyed_uniforms(keys, 5)
    assert u.shape == (4, 5) and bool(((u >= 0) & (u < 1)).all())
    # a row's numbers depend on its key alone: not on the rows beside it, nor on torch's default seed
    torch.manual_seed(123)
    torch.testing.assert_close(keyed_uniforms(keys[2:3], 5), u[2:3], rtol=0, atol=0)
    assert not torch.equal(u[0], u[1])


@pytest.mark.parametrize("decode", ["lean", "loop"])
def test_keyed_draws_give_a_row_its_tokens_in_any_batch(tiny, decode):
    """With row keys a prompt's rows draw the same tokens alone, beside other prompts (other padding)
    or one prompt per micro-batch; the unkeyed batch stream would hand them other uniforms. Other
    keys draw other tokens."""
    model, tok = tiny
    prompts = _prompts(tok) + [
        tok("a third prompt, longer than the other two", add_special_tokens=False)["input_ids"]
    ]
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=1.0, max_new_tokens=8)
    keys = [draw_key(7, uid, j, "tokens") for uid in range(3) for j in range(2)]
    eos = [tok.eos_token_id]
    engine = HFGenerateEngine(model, tok.pad_token_id, eos, settings=HFEngineSettings(decode=decode))
    one_each = HFEngineSettings(decode=decode, micro_batch_size=1)
    whole = engine.generate(prompts, sampling, keys)
    torch.manual_seed(0)
    alone = engine.generate(prompts[1:2], sampling, keys[2:4])
    micro = HFGenerateEngine(model, tok.pad_token_id, eos, settings=one_each).generate(
        prompts, sampling, keys
    )
    assert alone.token_lists() == whole.token_lists()[2:4]
    assert micro.token_lists() == whole.token_lists()
    torch.testing.assert_close(
        alone.log_probs, whole.log_probs[2:4, : alone.log_probs.shape[1]], atol=1e-5, rtol=0
    )
    assert engine.generate(prompts, sampling, [k + 1 for k in keys]).token_lists() != whole.token_lists()
    torch.manual_seed(0)
    unkeyed = engine.generate(prompts[1:2], sampling)
    assert unkeyed.token_lists() != alone.token_lists()  # the batch stream: other uniforms
    with pytest.raises(ValueError, match="row_keys: 5 keys for 3 prompts x 2 samples"):
        engine.generate(prompts, sampling, keys[:5])


def test_decode_generate_refuses_keyed_draws(tiny):
    model, tok = tiny
    engine = HFGenerateEngine(
        model, tok.pad_token_id, [tok.eos_token_id], settings=HFEngineSettings(decode="generate")
    )
    with pytest.raises(ValueError, match="decode=generate cannot draw from keyed streams"):
        engine.generate(_prompts(tok), SamplingParams(n_generations_per_prompt=1, max_new_tokens=2), [1, 2])
