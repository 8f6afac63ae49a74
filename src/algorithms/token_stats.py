"""Token log-probs and entropy of softmax(logits / T), computed in row chunks with a hand-written backward.

Why: the plain autograd formula (divide, logsumexp, gather, softmax, multiply, sum) writes half a
dozen [B, T, V] temporaries and keeps several for the backward. With V = 8k-150k words these are
the largest tensors of a training step (16 × 256 × 8192 fp32 = 134 MB each), and on CPU the step
spends more time streaming them through memory (and faulting their pages in) than in the LM
head's matmul. Here the forward walks the flattened rows in chunks that stay in cache and keeps
only two floats per token (log Z and the entropy); the backward recomputes each chunk's
probabilities from the logits and writes the logits' gradient once.

Gradients, with x = logits / T, p = softmax(x), log p = x - log Z, H = -Σ p log p and upstream
grads g_lp (of log p_y) and g_H (of H):

    ∂ log p_y / ∂x_k = δ_yk - p_k
    ∂ H / ∂x_k       = -p_k (log p_k + H)
    ∂ L / ∂logits_k  = (g_lp δ_yk - p_k (g_lp + g_H (log p_k + H))) / T
"""

from __future__ import annotations

import torch

__all__ = ["token_log_probs_and_entropy"]

# Elements of one fp32 chunk: on CPU ~4 MB, small enough to stay in cache across the few
# elementwise passes of a chunk and large enough that per-op dispatch stays negligible; on a GPU
# chunks only bound the temporaries' memory.
CPU_CHUNK_ELEMENTS = 1 << 20
GPU_CHUNK_ELEMENTS = 1 << 27


def _chunks(logits: torch.Tensor):
    """(batch slice, time slice) pieces of [B, T, V] logits of about one chunk's elements each."""
    b, t, v = logits.shape
    budget = CPU_CHUNK_ELEMENTS if logits.device.type == "cpu" else GPU_CHUNK_ELEMENTS
    rows = max(1, budget // max(v, 1))
    if rows >= t:  # whole sequences per chunk
        per = rows // t
        for b0 in range(0, b, per):
            yield slice(b0, b0 + per), slice(None)
    else:
        for b0 in range(b):
            for t0 in range(0, t, rows):
                yield slice(b0, b0 + 1), slice(t0, t0 + rows)


class _LogProbEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits, targets, inv_temp):
        """logits [B, T, V] (any float dtype, any strides), targets [B, T] long, inv_temp [B] fp32
        -> (log-probs [B, T], entropy [B, T]) fp32."""
        shape = logits.shape[:2]
        log_z = torch.empty(shape, dtype=torch.float32, device=logits.device)
        entropy, picked = torch.empty_like(log_z), torch.empty_like(log_z)
        for bs, ts in _chunks(logits):
            x = logits[bs, ts].float() * inv_temp[bs, None, None]  # a fresh tensor: safe to modify
            lz = torch.logsumexp(x, dim=-1)
            picked[bs, ts] = x.gather(-1, targets[bs, ts, None]).squeeze(-1)
            entropy[bs, ts] = lz - ((x - lz[..., None]).exp_() * x).sum(-1)  # log Z - Σ p x
            log_z[bs, ts] = lz
        ctx.save_for_backward(logits, targets, inv_temp, log_z, entropy)
        return picked - log_z, entropy

    @staticmethod
    def backward(ctx, grad_logp, grad_entropy):
        logits, targets, inv_temp, log_z, entropy = ctx.saved_tensors
        grad = torch.empty(logits.shape, dtype=logits.dtype, device=logits.device)
        g_lp, g_h = grad_logp.float(), grad_entropy.float()
        for bs, ts in _chunks(logits):
            t = logits[bs, ts].float() * inv_temp[bs, None, None]
            t.sub_(log_z[bs, ts, None])  # log p
            p = t.exp()
            # -p (g_lp + g_H (log p + H)) + g_lp δ_y, then the chain rule through x = logits / T
            t.add_(entropy[bs, ts, None]).mul_(g_h[bs, ts, None]).add_(g_lp[bs, ts, None]).mul_(p).neg_()
            t.scatter_add_(-1, targets[bs, ts, None], g_lp[bs, ts, None])
            grad[bs, ts] = t.mul_(inv_temp[bs, None, None])
        return grad, None, None


def token_log_probs_and_entropy(
    logits: torch.Tensor, targets: torch.Tensor, temperature: torch.Tensor | float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-prob of ``targets`` and the full-distribution entropy at each position, of softmax(logits / T).

    Args:
        logits: [B, T, V] (already aligned: logits[:, t] predict targets[:, t]); any float dtype,
            computed in float32 chunk by chunk.
        targets: [B, T] long.
        temperature: None (1), a float, or [B] per-row sampling temperatures; must be > 0.
    Returns:
        (log_probs [B, T], entropy [B, T]) in float32, differentiable w.r.t. ``logits``.
    """
    inv = _inverse_temperatures(temperature, logits.shape[0], logits.device)
    return _LogProbEntropy.apply(logits, targets.long(), inv)


def _inverse_temperatures(temperature, rows: int, device) -> torch.Tensor:
    """[rows] fp32 1 / T from None, a float or [rows] temperatures; refuses T <= 0."""
    temp = torch.as_tensor(1.0 if temperature is None else temperature, dtype=torch.float32).to(device)
    if bool((temp <= 0).any()):
        raise ValueError("token_log_probs_and_entropy: temperatures must be > 0")
    return (1.0 / temp).expand(rows).contiguous()
