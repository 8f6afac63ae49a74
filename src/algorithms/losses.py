"""The losses, pure tensor functions: token log-probs / entropy, KL estimators, the router loss, the
policy losses and their aggregation, the rollout / trainer mismatch correction; plus the tiny name ->
function registries that let configs pick them by name and the coefficient schedules.
Shapes: B sequences, T response tokens.

**Token log-probs and entropy** of softmax(logits / T), computed in row chunks with a hand-written backward.

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

**Loss aggregation**: how per-token losses [B, T] become one scalar, picked by name.

A mode is a per-row value (how a row's masked tokens combine) and a unit (what the sum over rows
is divided by). The divisor is a *normaliser* computed once over the whole minibatch and handed to
every micro-batch, so micro-batched gradients add up to exactly the one-batch gradient:

==========================  ====================================  ===================
mode                        row value                             normaliser
==========================  ====================================  ===================
token-mean                  Σ_t l·m                               Σ m (all tokens)
seq-mean-token-sum          Σ_t l·m                               non-empty rows
seq-mean-token-mean         Σ_t l·m / Σ_t m                       non-empty rows
seq-mean-token-sum-norm     Σ_t l·m / L  (Dr.GRPO)                non-empty rows
==========================  ====================================  ===================

L is ``norm_len`` (``algorithm.loss_agg_norm_len``) or the response width T. Rows without a
response token add nothing and are not counted.

**Policy losses**: per-token surrogate losses, picked by name.

Signature: ``fn(log_probs, old_log_probs, advantages, mask, **params) -> PolicyLossOutput``, all
inputs [B, T] (``mask`` 1 on trained tokens); the output's tensors are [B, T] and 0 off the mask.
Aggregation to a scalar is separate (``src.algorithms.losses``).

**Rollout / trainer mismatch**: how far the engine's sampling log-probs are from the trainer's for the
same tokens, and the truncated importance-sampling (TIS) weights that correct the policy loss for it.

An inference engine (vLLM: other kernels, other precision) samples from pi_rollout, not exactly from
the trainer's pi_train at the same weights. The policy-gradient estimate is then off-policy by
pi_train / pi_rollout; TIS multiplies each token's loss by min(pi_train / pi_rollout, C) (detached),
per token or once per sequence (the product of its tokens' ratios).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, NamedTuple, TypeVar

import torch

__all__ = [
    "KL_ESTIMATORS",
    "SUPERVISED_TERMS",
    "router_loss",
    "token_log_probs_and_entropy",
]

F = TypeVar("F", bound=Callable)


class Registry(Generic[F]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, F] = {}

    def register(self, name: str) -> Callable[[F], F]:
        def decorator(fn: F) -> F:
            if name in self._items:
                raise KeyError(f"{self.kind} {name!r} is already registered")
            self._items[name] = fn
            return fn

        return decorator

    def get(self, name: str) -> F:
        try:
            return self._items[name]
        except KeyError:
            raise KeyError(f"unknown {self.kind} {name!r}; known: {sorted(self._items)}") from None

    def names(self) -> list[str]:
        return sorted(self._items)


def linear_decay(step: int, start: float, end: float | None, decay_steps: int) -> float:
    """``start`` at step 0, straight down (or up) to ``end`` at ``decay_steps``, then ``end``.

    ``end=None`` or ``decay_steps<=0`` keeps ``start`` for the whole run.
    Args: step: optimizer steps taken (>= 0).
    """
    if end is None or decay_steps <= 0:
        return start
    frac = min(max(step, 0) / decay_steps, 1.0)
    return start + (end - start) * frac


def ema_warmup_decay(updates: int, decay: float) -> float:
    """An exponential moving average's decay at its ``updates``-th update (0-based):
    min(decay, (1 + t) / (10 + t)), so the first updates follow the averaged weights closely and the
    average is not held at their initial values.
    Args: updates: updates made so far (>= 0); decay: the final decay in [0, 1).
    """
    return min(float(decay), (1 + updates) / (10 + updates))


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


KL_ESTIMATORS: Registry = Registry("KL estimator")


@KL_ESTIMATORS.register("k1")
def kl_k1(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """log π - log π_ref, per token. [B, T] -> [B, T]."""
    return log_probs - ref_log_probs


@KL_ESTIMATORS.register("k2")
def kl_k2(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """½ (log π - log π_ref)², per token."""
    return 0.5 * (log_probs - ref_log_probs).square()


@KL_ESTIMATORS.register("k3")
def kl_k3(log_probs: torch.Tensor, ref_log_probs: torch.Tensor) -> torch.Tensor:
    """Schulman's k3: exp(ref - logp) - (ref - logp) - 1, clamped to [-10, 10] as in verl."""
    delta = torch.clamp(ref_log_probs - log_probs, -20.0, 20.0)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -10.0, 10.0)


