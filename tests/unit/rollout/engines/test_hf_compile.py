"""The lean step compiled with its sampler (``rollout.engines.hf.lean_compile``): the fixed-shape
sampler (``hf_decode.sample_at`` / ``SampledStep``) against the eager one, and the compiled step
against the eager lean step."""

import pytest
import torch
from test_hf_graph import CUDA
from test_hf_lean import PAD, _left_padded, _prompts, _random_model, assert_fixed_step_agrees

from src.config.sampling import SamplingParams
from src.rollout.engines import hf_lean
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.hf_decode import (
    DecodeStep,
    SampledStep,
    _lean_prefill,
    _loop,
    eager_sampler,
    fused_sampler,
    sample_at,
    warped_log_probs,
)

EAGER = HFEngineSettings(decode="lean", cuda_graph=False)
COMPILED = HFEngineSettings(decode="lean", cuda_graph=False, lean_compile=True)
GRAPHED_COMPILED = HFEngineSettings(decode="lean", cuda_graph=True, lean_compile=True)
GRAPHED = HFEngineSettings(decode="lean", cuda_graph=True)
STOP = [1, 2, 3, 4, 5]  # several stop tokens: rows of the tiny models stop within a few steps
# (temperature, top_p): the full-vocabulary draw, the nucleus, each with and without temperature; greedy
SAMPLERS = [(1.0, 1.0), (0.7, 1.0), (1.0, 0.9), (0.7, 0.9), (0.0, 1.0)]


def _sampling(temperature: float, top_p: float, n: int = 4, max_new_tokens: int = 12) -> SamplingParams:
    return SamplingParams(
        n_generations_per_prompt=n,
        temperature=temperature,
        top_p=top_p,
        max_new_tokens=max_new_tokens,
        min_new_tokens=2,
    )


@pytest.fixture(params=["qwen2", "llama"])
def model(request):
    return _random_model(request.param)


@pytest.mark.parametrize("temperature,top_p", SAMPLERS)
def test_the_fixed_shape_sampler_gives_the_eager_samplers_tokens_and_log_probs_bit_for_bit(
    model, temperature, top_p
):
    """``sample_at`` with the uniforms ``draw`` would draw = ``DecodeStep.sample`` exactly, the stop
    tokens held off before ``min_new_tokens`` (a stop token that would win every draw), on the model's
    own logits sharpened so that the nucleus cuts."""
    vocab, n = model.config.vocab_size, 4
    ids, attn = _left_padded([6, 2, 9], vocab, seed=4)
    with torch.no_grad():
        logits, _ = _lean_prefill(model, ids, attn, n, 4, fixed_shape=True)
    logits = logits * 8
    logits[::3, STOP[0]] = 50.0
    if 0 < temperature and top_p < 1.0:  # the nucleus cuts on these logits
        assert torch.isinf(warped_log_probs(logits, temperature, top_p)).any(-1).all()
    step = DecodeStep(_sampling(temperature, top_p), STOP, PAD, synced=False)
    fused = SampledStep(None, step, vocab)
    rows = logits.shape[0]
    for t in (0, 1, 2, 3):
        torch.manual_seed(t)
        ref_tok, ref_logp = step.sample(logits.clone(), t)
        torch.manual_seed(t)
        u = torch.zeros((rows, 1)) if step.greedy else torch.rand((rows, 1))
        suppress = fused.stop_mask & (torch.tensor(t) < step.sampling.min_new_tokens)
        tok, logp = sample_at(logits, u, suppress, temperature, top_p)
        assert torch.equal(tok, ref_tok), t
        if step.greedy:
            assert ref_logp is None and torch.equal(logp, torch.zeros(rows))
        else:
            assert torch.equal(logp, ref_logp), (t, (logp - ref_logp).abs().max())
        assert bool(torch.isin(tok, step.stop).any()) == (t >= 2), t


@pytest.mark.parametrize("temperature,top_p", SAMPLERS)
def test_the_fused_loop_decodes_what_the_eager_loop_decodes_bit_for_bit(
    model, temperature, top_p, monkeypatch
):
    """The whole decode loop, finished rows included (pad and log-prob 0 after their stop token):
    the fused sampler (``SampledStep``, not compiled here) draws its uniforms as the eager sampler
    does, so one seed gives the same tokens and log-probs, both on the fixed-shape lean step."""
    monkeypatch.setattr(hf_lean, "compiled", lambda step: step)  # the same function, run eagerly
    vocab, n = model.config.vocab_size, 4
    ids, attn = _left_padded([5, 1, 9], vocab, seed=3)
    step = DecodeStep(_sampling(temperature, top_p), STOP, PAD, synced=False)
    rows = ids.shape[0] * n
    with torch.no_grad():
        torch.manual_seed(7)
        logits, fixed = _lean_prefill(model, ids, attn, n, 12, fixed_shape=True)
        ref = _loop(
            eager_sampler(lambda tok, j: fixed(tok, torch.tensor(j)), logits, step), rows, "cpu", step
        )
        torch.manual_seed(7)
        got = _loop(fused_sampler(model, ids, attn, n, step, cuda_graph=False)[1], rows, "cpu", step)
    assert torch.equal(got[0], ref[0]) and torch.equal(got[1], ref[1])
    if not step.greedy:  # the case this test is for: rows that stopped and kept emitting padding
        stopped = torch.isin(ref[0][:, :-1], torch.tensor(STOP)).any(-1)
        assert stopped.any() and (ref[0][stopped, -1] == PAD).all()


