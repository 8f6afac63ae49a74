"""Smooth-inverse-frequency pooling of a prompt's tokens (Arora, Liang & Ma 2017, "A simple but
tough-to-beat baseline for sentence embeddings"): pure functions.

A plain mean of a request's token states is dominated by frequent tokens: word pieces, letters
and punctuation that every template shares. A request phrased unlike any training prompt then
reads as whatever those pieces meant in training (a tiny tokenizer cuts a new word into letters,
and in the embedded benchmark letters are what vague tool requests are made of). SIF weighs each
token by a / (a + p(token)), p its frequency in the training prompts' pooled windows, so the rare,
telling tokens carry the mean, then removes the pooled vectors' common direction (their first
singular vector), which every prompt shares and which carries no label.

A token that never occurs in the training windows has p = 0, so plain SIF gives it the full weight
1, though the router head never read it in training (a tiny tokenizer cuts a held-out phrasing's
new words into such pieces): ``unseen_weight`` sets what it weighs instead. At 0 a prompt pools
over the tokens training gave the head, and a window of unseen tokens only pools to zero.
"""

from __future__ import annotations

import torch

__all__ = ["common_component", "remove_component", "sif_token_weights", "tail_mask", "token_counts"]


def tail_mask(attention_mask: torch.Tensor, tail_tokens: int) -> torch.Tensor:
    """[B, L] 1 on the last ``tail_tokens`` real tokens of each row (left or right padding)."""
    mask = attention_mask.to(torch.float32)
    from_end = mask.flip(-1).cumsum(-1).flip(-1)  # 1 on the last real token, 2 before it, ...
    return mask * (from_end <= tail_tokens).to(mask.dtype)


def token_counts(prompt_ids: list[list[int]], vocab_size: int, tail_tokens: int) -> torch.Tensor:
    """[V] float64: how often each token id occurs in the last ``tail_tokens`` ids of the prompts.

    Raises ValueError on an id outside [0, vocab_size), naming the prompt."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for i, ids in enumerate(prompt_ids):
        window = torch.as_tensor(list(ids)[-tail_tokens:] if tail_tokens > 0 else [], dtype=torch.long)
        if window.numel() and (int(window.min()) < 0 or int(window.max()) >= vocab_size):
            raise ValueError(f"prompt {i}: token id outside [0, {vocab_size}) in {window.tolist()}")
        counts += torch.bincount(window, minlength=vocab_size).to(torch.float64)
    return counts


def sif_token_weights(counts: torch.Tensor, a: float, unseen_weight: float = 1.0) -> torch.Tensor:
    """counts [V] -> weights [V] = a / (a + p), p = counts / counts.sum(); a token with count 0
    weighs ``unseen_weight`` (1.0: plain SIF's a / (a + 0)).

    Raises ValueError unless a > 0, unseen_weight >= 0 and some count is positive."""
    if not a > 0:
        raise ValueError(f"SIF weight parameter a must be > 0, got {a}")
    if not unseen_weight >= 0:
        raise ValueError(f"SIF unseen_weight must be >= 0, got {unseen_weight}")
    total = float(counts.sum())
    if not total > 0:
        raise ValueError("SIF weights need token counts: every count is 0")
    weight = a / (a + counts / total)
    return torch.where(counts > 0, weight, torch.full_like(weight, unseen_weight))


def common_component(pooled: torch.Tensor) -> torch.Tensor:
    """pooled [N, H] -> [H] the unit first right singular vector of the (uncentred) rows, its sign
    fixed so that its largest-magnitude entry is positive (the same vector on every call)."""
    if pooled.ndim != 2 or pooled.shape[0] == 0:
        raise ValueError(f"common_component needs [N>0, H] rows, got {tuple(pooled.shape)}")
    u = torch.linalg.svd(pooled.double(), full_matrices=False).Vh[0]
    return (u * torch.sign(u[u.abs().argmax()])).to(pooled.dtype)


def remove_component(x: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """x [B, H] minus its projection on u [H] (a unit vector, or zeros: x unchanged)."""
    u = u.to(x.dtype)
    return x - (x @ u)[:, None] * u
