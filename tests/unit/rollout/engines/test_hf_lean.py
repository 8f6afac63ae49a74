"""The lean Llama / Qwen2 decode step (``decode=lean``) against the HF forward it replaces."""

import contextlib
import copy
import logging

import pytest
import torch

from src.config.sampling import SamplingParams
from src.rollout.engines import hf_lean
from src.rollout.engines.hf import HFEngineSettings, HFGenerateEngine
from src.rollout.engines.hf_decode import hf_stepper, lean_stepper
from src.rollout.engines.hf_lean import unsupported_reason

LEAN = HFEngineSettings(decode="lean")
LOOP = HFEngineSettings(decode="loop")
PAD, EOS = 0, 1


def _random_model(model_type: str, **extra):
    """A random 2-layer model: GQA (4 query heads on 2 kv heads), every bias drawn non-zero; ``extra``
    config fields (e.g. vocab_size) replace the defaults."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    common = dict(
        vocab_size=96, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=PAD, eos_token_id=EOS,
    ) | extra  # fmt: skip
    torch.manual_seed(0)
    if model_type == "qwen2":  # q / k / v carry a bias, o_proj none
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        model = LlamaForCausalLM(LlamaConfig(attention_bias=True, mlp_bias=True, **common))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 0.5)
    return model.eval()


def _left_padded(lengths, vocab: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    width = max(lengths)
    ids = torch.full((len(lengths), width), PAD, dtype=torch.long)
    attn = torch.zeros((len(lengths), width), dtype=torch.long)
    for i, n in enumerate(lengths):
        ids[i, width - n :] = torch.randint(2, vocab, (n,), generator=g)
        attn[i, width - n :] = 1
    return ids, attn


@pytest.fixture(params=["embedded", "qwen2", "llama"])
def model(request, tiny):
    return tiny[0] if request.param == "embedded" else _random_model(request.param)


def test_the_lean_step_gives_the_logits_of_the_hf_forward_at_every_position(model):
    assert unsupported_reason(model) is None
    vocab, n, t_max = model.config.vocab_size, 3, 12
    ids, attn = _left_padded([7, 2, 11], vocab)
    with torch.no_grad():
        ref, hf_forward = hf_stepper(model, ids, attn, n, t_max)
        got, lean_forward = lean_stepper(model, ids, attn, n, t_max)
        assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5)
        g = torch.Generator().manual_seed(1)
        for j in range(t_max - 1):  # every row its own token: the n copies of a prompt diverge
            tokens = torch.randint(2, vocab, (ids.shape[0] * n,), generator=g)
            ref, got = hf_forward(tokens, j), lean_forward(tokens, j)
            assert torch.allclose(got, ref, atol=1e-5, rtol=1e-5), (j, (got - ref).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_cpu_fp32_products_run_through_onednn_others_plain_and_both_give_the_hf_logits(dtype):
    """The sliced step on a CPU fp32 model multiplies by oneDNN-reordered weights (the fast path on
    CPU); fp64 (and the fixed-shape step of the CUDA graph) keep the plain W @ x^T products."""
    model = _random_model("qwen2").to(dtype)
    vocab, n, t_max = model.config.vocab_size, 2, 6
    ids, attn = _left_padded([4, 9], vocab)
    with torch.no_grad():
        _, hf_forward = hf_stepper(model, ids, attn, n, t_max)
        _, lean = lean_stepper(model, ids, attn, n, t_max)
        fixed = lean_step(model, True, ids, attn, n, t_max)
        onednn = dtype == torch.float32 and torch.backends.mkldnn.is_available()
        assert [lean.head.onednn, *(layer.down.onednn for layer in lean.layers)] == [onednn] * 3
        assert not fixed.head.onednn and not any(layer.gate_up.onednn for layer in fixed.layers)
        tol = 1e-5 if dtype == torch.float32 else 1e-7  # HF's RMSNorm normalises in fp32 either way
        g = torch.Generator().manual_seed(2)
        for j in range(t_max - 1):
            tokens = torch.randint(2, vocab, (ids.shape[0] * n,), generator=g)
            ref, got = hf_forward(tokens, j), lean(tokens, j)
            assert got.dtype == dtype and got.is_contiguous()
            assert torch.allclose(got, ref, atol=tol, rtol=tol), (j, (got - ref).abs().max())
            assert torch.allclose(fixed(tokens, torch.tensor(j)), ref, atol=tol, rtol=tol)


def lean_step(model, fixed: bool, ids, attn, n: int, t_max: int):
    """A ``LeanStep`` on the prompts' prefill: the sliced step (``fixed=False``) or the fixed-shape one."""
    from transformers import DynamicCache

    from src.rollout.engines.hf_decode import _prefill

    cache = DynamicCache()
    _prefill(model, ids, attn, cache)
    return hf_lean.LeanStep(model, cache, attn, n, t_max, fixed_shape=fixed)