def test_lean_compile_needs_decode_lean_and_is_off_by_default():
    assert HFEngineSettings().lean_compile is False
    with pytest.raises(ValueError, match="lean_compile=true needs decode=lean"):
        HFEngineSettings(decode="loop", lean_compile=True)
    with pytest.raises(ValueError, match="lean_compile=true needs decode=lean"):
        HFEngineSettings(decode="generate", lean_compile=True)


@pytest.mark.slow
def test_the_compiled_fixed_shape_step_gives_the_eager_steps_logits_on_cpu(model):
    assert_fixed_step_agrees(model, hf_lean.compiled, fixed_reference=True)


@pytest.mark.slow
@pytest.mark.parametrize("temperature,top_p", [(0.7, 0.9), (0.0, 1.0)])
def test_compiled_decoding_draws_the_tokens_of_eager_lean_decoding_under_one_seed_on_cpu(temperature, top_p):
    """A generate call with ``lean_compile`` on CPU: the eager lean step's tokens and log-probs under
    one seed; later calls of the same shapes reuse the compiled graph (no recompile) and read the
    weights as they are then (an optimizer's in-place update; not constants baked in at compile)."""
    from torch._dynamo.utils import counters

    model = _random_model("qwen2")
    prompts, sampling = _prompts(model.config.vocab_size), _sampling(temperature, top_p)
    for call in range(3):
        if call == 2:
            with torch.no_grad():
                for p in model.parameters():
                    p.mul_(1.5)
        torch.manual_seed(11)
        ref = HFGenerateEngine(model, PAD, STOP, settings=EAGER).generate(prompts, sampling)
        graphs = counters["stats"]["unique_graphs"]
        torch.manual_seed(11)
        got = HFGenerateEngine(model, PAD, STOP, settings=COMPILED).generate(prompts, sampling)
        assert got.token_lists() == ref.token_lists(), call
        assert torch.allclose(got.log_probs, ref.log_probs, atol=1e-5), call
        if call > 0:
            assert counters["stats"]["unique_graphs"] == graphs, call


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9), (0.0, 1.0)])
def test_compiled_graphed_decoding_draws_the_tokens_of_eager_lean_decoding_on_cuda(temperature, top_p):
    """``lean_compile`` with ``cuda_graph`` on CUDA: the compiled step and sampler captured as one
    CUDA graph give the eager lean step's tokens and log-probs under one seed (the uniforms come from
    the CUDA generator as the eager draw takes them); so does the compiled step without the graph."""
    model = _random_model("qwen2").to("cuda", torch.float64)
    prompts, sampling = _prompts(model.config.vocab_size), _sampling(temperature, top_p)
    torch.manual_seed(11)
    ref = HFGenerateEngine(model, PAD, STOP, settings=EAGER).generate(prompts, sampling)
    for settings in (GRAPHED_COMPILED, COMPILED, GRAPHED):
        torch.manual_seed(11)
        got = HFGenerateEngine(model, PAD, STOP, settings=settings).generate(prompts, sampling)
        assert got.token_lists() == ref.token_lists(), settings
        assert torch.allclose(got.log_probs, ref.log_probs, atol=1e-6), settings


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (1.0, 0.9)])
def test_compiled_graphed_decoding_builds_and_runs_at_the_benchmarks_shapes_in_bf16(temperature, top_p):
    """bf16 weights, 64 rows over a vocabulary of 8192 (the ~0.37 B benchmark's shapes): inductor's
    kernels for them build and run inside the graph (the float64 test above runs other kernels: on
    torch 2.11 a Triton scan of the sampler's fp32 [64, 8192] failed to build), every row gets its
    tokens, and their log-probs are those of the eager sampler on the same rows to bf16 accuracy."""
    model = _random_model("qwen2", vocab_size=8192).to("cuda", torch.bfloat16)
    prompts = [p * 3 for p in _prompts(8192)] * 2 + [[7, 9, 11, 13]] * 2  # 8 prompts
    sampling = SamplingParams(
        n_generations_per_prompt=8, temperature=temperature, top_p=top_p, max_new_tokens=16, min_new_tokens=16
    )
    torch.manual_seed(3)
    got = HFGenerateEngine(model, PAD, STOP, settings=GRAPHED_COMPILED).generate(prompts, sampling)
    assert [len(t) for t in got.token_lists()] == [16] * 64
    torch.manual_seed(3)
    ref = HFGenerateEngine(model, PAD, STOP, settings=EAGER).generate(prompts, sampling)
    assert torch.isfinite(got.log_probs).all() and (got.log_probs <= 0).all()
    same = torch.tensor([a[:1] == b[:1] for a, b in zip(got.token_lists(), ref.token_lists())])
    assert same.float().mean() > 0.9  # the first draws agree: the compiled step is the eager one's
