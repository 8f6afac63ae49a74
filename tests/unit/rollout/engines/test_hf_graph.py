"""The fixed-shape lean step and its CUDA graph (``rollout.engines.hf.cuda_graph``)."""

import pytest
import torch
from test_hf_lean import EOS, PAD, _left_padded, _prompts, _random_model, assert_fixed_step_agrees, lean_step

from src.config.sampling import SamplingParams
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.hf_decode import lean_stepper

EAGER = HFEngineSettings(decode="lean", cuda_graph=False)
GRAPHED = HFEngineSettings(decode="lean", cuda_graph=True)
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(params=["embedded", "qwen2", "llama"])
def model(request, tiny):
    return tiny[0] if request.param == "embedded" else _random_model(request.param)


def test_the_fixed_shape_step_gives_the_logits_of_the_sliced_step_at_every_slot(model):
    assert_fixed_step_agrees(model, lambda fixed: fixed, fixed_reference=False)


def test_the_fixed_shape_step_runs_under_mixed_precision_autocast():
    """Under bf16 autocast on fp32 weights (what a bf16-mixed trainer sets up) the new keys / values
    come out bf16 into an fp32 cache: the fixed-shape write casts them as the sliced step's
    assignment does (``index_copy_`` would refuse the mixed dtypes)."""
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert_fixed_step_agrees(
            _random_model("qwen2"), lambda fixed: fixed, fixed_reference=False, atol=3e-2
        )


def test_the_fixed_shape_step_reads_no_slot_after_j():
    """Garbage in the slots after j changes nothing: they are masked, not merely not yet written."""
    model = _random_model("qwen2")
    ids, attn = _left_padded([4, 7], model.config.vocab_size, seed=1)
    tokens = torch.tensor([5, 6, 7, 8])
    with torch.no_grad():
        step = lean_step(model, True, ids, attn, 2, 6)
        step(tokens, torch.tensor(0))
        clean = step(tokens + 1, torch.tensor(1))
        for keys, values in step.gen_kv:
            keys[:, :, :, 2:] = 1e4
            values[:, :, :, 2:] = -1e4
        again = step(tokens + 1, torch.tensor(1))
    assert torch.equal(again, clean)


def test_cuda_graph_needs_decode_lean_and_a_known_value():
    with pytest.raises(ValueError, match="cuda_graph=true needs decode=lean"):
        HFEngineSettings(decode="loop", cuda_graph=True)
    with pytest.raises(ValueError, match="cuda_graph='always'"):
        HFEngineSettings(cuda_graph="always")
    HFEngineSettings(decode="loop")  # the default, auto, asks nothing of other decoders


def test_cuda_graph_auto_decodes_a_cpu_model_eagerly():
    model = _random_model("qwen2")
    prompts, sampling = (
        _prompts(model.config.vocab_size),
        SamplingParams(n_generations_per_prompt=2, max_new_tokens=6),
    )
    assert HFEngineSettings().cuda_graph == "auto"
    torch.manual_seed(3)
    auto = HFGenerateEngine(model, PAD, [EOS], settings=HFEngineSettings(decode="lean")).generate(
        prompts, sampling
    )
    torch.manual_seed(3)
    eager = HFGenerateEngine(model, PAD, [EOS], settings=EAGER).generate(prompts, sampling)
    assert auto.token_lists() == eager.token_lists()


def test_cuda_graph_on_a_cpu_model_is_an_error_that_names_the_setting():
    model = _random_model("llama")
    engine = HFGenerateEngine(model, PAD, [EOS], settings=GRAPHED)
    with pytest.raises(ValueError, match="cuda_graph=true needs the model on a CUDA device"):
        engine.generate(
            _prompts(model.config.vocab_size), SamplingParams(n_generations_per_prompt=2, max_new_tokens=4)
        )


@pytest.mark.gpu
@CUDA
@pytest.mark.parametrize("model_type", ["qwen2", "llama"])
def test_the_graph_replays_the_logits_of_the_eager_lean_step_on_cuda(model_type):
    # float64: the comparison is of the function, not of a precision's rounding
    model = _random_model(model_type).to("cuda", torch.float64)
    vocab, n, t_max = model.config.vocab_size, 4, 16
    ids, attn = (t.cuda() for t in _left_padded([6, 3, 11], vocab, seed=5))
    g = torch.Generator(device="cuda").manual_seed(3)
    with torch.no_grad():
        ref0, eager = lean_stepper(model, ids, attn, n, t_max)
        got0, graphed = lean_stepper(model, ids, attn, n, t_max, cuda_graph=True)
        assert torch.equal(got0, ref0)
        for j in range(t_max):
            tokens = torch.randint(2, vocab, (ids.shape[0] * n,), generator=g, device="cuda")
            ref, got = eager(tokens, j), graphed(tokens, j).clone()
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (j, (got - ref).abs().max())
    assert graphed.graph is not None


@pytest.mark.gpu
@CUDA
def test_graphed_decoding_draws_the_tokens_of_eager_lean_decoding_under_one_seed_on_cuda():
    model = _random_model("qwen2").to("cuda", torch.float64)
    prompts = _prompts(model.config.vocab_size)
    for sampling in (
        SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=12),
        SamplingParams(n_generations_per_prompt=4, temperature=1.0, max_new_tokens=12),
    ):
        torch.manual_seed(11)
        ref = HFGenerateEngine(model, PAD, [EOS], settings=EAGER).generate(prompts, sampling)
        torch.manual_seed(11)
        got = HFGenerateEngine(model, PAD, [EOS], settings=GRAPHED).generate(prompts, sampling)
        assert got.token_lists() == ref.token_lists()
        assert torch.allclose(got.log_probs, ref.log_probs, atol=1e-5)
