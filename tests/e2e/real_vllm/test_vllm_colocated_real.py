"""A real vLLM (colocated, in-process) against the HF engine on the tiny model: the same log-probs
for the same tokens, the same greedy output before and after a weight push, LoRA merged on push.

Runs in the vLLM venv (``make test-vllm``); skipped where vLLM is not importable. One engine for the
whole module (start-up is most of the cost)."""

from __future__ import annotations

import pytest
import torch
from enginechecks import assert_push_moves_greedy_like_hf, greedy

from src.config.sampling import SamplingParams
from src.rollout.engines.hf_decode import sampling_log_probs
from src.rollout.engines.types import draw_key
from src.rollout.factory import build_hf_engine, build_vllm_engine

pytest.importorskip("vllm", reason="vLLM not importable: run in the vLLM venv (make test-vllm)")
pytestmark = pytest.mark.vllm

# small: the tiny model's KV cache and context fit in a few MB
SETTINGS = dict(max_model_len=256, kv_cache_memory_gib=0.25, enforce_eager=True)
TEXTS = ["route me to the weather tool", "what is 2 + 2", "search the web for cats", "hello"]


@pytest.fixture(scope="module")
def setup(tiny_model_dir):
    from src.models.loading import load_causal_lm, load_tokenizer

    model, tok = load_causal_lm(tiny_model_dir).eval(), load_tokenizer(tiny_model_dir)
    engine = build_vllm_engine(model, tok, tiny_model_dir, **SETTINGS)
    prompts = [tok(t, add_special_tokens=False)["input_ids"] for t in TEXTS]
    yield model, tok, engine, prompts
    engine.update_weights(model.state_dict())  # other modules' engines are their own; be tidy anyway


def _trainer_log_probs(model, prompts, completions, temperature: float) -> torch.Tensor:
    """Teacher-forced log-probs of the engine's tokens under the HF model, [N, T] (0 off the mask)."""
    n = completions.response_ids.shape[0] // len(prompts)
    out = torch.zeros_like(completions.log_probs)
    for row, tokens in enumerate(completions.token_lists()):
        prompt = prompts[row // n]
        ids = torch.tensor([prompt + tokens])
        with torch.no_grad():
            logits = model(ids).logits[:, len(prompt) - 1 : -1].float()
        out[row, : len(tokens)] = sampling_log_probs(logits, torch.tensor([tokens]), temperature, 1.0)[0]
    return out


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_sampling_log_probs_equal_the_trainers(setup, temperature):
    model, _, engine, prompts = setup
    # no min_new_tokens: it takes the stop tokens out of the sampling distribution (vLLM's processed
    # log-probs renormalise without them), which the trainer's log-probs do not
    sampling = SamplingParams(n_generations_per_prompt=4, temperature=temperature, max_new_tokens=16)
    out = engine.generate(prompts, sampling)
    assert out.response_mask.sum() > len(prompts) * 4 * 4
    want = _trainer_log_probs(model, prompts, out, temperature)
    mask = out.response_mask.bool()
    assert (out.log_probs[mask] < 0).all()  # real log-probs, not the 0 of a missing value
    assert torch.allclose(out.log_probs[mask], want[mask], atol=1e-5), (out.log_probs - want).abs().max()


def test_keyed_draws_give_a_row_its_tokens_in_any_batch(setup):
    """Row keys (rollout.keyed_draws): each row is its own request with its own seed, so a prompt's
    rows are drawn alike alone and beside the others (another rank's shard), and still scored as the
    trainer scores them."""
    model, _, engine, prompts = setup
    sampling = SamplingParams(n_generations_per_prompt=2, temperature=1.0, max_new_tokens=16)
    keys = [draw_key(5, uid, copy, "tokens") for uid in range(len(prompts)) for copy in range(2)]
    whole = engine.generate(prompts, sampling, keys)
    alone = engine.generate(prompts[2:3], sampling, keys[4:6])
    assert alone.token_lists() == whole.token_lists()[4:6]
    assert len(set(map(tuple, whole.token_lists()))) > 1
    assert engine.generate(prompts, sampling, [k + 1 for k in keys]).token_lists() != whole.token_lists()
    want, mask = _trainer_log_probs(model, prompts, whole, 1.0), whole.response_mask.bool()
    assert torch.allclose(whole.log_probs[mask], want[mask], atol=1e-5)


def test_greedy_equals_hf_before_and_after_a_push(setup):
    model, tok, engine, prompts = setup
    before = assert_push_moves_greedy_like_hf(engine, model, tok, prompts)
    engine.update_weights(model.state_dict())
    assert greedy(engine, prompts, tok) == before


def test_lora_push_samples_from_the_merged_model(setup, tiny_model_dir):
    from src.models.loading import LoraSettings, load_causal_lm
    from src.rollout.engines.vllm_engine import lora_scaling_of

    model, tok, engine, prompts = setup
    lora = load_causal_lm(tiny_model_dir, lora=LoraSettings(enable=True, r=4, alpha=8)).eval()
    with torch.no_grad():
        g = torch.Generator().manual_seed(1)
        for name, p in lora.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)  # B starts at 0: make it matter
    engine.lora_scaling = lora_scaling_of(lora)
    try:
        engine.update_weights(lora.state_dict())
        got = greedy(engine, prompts, tok)
    finally:
        engine.lora_scaling = None
        engine.update_weights(model.state_dict())
    assert got == greedy(build_hf_engine(lora, tok), prompts, tok)
    assert got != greedy(engine, prompts, tok)


def test_sleep_follows_the_platform(setup):
    from src.rollout.engines.vllm_engine import sleep_mode_supported

    _, _, engine, _ = setup
    assert engine.needs_weight_sync
    assert engine.sleeps == sleep_mode_supported()
    assert engine.sleeps == torch.cuda.is_available()  # CPU: vLLM has no sleep mode