KL_ESTIMATORS.register("low_var_kl")(kl_k3)


SupervisedTermFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
SUPERVISED_TERMS: Registry[SupervisedTermFn] = Registry("router supervised term")


@SUPERVISED_TERMS.register("route")
def route_cross_entropy(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean CE of the weak label over the three routes, on labelled rows.

    Args:
        log_probs: [N, 3] log π(route) (ANSWER, SEARCH, CALCULATE).
        targets: [N] long weak labels, -1 where there is none (MIXED or unlabelled).
    Returns:
        scalar; 0 where no row is labelled. A tool-labelled row pulls toward a tool, against λ.
    """
    labelled = targets >= 0
    if not bool(labelled.any()):
        return log_probs.new_zeros(())
    return torch.nn.functional.nll_loss(log_probs[labelled], targets[labelled])


@SUPERVISED_TERMS.register("family")
def family_cross_entropy(log_probs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean CE of the weak label between the two tool families, on tool-labelled rows.

    Only the family's share of the tool mass, log π(f) − log(π(S) + π(C)), is supervised: the
    term reads the two family logits' difference alone and leaves the answer logit untouched, so
    which family a tool route takes is learned from the label and whether to take one from
    r_task − λ·cost.

    Args:
        log_probs: [N, 3] log π(route) (ANSWER, SEARCH, CALCULATE).
        targets: [N] long weak labels (0 ANSWER, 1 SEARCH, 2 CALCULATE, -1 none).
    Returns:
        scalar; 0 where no row is tool-labelled.
    """
    tool = targets >= 1
    if not bool(tool.any()):
        return log_probs.new_zeros(())
    family = torch.log_softmax(log_probs[tool, 1:], dim=-1)  # log π(f) − log(π(S) + π(C))
    return torch.nn.functional.nll_loss(family, targets[tool] - 1)


def router_loss(
    logits: torch.Tensor,
    actions: torch.Tensor,
    advantages: torch.Tensor,
    entropy_coef: float = 0.0,
    sup_coef: float = 0.0,
    sup_targets: torch.Tensor | None = None,
    sup_term: str = "route",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """L = -mean(log π(a)·A) - c_H·mean(H(π)) + c_sup·CE(π, target) over labelled rows.

    Args:
        logits: [N, 3] router logits, one row per rollout (copies of a prompt repeat its logits).
        actions: [N] long, the sampled routes.
        advantages: [N] the router's advantages (``router.advantage``: of r_router, or per reward term).
        sup_targets: [N] long weak labels, -1 where there is none (MIXED or unlabelled).
        sup_term: ``SUPERVISED_TERMS`` name: "route" (CE over the three routes) or "family" (CE
            between the two tool families, tool-labelled rows only).
    Returns:
        (scalar loss, parts dict with pg, entropy, ce).
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    chosen = log_probs.gather(-1, actions[:, None]).squeeze(-1)
    pg = -(chosen * advantages.float()).mean()
    entropy = -(log_probs.exp() * log_probs).sum(-1).mean()
    ce = log_probs.new_zeros(())
    if sup_targets is not None:
        ce = SUPERVISED_TERMS.get(sup_term)(log_probs, sup_targets)
    loss = pg - entropy_coef * entropy + sup_coef * ce
    return loss, {"pg": pg.detach(), "entropy": entropy.detach(), "ce": ce.detach()}


RowValueFn = Callable[[torch.Tensor, torch.Tensor, float], torch.Tensor]
UNITS = ("tokens", "rows")


@dataclass(frozen=True)
class AggregationMode:
    """row_value(loss [B, T], mask [B, T], norm_len) -> [B]; unit: "tokens" | "rows"."""

    row_value: RowValueFn
    unit: str


LOSS_AGG: Registry[AggregationMode] = Registry("loss aggregation mode")


def register_aggregation(name: str, unit: str) -> Callable[[RowValueFn], RowValueFn]:
    """Register ``row_value`` under ``name``, divided by a normaliser counted in ``unit``."""
    if unit not in UNITS:
        raise ValueError(f"aggregation unit must be one of {UNITS}, got {unit!r}")

    def decorator(fn: RowValueFn) -> RowValueFn:
        LOSS_AGG.register(name)(AggregationMode(fn, unit))
        return fn

    return decorator


@register_aggregation("token-mean", "tokens")
def _token_sum(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1)


register_aggregation("seq-mean-token-sum", "rows")(_token_sum)


@register_aggregation("seq-mean-token-mean", "rows")
def _token_mean(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1) / mask.sum(-1).clamp(min=1)


@register_aggregation("seq-mean-token-sum-norm", "rows")
def _token_sum_norm(loss: torch.Tensor, mask: torch.Tensor, norm_len: float) -> torch.Tensor:
    return (loss * mask).sum(-1) / norm_len


def normaliser(mask: torch.Tensor, mode: str) -> torch.Tensor:
    """The divisor of ``mode`` over a whole minibatch: its token count or its non-empty rows. >= 1.

    mask [B, T] -> scalar float tensor.
    """
    mask = mask.float()
    if LOSS_AGG.get(mode).unit == "tokens":
        count = mask.sum()
    else:
        count = (mask.sum(-1) > 0).float().sum()
    return count.clamp(min=1)


def aggregate(
    loss: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    norm: torch.Tensor | float | None = None,
    norm_len: float | None = None,
) -> torch.Tensor:
    """Σ_rows row_value / norm. loss, mask [B, T] -> scalar.

    ``norm`` defaults to ``normaliser(mask, mode)`` (this batch alone); pass the minibatch's to
    aggregate a micro-batch. ``norm_len`` defaults to T.
    """
    spec = LOSS_AGG.get(mode)
    mask = mask.to(loss.dtype)
    norm = normaliser(mask, mode) if norm is None else norm
    length = float(norm_len) if norm_len else float(loss.shape[-1])
    return spec.row_value(loss, mask, length).sum() / norm


class PolicyLossOutput(NamedTuple):
    """loss [B, T]; clipped [B, T] float, 1 where a clip bound is active; ratio [B, T] detached."""

    loss: torch.Tensor
    clipped: torch.Tensor
    ratio: torch.Tensor


PolicyLossFn = Callable[..., PolicyLossOutput]
POLICY_LOSSES: Registry[PolicyLossFn] = Registry("policy loss")
register_policy_loss = POLICY_LOSSES.register
get_policy_loss = POLICY_LOSSES.get


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """max(-A·r, -A·clip(r, 1 - low, 1 + high)) and where the clipped branch is the larger."""
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(unclipped, clipped), clipped > unclipped


@dataclass(frozen=True)
class PPOClip:
    """PPO clip settings (built by ``build_loss_module`` from ``algorithm.clip_ratio_low/high``,
    ``clip_ratio_c``, ``log_ratio_clamp``).

    clip_low / clip_high: the ratio is clipped to [1 - clip_low, 1 + clip_high].
    clip_ratio_c: dual-clip bound c > 1 for A < 0; None = off.
    log_ratio_clamp: |log π - log π_old| clamp before exp.
    """

    clip_low: float = 0.2
    clip_high: float = 0.2
    clip_ratio_c: float | None = None
    log_ratio_clamp: float = 20.0

    def __post_init__(self):
        if self.clip_ratio_c is not None and self.clip_ratio_c <= 1.0:
            raise ValueError(f"clip_ratio_c must be > 1, got {self.clip_ratio_c}")


@register_policy_loss("ppo_clip")
def ppo_clip_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip: PPOClip = PPOClip(),
) -> PolicyLossOutput:
    """PPO clipped surrogate per token, with optional dual clip. All inputs [B, T]; outputs [B, T].

    r = exp(clamp(log π - log π_old, ±log_ratio_clamp)) (the clamp keeps exp finite);
    loss = max(-A·r, -A·clip(r, 1 - clip_low, 1 + clip_high)); with dual clip (``clip_ratio_c``
    c > 1) where A < 0: loss = min(loss, -A·c), bounding the push on a very unlikely bad token.
    """
    log_ratio = torch.clamp(log_probs - old_log_probs, -clip.log_ratio_clamp, clip.log_ratio_clamp)
    ratio = torch.exp(log_ratio)
    loss, clipped = _clipped_surrogate(ratio, advantages, clip.clip_low, clip.clip_high)
    if clip.clip_ratio_c is not None:
        bound = -advantages * clip.clip_ratio_c
        dual = (advantages < 0) & (loss > bound)
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    mask = mask.to(loss.dtype)
    return PolicyLossOutput(loss * mask, clipped.to(loss.dtype) * mask, ratio.detach() * mask)


@register_policy_loss("gspo")
def gspo_loss(
    log_probs: torch.Tensor,
    old_log_probs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 3e-4,
    clip_high: float = 4e-4,
    log_ratio_clamp: float = 20.0,
) -> PolicyLossOutput:
    """GSPO (GSPO-token form): a sequence-level importance ratio with per-token gradients.

    s_i = exp(mean over row i's masked tokens of (log π - log π_old)) (the geometric mean of the
    token ratios); each token uses s_i,t = sg(s_i) · exp(log π_t - sg(log π_t)), equal to s_i in
    value, with the gradient of its own log-prob. loss = max(-A·s, -A·clip(s, 1 - low, 1 + high)).
    A row with no masked token has s = 1 and loss 0.
    """
    mask = mask.to(log_probs.dtype)
    seq_log_ratio = ((log_probs - old_log_probs) * mask).sum(-1) / mask.sum(-1).clamp(min=1)
    seq_log_ratio = torch.clamp(seq_log_ratio.detach(), -log_ratio_clamp, log_ratio_clamp)
    ratio = torch.exp(seq_log_ratio[:, None] + log_probs - log_probs.detach())
    loss, clipped = _clipped_surrogate(ratio, advantages, clip_low, clip_high)
    return PolicyLossOutput(loss * mask, clipped.to(loss.dtype) * mask, ratio.detach() * mask)


RolloutISFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, float], torch.Tensor]
ROLLOUT_IS: Registry[RolloutISFn] = Registry("rollout importance-sampling level")
# exp() of a log-ratio above this is already far past any sensible cap
_LOG_RATIO_CLAMP = 20.0


def logprob_abs_diff(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """|log pi_train - log pi_rollout| over the masked tokens.

    Args:
        train_log_probs, rollout_log_probs: [N, T] log-probs of the same tokens.
        mask: [N, T] 1 on response tokens.
    Returns:
        (sum over masked tokens [], max over masked tokens [] (0 with none), masked token count []).
        Sums and counts add up over micro-batches; the max combines with max.
    """
    m = mask.bool()
    diff = (train_log_probs.detach().float() - rollout_log_probs.float()).abs()
    masked = torch.where(m, diff, torch.zeros_like(diff))
    return masked.sum(), masked.max() if masked.numel() else masked.sum(), m.sum()


@ROLLOUT_IS.register("token")
def token_is_weights(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-token min(pi_train / pi_rollout, cap). [N, T] x3 -> [N, T] (detached; 0 off the mask)."""
    log_ratio = (train_log_probs.detach().float() - rollout_log_probs.float()).clamp(max=_LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap) * mask


@ROLLOUT_IS.register("sequence")
def sequence_is_weights(
    train_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, mask: torch.Tensor, cap: float
) -> torch.Tensor:
    """Per-sequence min(prod_t pi_train / pi_rollout, cap), on every token of the row.

    [N, T] x3 -> [N, T] (detached; 0 off the mask)."""
    diff = (train_log_probs.detach().float() - rollout_log_probs.float()) * mask
    log_ratio = diff.sum(-1, keepdim=True).clamp(max=_LOG_RATIO_CLAMP)
    return log_ratio.exp().clamp(max=cap) * mask


def rollout_is_weights(
    level: str | None,
    train_log_probs: torch.Tensor,
    rollout_log_probs: torch.Tensor,
    mask: torch.Tensor,
    cap: float,
) -> torch.Tensor | None:
    """The TIS weights [N, T] of ``level`` (``token`` | ``sequence``), or None when ``level`` is None."""
    if level is None:
        return None
    if cap <= 0:
        raise ValueError(f"algorithm.rollout_is_cap must be > 0, got {cap}")
    return ROLLOUT_IS.get(level)(train_log_probs, rollout_log_probs, mask, cap)