def assert_fixed_step_agrees(model, candidate_of, fixed_reference: bool, atol: float = 1e-5) -> None:
    """The logits of ``candidate_of(the fixed-shape step)`` equal (to ``atol``) the reference step's at
    every slot, on the same prompts' prefill and the same random tokens. The reference is the
    sliced step (j an int) or, with ``fixed_reference``, the fixed-shape one (j a 0-dim tensor)."""
    vocab, n, t_max = model.config.vocab_size, 3, 10
    ids, attn = _left_padded([6, 2, 9], vocab, seed=4)
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        reference = lean_step(model, fixed_reference, ids, attn, n, t_max)
        candidate = candidate_of(lean_step(model, True, ids, attn, n, t_max))
        for j in range(t_max):
            tokens = torch.randint(2, vocab, (ids.shape[0] * n,), generator=g)
            ref = reference(tokens, torch.tensor(j) if fixed_reference else j)
            got = candidate(tokens, torch.tensor(j))
            assert torch.allclose(got, ref, atol=atol, rtol=atol), (j, (got - ref).abs().max())


@contextlib.contextmanager
def forward_calls(model):
    """Counts the calls of ``model``'s own forward while the block runs (yields the growing list)."""
    calls = []
    hook = model.register_forward_hook(lambda *_: calls.append(1))
    try:
        yield calls
    finally:
        hook.remove()


def _engine(model, settings, eos=(EOS,)):
    return HFGenerateEngine(model, PAD, list(eos), settings=settings)


def _prompts(vocab: int):
    ids, attn = _left_padded([5, 1, 9], vocab, seed=3)
    return [row[mask.bool()].tolist() for row, mask in zip(ids, attn)]


def test_lean_greedy_tokens_equal_the_loop_and_the_hf_forward_runs_only_the_prefill(model):
    prompts = _prompts(model.config.vocab_size)
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=10)
    ref = _engine(model, LOOP, eos=[]).generate(prompts, sampling)
    with forward_calls(model) as calls:
        got = _engine(model, LEAN, eos=[]).generate(prompts, sampling)
    assert got.token_lists() == ref.token_lists()
    assert all(len(t) == 10 for t in got.token_lists())
    assert len(calls) == 1  # one prefill; the 9 decode steps never entered the module's forward


def test_the_lean_step_reads_the_weights_of_each_call_not_a_copy_from_an_earlier_one(model):
    """An optimizer step between two generate calls changes what the next call decodes with (the
    products read the module's own tensors; the fused q/k/v and gate/up are concatenated per call)."""
    model = copy.deepcopy(model)  # the embedded model is shared by the session's tests
    prompts = _prompts(model.config.vocab_size)
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=8)
    lean, loop = _engine(model, LEAN, eos=[]), _engine(model, LOOP, eos=[])
    before = lean.generate(prompts, sampling).token_lists()
    with torch.no_grad():  # an in-place update, as the optimizer makes it
        g = torch.Generator().manual_seed(7)
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    after = lean.generate(prompts, sampling).token_lists()
    assert after == loop.generate(prompts, sampling).token_lists()
    assert after != before


