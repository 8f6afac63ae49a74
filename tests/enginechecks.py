"""Checks shared by the real-vLLM engine tests (colocated and server mode)."""

from __future__ import annotations

import copy

import torch

from src.config.sampling import SamplingParams
from src.rollout.factory import build_hf_engine


def greedy(engine, prompts, tok) -> list[list[int]]:
    sampling = SamplingParams(
        n_generations_per_prompt=1, temperature=0.0, max_new_tokens=12, stop_token_ids=[tok.eos_token_id]
    )
    return engine.generate(prompts, sampling).token_lists()


def assert_push_moves_greedy_like_hf(engine, model, tok, prompts) -> list[list[int]]:
    """Greedy output equals HF's on ``model``; after pushing perturbed weights it changes and
    equals HF's on the perturbed model. Returns the greedy output before the push."""
    before = greedy(engine, prompts, tok)
    assert before == greedy(build_hf_engine(model, tok), prompts, tok)
    moved = copy.deepcopy(model)
    with torch.no_grad():
        g = torch.Generator().manual_seed(0)
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    engine.update_weights(moved.state_dict())
    after = greedy(engine, prompts, tok)
    assert after != before
    assert after == greedy(build_hf_engine(moved, tok), prompts, tok)
    return before
