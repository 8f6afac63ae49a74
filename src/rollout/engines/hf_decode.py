"""A lean decode loop around the model's forward (``rollout.engines.hf.decode: loop``) or around
``hf_lean.LeanStep`` (``decode: lean``: the same loop, each decode step through a lean Llama / Qwen2
forward on the module's own weights that reads a prompt's cache once per group).

On small models and on CPU, ``generate`` is bound by its per-step machinery, not by the model: a
dynamic KV cache that grows by concatenation (every step copies the whole cache), the logits
processors and stopping criteria, ``torch.multinomial`` over the vocabulary, and a host sync per
step. This loop keeps the model's forward and replaces the rest:

- each prompt is prefilled once into a pre-allocated (static) cache that is then repeated to its n
  samples; decoding writes one slot per step in place;
- the sampling distribution (temperature, top-p, stop tokens suppressed before ``min_new_tokens``)
  is built once per step on the whole [N, V] batch, its log-prob of the drawn token kept as drawn;
- drawing is by inverse CDF (one uniform per row against the cumulative probabilities): the same
  distribution as ``multinomial``, far less work than it on CPU; the uniforms come from each row's
  own keyed stream when the caller gives them (``DecodeStep.uniforms``: a prompt then draws the
  same tokens in any batch, on any rank), else from torch's default generator;
- the only host sync is the "all rows stopped?" check, every ``stop_check_every`` steps.

Nothing per step scales with the group size in Python; rows that stopped keep decoding padding
until the check (their outputs are masked, as ``generate`` masks its own).

The sampling distribution's log-probs (temperature, then nucleus top-p; ``warped_log_probs``,
``sampling_log_probs``) are pure tensor math, shared by every HF decoder. ``sample_at`` is
``DecodeStep.sample`` in fixed shapes with its uniforms given (the same ops, so the same tokens and
log-probs bit for bit): with ``LeanMode.compile`` it runs inside the compiled lean step
(``SampledStep``), its uniforms still drawn outside (``DecodeStep.uniform``), one call per sampled
step, so one seed draws the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from src.config.sampling import SamplingParams


def warped_log_probs(logits: torch.Tensor, temperature: float, top_p: float) -> torch.Tensor:
    """Log-probs of the distribution sampled from: softmax(logits / temperature) cut to the nucleus.

    Args:
        logits: [..., V] raw scores; temperature > 0; top_p in (0, 1].
    Returns:
        [..., V] float32 log-probs, -inf outside the nucleus (the smallest set of most likely tokens
        whose mass reaches top_p, the token crossing it included), renormalised over it.
    """
    logp = torch.log_softmax(logits.float() / temperature, dim=-1)
    if top_p >= 1.0:
        return logp
    sorted_lp, order = logp.sort(dim=-1, descending=True)
    probs = sorted_lp.exp()
    drop_sorted = (cumsum_last(probs) - probs) >= top_p
    drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
    return torch.log_softmax(logp.masked_fill(drop, float("-inf")), dim=-1)


@torch.library.custom_op("toolrouter::cumsum_last", mutates_args=())
def cumsum_last(x: torch.Tensor) -> torch.Tensor:
    """``x.cumsum(-1)``, opaque to ``torch.compile``: a compiled sampler (``lean_compile``) calls
    ATen's kernel, as the eager one does (the same values). Inductor's own Triton scan of a
    [64, 8192] fp32 row block (its split scan) fails to build on torch 2.11 (docs/benchmarks.md)."""
    return x.cumsum(-1)


@cumsum_last.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def sampling_log_probs(
    logits: torch.Tensor, tokens: torch.Tensor, temperature: float, top_p: float
) -> torch.Tensor:
    """Log-prob of ``tokens`` under the sampling distribution.

    Args:
        logits: [N, T, V] raw model logits aligned with tokens; tokens: [N, T].
    Returns:
        [N, T]; greedy decoding (temperature <= 0) gives 0 (probability 1).
    """
    if temperature <= 0:
        return torch.zeros(tokens.shape, dtype=torch.float32, device=tokens.device)
    logp = warped_log_probs(logits, temperature, top_p)
    return logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def positions(attention_mask: torch.Tensor) -> torch.Tensor:
    """Position ids of left-padded rows: 0 at each row's first real token. [B, T] -> [B, T]."""
    return (attention_mask.cumsum(-1) - 1).clamp(min=0)


