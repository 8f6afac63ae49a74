"""What every rollout engine takes and returns: sampling settings (``src.config.sampling.SamplingParams``:
``n`` completions per prompt, temperature 0 means greedy), completions, the protocol."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from src.config.sampling import SamplingParams


@dataclass
class Completions:
    """``n`` completions per prompt, prompt-major: row i*n + j is prompt i's j-th sample.

    response_ids: [N, T] long, right-padded with pad_id.
    response_mask: [N, T] 1 on generated tokens (the stop token included).
    log_probs: [N, T] float, log-prob of each token under the sampling distribution (0 on padding).
    """

    response_ids: torch.Tensor
    response_mask: torch.Tensor
    log_probs: torch.Tensor

    @classmethod
    def from_token_lists(
        cls, seqs: list[list[int]], pad_id: int, log_probs: list[list[float]] | None = None
    ) -> Completions:
        """Right-pad token lists (and their log-probs, 0 where absent) into a Completions."""
        width = max([len(s) for s in seqs] + [1])
        ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(seqs), width), dtype=torch.long)
        logp = torch.zeros((len(seqs), width))
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s, dtype=torch.long)
            mask[i, : len(s)] = 1
            if log_probs is not None and log_probs[i]:
                logp[i, : len(log_probs[i])] = torch.tensor(log_probs[i])
        return cls(ids, mask, logp)

    def token_lists(self) -> list[list[int]]:
        return [ids[m.bool()].tolist() for ids, m in zip(self.response_ids, self.response_mask)]


@runtime_checkable
class RolloutEngine(Protocol):
    """``needs_weight_sync``: True when the engine holds its own copy of the weights (vLLM), so the
    trainer must call ``update_weights`` after each optimizer step and after a resume; False when it
    samples with the training module itself (HF)."""

    needs_weight_sync: bool

    def generate(
        self, prompt_ids: list[list[int]], sampling: SamplingParams, row_keys: Sequence[int] | None = None
    ) -> Completions:
        """``row_keys``: one key per row (prompt-major, ``len(prompt_ids) * sampling.n``); row r's
        tokens are drawn from a stream seeded by ``row_keys[r]`` alone (:func:`keyed_uniforms`), so a
        prompt draws the same tokens whatever batch, micro-batch or rank it is in. None: the batch
        draws from torch's default generator."""

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Make the engine sample from the trainer's current weights (after an optimizer step)."""

    def sleep(self) -> None:
        """Release the engine's accelerator memory while the trainer runs (a no-op where unsupported)."""

    def wake(self) -> None:
        """Take back what ``sleep`` released."""


def draw_key(seed: int, uid, copy: int, stream: str) -> int:
    """The key of one row's random stream: its step's sampling seed, its prompt's ``uid``, its copy
    in the group and what it draws (``"route"``, ``"tokens"``); a 63-bit int for
    ``torch.Generator.manual_seed``. A hash, not arithmetic: uids are strings or ints."""
    text = f"{int(seed)}\x1f{uid}\x1f{int(copy)}\x1f{stream}".encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1


def keyed_uniforms(keys: Sequence[int], count: int, device=None) -> torch.Tensor:
    """[len(keys), count] uniforms in [0, 1): row r is the first ``count`` draws of a CPU
    ``torch.Generator`` seeded by ``keys[r]`` (the same numbers on any device and in any batch)."""
    out = torch.empty((len(keys), count), dtype=torch.float32)
    generator = torch.Generator()
    for r, key in enumerate(keys):
        generator.manual_seed(int(key))
        out[r] = torch.rand(count, generator=generator)
    return out.to(device)


def left_pad(
    seqs: list[list[int]], pad_id: int, device=None, multiple_of: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists to the longest, rounded up to ``multiple_of`` (bucketed widths let compiled
    graphs and static caches be reused across batches). -> (ids [B, L], attention_mask [B, L])."""
    width = max(len(s) for s in seqs)
    if multiple_of > 1:
        width = -(-width // multiple_of) * multiple_of
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        if s:
            ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            mask[i, width - len(s) :] = 1
    return ids.to(device), mask.to(device)


def mask_after_stop(tokens: torch.Tensor, stop_ids: list[int]) -> torch.Tensor:
    """[N, T] -> [N, T] mask that is 1 up to and including the first stop token."""
    if not stop_ids:
        return torch.ones_like(tokens)
    is_stop = torch.isin(tokens, torch.tensor(stop_ids, device=tokens.device))
    # number of stop tokens strictly before each position
    before = torch.cumsum(is_stop.long(), dim=1) - is_stop.long()
    return (before == 0).long()


def eos_token_ids(generation_config, tokenizer) -> list[int]:
    """Every end-of-sequence id: the model's ``generation_config.eos_token_id`` (an int or a list, e.g.
    ``<|im_end|>`` and ``<|endoftext|>`` for ChatML models) plus the tokenizer's."""
    ids: set[int] = set()
    cfg_eos = getattr(generation_config, "eos_token_id", None) if generation_config is not None else None
    for value in (cfg_eos, getattr(tokenizer, "eos_token_id", None)):
        if value is None:
            continue
        ids.update([int(value)] if isinstance(value, int) else [int(v) for v in value])
    return sorted(ids)
