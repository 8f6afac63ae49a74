"""Rollout engines: the protocol, and Hugging Face ``generate`` as the embedded default."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

log = logging.getLogger(__name__)


@dataclass
class SamplingParams:
    """How to sample: ``n`` completions per prompt; temperature 0 means greedy."""

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 128
    stop_token_ids: list[int] = field(default_factory=list)


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
    def from_token_lists(cls, seqs: list[list[int]], pad_id: int,
                         log_probs: list[list[float]] | None = None) -> "Completions":
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
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions: ...

    def update_weights(self, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Make the engine sample from the trainer's current weights (after an optimizer step)."""


def left_pad(seqs: list[list[int]], pad_id: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-pad token lists. -> (ids [B, L], attention_mask [B, L])."""
    width = max(len(s) for s in seqs)
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


def sampling_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """Log-prob of ``tokens`` under the sampling distribution (temperature, then nucleus top-p).

    Args:
        logits: [N, T, V] raw model logits aligned with tokens; tokens: [N, T].
    Returns:
        [N, T]; greedy decoding (temperature <= 0) gives 0 (probability 1).
    """
    if temperature <= 0:
        return torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p < 1.0:
        sorted_lp, order = logp.sort(dim=-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the token crossing it included)
        drop_sorted = (sorted_lp.exp().cumsum(-1) - sorted_lp.exp()) >= top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logp = torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


class HFGenerateEngine:
    """Batched, left-padded ``model.generate`` on the trainer's own module (no weight copy needed)."""

    def __init__(self, model, pad_token_id: int, eos_token_ids: list[int], micro_batch_size: int = 64):
        self.model = model
        self.pad_token_id = pad_token_id
        self.eos_token_ids = list(eos_token_ids)
        self.micro_batch_size = micro_batch_size

    def update_weights(self, state_dict=None) -> None:
        """The engine generates with the training module itself, so it is always current."""

    @torch.no_grad()
    def generate(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> Completions:
        device = next(self.model.parameters()).device
        stop = sorted(set(self.eos_token_ids) | set(sampling.stop_token_ids))
        was_training = self.model.training
        self.model.eval()
        chunks = []
        try:
            for start in range(0, len(prompt_ids), self.micro_batch_size):
                chunks.append(
                    self._generate_chunk(
                        prompt_ids[start : start + self.micro_batch_size], sampling, stop, device
                    )
                )
        finally:
            self.model.train(was_training)
        width = max(c[0].shape[1] for c in chunks)
        pad = lambda t, v: torch.nn.functional.pad(t, (0, width - t.shape[1]), value=v)  # noqa: E731
        ids = torch.cat([pad(c[0], self.pad_token_id) for c in chunks])
        logp = torch.cat([pad(c[1], 0.0) for c in chunks])
        mask = torch.cat([pad(c[2], 0) for c in chunks])
        return Completions(ids.cpu(), mask.cpu(), logp.cpu())

    def _generate_chunk(self, prompts, sampling: SamplingParams, stop, device):
        ids, attn = left_pad(prompts, self.pad_token_id, device)
        greedy = sampling.temperature <= 0
        kwargs = (
            dict(do_sample=False)
            if greedy
            else dict(do_sample=True, temperature=sampling.temperature, top_p=sampling.top_p, top_k=0)
        )
        seqs = self.model.generate(
            input_ids=ids,
            attention_mask=attn,
            max_new_tokens=sampling.max_new_tokens,
            num_return_sequences=sampling.n,
            eos_token_id=stop,
            pad_token_id=self.pad_token_id,
            **kwargs,
        )
        resp = seqs[:, ids.shape[1] :]
        if resp.shape[1] == 0:
            empty = torch.zeros((resp.shape[0], 0), device=resp.device)
            return resp, empty, empty.long()
        mask = mask_after_stop(resp, stop)
        # One teacher-forced pass is far cheaper than keeping per-step scores inside generate.
        full_mask = torch.cat([attn.repeat_interleave(sampling.n, 0), mask], dim=1)
        positions = (full_mask.cumsum(-1) - 1).clamp(min=0)
        logits = self.model(
            input_ids=seqs, attention_mask=full_mask, position_ids=positions, logits_to_keep=resp.shape[1] + 1
        ).logits[:, :-1]
        logp = sampling_log_probs(logits, resp, sampling.temperature, sampling.top_p)
        return resp, logp * mask, mask