def draw(log_probs: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """[N, V] log-probs (-inf allowed) -> [N] one token per row drawn from exp(log_probs).

    Inverse CDF: the first token whose cumulative probability exceeds u * total (u uniform in
    [0, 1)); tokens of probability 0 are never drawn (their cumulative value equals the one before).
    """
    u = torch.rand((log_probs.shape[0], 1), device=log_probs.device, generator=generator)
    return inverse_cdf_at(log_probs, u)[0]


def inverse_cdf_at(log_weights: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse-CDF pick at given uniforms: unnormalised log-weights [N, V], u [N, 1] in [0, 1)
    -> (tokens [N], the weights' totals [N, 1]). No random op: it can sit inside a graph."""
    cdf = cumsum_last(log_weights.exp())
    total = cdf[:, -1:]
    return torch.searchsorted(cdf, u * total, right=True).squeeze(-1).clamp_(max=cdf.shape[-1] - 1), total


def sample_at(
    logits: torch.Tensor, u: torch.Tensor, suppress: torch.Tensor, temperature: float, top_p: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """``DecodeStep.sample`` in fixed shapes, its uniforms drawn by the caller: the same ops on the
    same values, so the same tokens and log-probs bit for bit (the fused step's sampler).

    Args:
        logits: [N, V] raw scores (not modified); u: [N, 1] uniforms in [0, 1), the ones ``draw``
            would draw (not read when greedy); suppress: [V] bool, the tokens held off this step
            (the stop tokens before ``min_new_tokens``; all False after); temperature <= 0: greedy.
    Returns:
        (token [N], its log-prob under the sampling distribution [N]; zeros when greedy).
    """
    x = logits.float().masked_fill(suppress, float("-inf"))
    if temperature <= 0:
        return x.argmax(-1), x.new_zeros(x.shape[0])
    if top_p < 1.0:
        logp = warped_log_probs(x, temperature, top_p)
        tok = inverse_cdf_at(logp, u)[0]
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    if temperature != 1.0:  # -inf / temperature stays -inf: filling first gives the eager values
        x = x / temperature
    top = x.amax(-1, keepdim=True)
    tok, total = inverse_cdf_at(x - top, u)
    return tok, (x.gather(-1, tok[:, None]) - top - total.log()).squeeze(-1)


def _static_cache(model, max_len: int):
    from transformers import StaticCache

    return StaticCache(config=model.config, max_cache_len=max_len)


def _repeat_cache(cache, n: int) -> None:
    """Repeat each prompt's cached keys / values to its n sample rows (prompt-major)."""
    if n == 1:
        return
    for layer in cache.layers:
        layer.keys = layer.keys.repeat_interleave(n, 0)
        layer.values = layer.values.repeat_interleave(n, 0)
        layer.batch_size = layer.keys.shape[0]


class DecodeStep:
    """One decode step's rules: the model's logits -> the log-probs to sample from, the pick, the
    stop tokens and the padding after them.

    ``synced``: the weights are sharded (FSDP2, ZeRO-3), every forward is a collective, so the "all
    rows stopped" check is agreed across ranks (a rank that stopped alone would leave the others
    waiting in their next forward).
    """

    def __init__(
        self,
        sampling: SamplingParams,
        stop: list[int],
        pad_id: int,
        synced: bool,
        device=None,
        uniforms: torch.Tensor | None = None,
    ):
        self.sampling, self.pad_id, self.synced = sampling, pad_id, synced
        self.stop = torch.tensor(stop, dtype=torch.long, device=device)
        self.greedy = sampling.temperature <= 0
        self.uniforms = uniforms

    def uniform(self, t: int, rows: int, device) -> torch.Tensor:
        """[rows, 1] uniforms of step t's draw: column t of the rows' keyed streams (``uniforms``
        [rows, max_new_tokens], ``types.keyed_uniforms``), else ``torch.rand`` on the default generator."""
        if self.uniforms is not None:
            return self.uniforms[:, t : t + 1]
        return torch.rand((rows, 1), device=device)

    def log_probs(self, logits: torch.Tensor, t: int) -> torch.Tensor:
        logits = logits.float()
        if t < self.sampling.min_new_tokens and self.stop.numel():
            logits = logits.index_fill(-1, self.stop, float("-inf"))
        if self.greedy:
            return logits
        return warped_log_probs(logits, self.sampling.temperature, self.sampling.top_p)

    def pick(self, logp: torch.Tensor, t: int) -> torch.Tensor:
        if self.greedy:
            return logp.argmax(-1)
        return inverse_cdf_at(logp, self.uniform(t, logp.shape[0], logp.device))[0]

    def sample(self, logits: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(token [N], its log-prob under the sampling distribution [N]; None when greedy) of step t.

        ``logits`` [N, V] is this step's own tensor and may be overwritten. Without a nucleus cut the
        draw skips the [N, V] log-softmax: the inverse CDF runs on exp(x - max) (unnormalised, the
        uniform scaled by its total) and only the drawn token's log-prob is formed, x_tok - max -
        log(total); same draws as ``draw(log_probs(...))`` up to rounding.
        """
        if self.greedy or self.sampling.top_p < 1.0:
            logp = self.log_probs(logits, t)
            tok = self.pick(logp, t)
            return tok, (None if self.greedy else logp.gather(-1, tok[:, None]).squeeze(-1))
        x = logits.float()
        if self.sampling.temperature != 1.0:
            x = x / self.sampling.temperature
        if t < self.sampling.min_new_tokens and self.stop.numel():
            x.index_fill_(-1, self.stop, float("-inf"))
        top = x.amax(-1, keepdim=True)
        tok, total = inverse_cdf_at(x - top, self.uniform(t, x.shape[0], x.device))
        return tok, (x.gather(-1, tok[:, None]) - top - total.log()).squeeze(-1)

    def all_stopped(self, done: torch.Tensor) -> bool:
        """The loop's one host sync (every few steps)."""
        running = (~done).any().to(torch.int32)
        if self.synced:
            import torch.distributed as dist

            dist.all_reduce(running, op=dist.ReduceOp.MAX)
        return not bool(running)


@dataclass(frozen=True)
class LeanMode:
    """How ``decode`` runs the lean step (``hf_lean``; the caller checked the model is supported).

    cuda_graph: each step replays one CUDA graph of the fixed-shape lean step (``hf_lean.GraphedStep``;
        the model on a CUDA device). compile: the fixed-shape step and the sampler as one function
        (``SampledStep``) compiled by ``torch.compile`` (``hf_lean.compiled``), captured as that graph
        with ``cuda_graph``.
    """

    cuda_graph: bool = False
    compile: bool = False


@torch.no_grad()
def decode(
    model, ids: torch.Tensor, attn: torch.Tensor, n: int, step: DecodeStep, lean: LeanMode | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample ``n`` continuations of each left-padded prompt.

    Args:
        ids, attn: [P, L] left-padded prompts and their mask.
        lean: decode steps through ``hf_lean.LeanStep`` run as it says, instead of the model's forward.
    Returns:
        (tokens [P*n, T'], log_probs [P*n, T']) prompt-major, T' <= max_new_tokens (the loop ends
        once every row has stopped); after a row's stop token: ``step.pad_id`` and log-prob 0. Greedy
        decoding records log-prob 0 (probability 1).
    """
    rows, device, sample = _sampler(model, ids, attn, n, step, lean)
    return _loop(sample, rows, device, step)


def _sampler(model, ids: torch.Tensor, attn: torch.Tensor, n: int, step: DecodeStep, lean: LeanMode | None):
    """(rows, their device, ``sample(tokens, t)`` of :func:`_loop`) as ``decode``'s ``lean`` says
    (the prefill's logits are held by ``sample`` alone, released after step 0)."""
    t_max = step.sampling.max_new_tokens
    if lean is not None and lean.compile:
        logits, sample = fused_sampler(model, ids, attn, n, step, cuda_graph=lean.cuda_graph)
        return logits.shape[0], logits.device, sample
    if lean is not None:
        logits, forward = lean_stepper(model, ids, attn, n, t_max, cuda_graph=lean.cuda_graph)
    else:
        logits, forward = hf_stepper(model, ids, attn, n, t_max)
    return logits.shape[0], logits.device, eager_sampler(forward, logits, step)


def hf_stepper(model, ids: torch.Tensor, attn: torch.Tensor, n: int, t_max: int):
    """Prefill into a static cache repeated to the n samples -> (logits [P*n, V] of the last prompt
    position, ``forward(tokens [P*n], j) -> logits [P*n, V]`` of generated slot j through the model)."""
    p, width = ids.shape
    cache = _static_cache(model, width + t_max)
    logits = _prefill(model, ids, attn, cache)
    _repeat_cache(cache, n)
    mask = torch.zeros((p * n, width + t_max), dtype=attn.dtype, device=ids.device)
    mask[:, :width] = attn.repeat_interleave(n, 0)
    position = attn.sum(-1).repeat_interleave(n, 0)

    def forward(tokens: torch.Tensor, j: int) -> torch.Tensor:
        mask[:, width + j] = 1
        return model(
            input_ids=tokens[:, None],
            attention_mask=mask,
            position_ids=(position + j)[:, None],
            past_key_values=cache,
            use_cache=True,
        ).logits[:, -1]

    return logits.repeat_interleave(n, 0), forward


def lean_stepper(model, ids: torch.Tensor, attn: torch.Tensor, n: int, t_max: int, cuda_graph: bool = False):
    """As :func:`hf_stepper`, the prefill through the model once per prompt (its cache kept once per
    prompt), the decode steps through ``hf_lean.LeanStep`` (``cuda_graph``: its fixed-shape form,
    replayed as one CUDA graph, ``hf_lean.GraphedStep``)."""
    from src.rollout.engines.hf_lean import GraphedStep

    logits, lean = _lean_prefill(model, ids, attn, n, t_max, fixed_shape=cuda_graph)
    if not cuda_graph:
        return logits, lean
    return logits, GraphedStep(lean, ids.shape[0] * n, ids.device)


def _lean_prefill(model, ids: torch.Tensor, attn: torch.Tensor, n: int, t_max: int, fixed_shape: bool):
    """The prompts' prefill -> (logits [P*n, V] of their last position, the ``hf_lean.LeanStep`` on it)."""
    from transformers import DynamicCache

    from src.rollout.engines.hf_lean import LeanStep

    cache = DynamicCache()
    logits = _prefill(model, ids, attn, cache)
    return logits.repeat_interleave(n, 0), LeanStep(model, cache, attn, n, t_max, fixed_shape=fixed_shape)


class SampledStep:
    """``step(tokens [rows], j, u [rows, 1]) -> (token [rows], log-prob [rows])`` of generated slot
    j + 1: the fixed-shape lean step (j a 0-dim device tensor) and :func:`sample_at` as one function
    of fixed shapes, so one compiled / captured graph holds the model step and the sampler. ``u``:
    the uniforms of the step's draw, drawn outside (no random op inside a graph)."""

    def __init__(self, fixed_step, step: DecodeStep, vocab: int):
        self.fixed_step = fixed_step
        self.temperature, self.top_p = step.sampling.temperature, step.sampling.top_p
        self.min_new_tokens = step.sampling.min_new_tokens
        self.stop_mask = torch.zeros(vocab, dtype=torch.bool, device=step.stop.device)
        self.stop_mask[step.stop] = True

    def __call__(self, tokens: torch.Tensor, j: torch.Tensor, u: torch.Tensor):
        logits = self.fixed_step(tokens, j)
        # the stop tokens are held off while slot j + 1 < min_new_tokens (DecodeStep.log_probs)
        suppress = self.stop_mask & (j + 1 < self.min_new_tokens)
        return sample_at(logits, u, suppress, self.temperature, self.top_p)


def fused_sampler(model, ids: torch.Tensor, attn: torch.Tensor, n: int, step: DecodeStep, cuda_graph: bool):
    """(the prefill's logits [P*n, V], ``sample(tokens, t) -> (token, log-prob)`` of step t) for
    :func:`_loop` (``LeanMode.compile``):
    step 0 by ``step.sample`` on the prefill's logits, then each step by the compiled
    ``SampledStep`` (``cuda_graph``: replayed as one CUDA graph). Each step's uniforms are drawn as
    ``DecodeStep.uniform`` gives them (keyed streams, or ``torch.rand`` [rows, 1] on the default
    generator, one call per sampled step, none when greedy), so one seed gives the eager loop's tokens."""
    from src.rollout.engines.hf_lean import GraphedStep, compiled

    logits, fixed = _lean_prefill(model, ids, attn, n, step.sampling.max_new_tokens, fixed_shape=True)
    rows, device = logits.shape[0], logits.device
    fused = compiled(SampledStep(fixed, step, logits.shape[-1]))
    if cuda_graph:
        fused = GraphedStep(fused, rows, device, uniform=True)
    else:
        fused = _with_slot_tensor(fused, device)
    no_draw = torch.zeros((rows, 1), device=device)
    first = [logits]

    def sample(tokens: torch.Tensor | None, t: int):
        if t == 0:
            return step.sample(first.pop(), 0)
        u = no_draw if step.greedy else step.uniform(t, rows, device)
        return fused(tokens, t - 1, u)

    return logits, sample


def _with_slot_tensor(fused, device):
    """``fused(tokens, j: int, u)`` -> ``fused(tokens, j as a 0-dim device tensor, u)``."""
    slot = torch.zeros((), dtype=torch.long, device=device)

    def call(tokens: torch.Tensor, j: int, u: torch.Tensor):
        return fused(tokens, slot.fill_(j), u)

    return call


def eager_sampler(forward, logits: torch.Tensor, step: DecodeStep):
    """``sample(tokens, t) -> (token, log-prob or None)`` of step t for :func:`_loop`: step t's logits
    (the prefill's at t = 0, ``forward(tokens, t - 1)`` after) through ``step.sample``."""

    first = [logits]

    def sample(tokens: torch.Tensor | None, t: int):
        return step.sample(first.pop() if t == 0 else forward(tokens, t - 1), t)

    return sample


def _prefill(model, ids: torch.Tensor, attn: torch.Tensor, cache) -> torch.Tensor:
    """The prompts [P, W] through the model into ``cache``; logits [P, V] of their last position."""
    return model(
        input_ids=ids,
        attention_mask=attn,
        position_ids=positions(attn),
        past_key_values=cache,
        use_cache=True,
        logits_to_keep=1,
    ).logits[:, -1]


def _loop(sample, rows: int, device: torch.device, step: DecodeStep, stop_check_every: int = 8):
    """The decode loop around ``sample(tokens of step t - 1, t) -> (tokens [rows], log-probs [rows]
    or None)`` of step t (:func:`eager_sampler`, :func:`fused_sampler`); see :func:`decode`."""
    pad_id, t_max = step.pad_id, step.sampling.max_new_tokens
    tokens = torch.full((rows, t_max), pad_id, dtype=torch.long, device=device)
    log_probs = torch.zeros((rows, t_max), dtype=torch.float32, device=device)
    done = torch.zeros(rows, dtype=torch.bool, device=device)
    running = torch.zeros(t_max, dtype=torch.bool, device=device)  # any row still running at step t
    tok, t = None, 0
    while t < t_max:
        running[t] = ~done.all()
        tok, logp = sample(tok, t)
        if logp is not None:
            log_probs[:, t] = logp.masked_fill_(done, 0.0)
        tok = tok.masked_fill_(done, pad_id)
        tokens[:, t] = tok
        done |= torch.isin(tok, step.stop)
        t += 1
        if t == t_max or (t % stop_check_every == 0 and step.all_stopped(done)):
            break
    # the steps some row of this rank still needed (fewer than t when the check came late, or when
    # sharded ranks kept stepping for the others)
    t = int(running.sum())
    return tokens[:, :t], log_probs[:, :t]