@pytest.mark.parametrize("temperature,top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_lean_sampling_draws_the_tokens_and_log_probs_of_the_loop_under_one_seed(model, temperature, top_p):
    prompts = _prompts(model.config.vocab_size)
    sampling = SamplingParams(
        n_generations_per_prompt=4, temperature=temperature, top_p=top_p, max_new_tokens=9
    )
    torch.manual_seed(5)
    ref = _engine(model, LOOP).generate(prompts, sampling)
    torch.manual_seed(5)
    got = _engine(model, LEAN).generate(prompts, sampling)
    assert got.token_lists() == ref.token_lists()
    assert torch.equal(got.response_mask, ref.response_mask)
    assert torch.allclose(got.log_probs, ref.log_probs, atol=1e-5)


def test_an_unsupported_model_decodes_through_the_hf_forward_and_says_why_once(caplog, monkeypatch):
    monkeypatch.setattr(hf_lean, "_logged", set())
    model = _random_model(
        "llama", rope_parameters={"rope_type": "linear", "factor": 2.0, "rope_theta": 10000.0}
    )
    assert "rope_type 'linear'" in unsupported_reason(model)
    prompts = _prompts(model.config.vocab_size)
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=6)
    with forward_calls(model) as calls:
        with caplog.at_level(logging.INFO, logger="src.rollout.engines.hf_lean"):
            got = _engine(model, LEAN, eos=[]).generate(prompts, sampling)
            _engine(model, LEAN, eos=[]).generate(prompts, sampling)
    assert len(calls) == 2 * 6  # prefill + 5 decode steps per call, all through the module
    assert got.token_lists() == _engine(model, LOOP, eos=[]).generate(prompts, sampling).token_lists()
    said = [r.getMessage() for r in caplog.records if "decoding through the HF forward" in r.getMessage()]
    assert len(said) == 1 and "rope_type 'linear'" in said[0]


def test_a_lora_model_falls_back_to_the_hf_forward():
    from peft import LoraConfig, get_peft_model

    base = _random_model("qwen2")
    model = get_peft_model(base, LoraConfig(r=2, lora_alpha=4, target_modules=["q_proj", "v_proj"]))
    assert unsupported_reason(model) == "a peft (LoRA) model"
    with forward_calls(model) as calls:
        _engine(model, LEAN, eos=[]).generate(
            _prompts(96), SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=4)
        )
    assert len(calls) == 4  # prefill + 3 decode steps through the (LoRA) module


def test_a_projection_that_is_not_a_plain_linear_is_not_supported():
    model = _random_model("qwen2")
    layer = model.model.layers[1].mlp
    layer.up_proj = type("Wrapped", (torch.nn.Linear,), {})(64, 96)
    assert "not a plain nn.Linear" in unsupported_reason(model)


def test_a_sliding_window_model_is_not_supported():
    model = _random_model("qwen2", use_sliding_window=True, sliding_window=4, max_window_layers=0)
    assert unsupported_reason(model) == "sliding-window attention"


def test_a_model_with_hooks_on_its_decoder_modules_is_not_supported():
    model = _random_model("llama")
    hook = model.model.layers[0].mlp.register_forward_pre_hook(lambda *_: None)
    try:
        assert "forward hooks" in unsupported_reason(model)
    finally:
        hook.remove()
    assert unsupported_reason(model) is None


def test_transformers_output_capturing_hooks_keep_the_lean_step():
    """A forward with output_hidden_states (the router's pass) leaves transformers' own recording hooks
    on every layer for good; they record nothing outside such a forward, so the lean step still runs."""
    model = _random_model("llama")
    model(input_ids=torch.tensor([[2, 3, 4]]), output_hidden_states=True)
    assert any(layer._forward_hooks for layer in model.model.layers)  # installed by transformers
    assert unsupported_reason(model) is None
    prompts = _prompts(model.config.vocab_size)
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=6)
    with forward_calls(model) as calls:
        got = _engine(model, LEAN, eos=[]).generate(prompts, sampling)
    assert len(calls) == 1  # the prefill only
    assert got.token_lists() == _engine(model, LOOP, eos=[]).generate(prompts, sampling).token_lists()
    model.model.layers[0].register_forward_hook(lambda *_: None)  # a hook of one's own still counts
    assert "forward hooks" in unsupported_reason(model)


def test_sharded_weights_keep_the_hf_forward(tiny, monkeypatch):
    """FSDP2 / ZeRO-3 gather each layer's weights in the module's forward hooks: no lean step."""
    from src.rollout.engines import hf

    model, _ = tiny
    monkeypatch.setattr(hf, "sharding_of", lambda m: "fsdp2")  # fewer than 8 steps: no collective check
    with forward_calls(model) as calls:
        _engine(model, LEAN, eos=[]).generate(
            _prompts(96), SamplingParams(n_generations_per_prompt=2, temperature=0.0, max_new_tokens=5)
        )
    assert len(calls) == 5  # prefill + 4 decode steps through the module
