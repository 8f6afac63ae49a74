"""Teacher-forced logits of responses with each shared prompt run once (pure torch + an HF causal LM).

A training batch holds G responses per prompt: ``[prompt | response]`` rows with the prompt
left-padded to P and the response right-padded to T. The plain forward runs all N = Σ G rows over
P + T tokens, so every prompt goes through the model G times. The shared forward runs each unique
prompt once with a ``DynamicCache``, gives every response its group's cache rows (a broadcast or an
index into the key/value tensors, so gradients flow back into the one prompt pass), then runs only
the response tokens on top of that cache. Where ``src.models.prompt_cache`` applies (Llama / Qwen2,
unsharded weights) the prompt pass skips the last layer's work that no response reads (everything
but its keys / values) and the prompt's last token joins the response pass.

Both return the logits that predict the T response tokens: position P - 1 (the last prompt token)
predicts response token 0, position P + t - 1 predicts response token t, i.e. the plain forward's
``model(..., logits_to_keep=T + 1).logits[:, :-1]``. The last response token is never an input
that another kept logit depends on, so the shared forward does not feed it.

The shared forward falls back to the plain one where it cannot apply or would not pay: no group
with more than one row, no prompt or response columns, gradient checkpointing in training (HF drops
the cache there), sliding-window layers, or a model that returns no cache.
"""

from __future__ import annotations

import logging

import torch

from src.models.prompt_cache import trim_reason, trimmed_prompt_cache

log = logging.getLogger(__name__)


def prompt_groups(input_ids: torch.Tensor, attention_mask: torch.Tensor, width: int) -> torch.Tensor:
    """Group index [N] (0..U-1) of each row: rows with the same prompt (P = L - width columns).

    input_ids, attention_mask: [N, L]. Prompts are compared on their attended tokens and their
    padding (ids under the mask are ignored), so rows of one group give identical prompt states.
    """
    prompt_len = input_ids.shape[1] - width
    if prompt_len <= 0:
        return torch.arange(input_ids.shape[0], device=input_ids.device)
    mask = attention_mask[:, :prompt_len].long()
    key = input_ids[:, :prompt_len].long().masked_fill(mask == 0, -1)
    return torch.unique(key, dim=0, return_inverse=True)[1]


def plain_response_logits(
    model, input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, width: int
) -> torch.Tensor:
    """The full forward over all rows. -> [N, width, V] logits predicting the response tokens."""
    out = model(
        input_ids=input_ids,
        attention_mask=attention_mask,
        position_ids=position_ids,
        logits_to_keep=width + 1,
    )
    return out.logits[:, :-1]


def _representatives(groups: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(first row of each group [U], group of each row as 0..U-1 [N]) for any group ids [N]."""
    _, inverse = torch.unique(groups, return_inverse=True)
    n, n_groups = groups.shape[0], int(inverse.max()) + 1
    rows = torch.arange(n, device=groups.device)
    first = torch.full((n_groups,), n, dtype=torch.long, device=groups.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")
    return first, inverse


def _checkpointing(model) -> bool:
    """Activation (gradient) checkpointing on: HF then drops the cache inside the layers."""
    flag = getattr(model, "is_activation_checkpointing", None)  # transformers >= 5.2
    if flag is None:
        flag = getattr(model, "is_gradient_checkpointing", False)
    return bool(flag)


def _uses_sliding_window(model) -> bool:
    config = getattr(model, "config", None)
    return "sliding_attention" in (getattr(config, "layer_types", None) or [])


def can_share(model, groups: torch.Tensor, prompt_len: int, width: int) -> bool:
    """Whether the shared forward applies and saves work (some group has two rows or more)."""
    if prompt_len <= 0 or width <= 0 or groups.numel() == 0:
        return False
    if model.training and _checkpointing(model):
        return False
    if _uses_sliding_window(model):
        return False
    return int(torch.unique(groups).numel()) < groups.shape[0]


def rows_of(t: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``t[index]`` along dim 0 ([U, ...] -> [N, ...]) with a backward that gives the same bits
    at any thread count's timing: ``index_select``'s backward (``index_add_``) sums a source row's
    gradients in index order, where ``t[index]``'s accumulating ``index_put_`` splits repeated
    indices across CPU threads in an order that varies from run to run (docs/benchmarks.md,
    "Threads"). At one thread the two give the same bits."""
    return torch.index_select(t, 0, index)


def _spread_cache(cache, inverse: torch.Tensor) -> None:
    """Give each row its group's prompt keys / values: [U, ...] -> [N, ...] in every layer.

    Rows in equal runs per group (the minibatches sort by group; GRPO groups are equal) take a
    broadcast, whose backward is a sum over the group's rows; otherwise a row select
    (:func:`rows_of`), whose backward adds each row's gradient into its group's in index order.
    """
    n_groups = int(inverse[-1]) + 1 if inverse.numel() else 0
    size = inverse.numel() // max(n_groups, 1)
    runs = torch.arange(n_groups, device=inverse.device).repeat_interleave(size)
    in_runs = size * n_groups == inverse.numel() and torch.equal(inverse, runs)
    from transformers.cache_utils import DynamicLayer

    for layer in cache.layers:
        if not in_runs and type(layer) is not DynamicLayer:
            layer.batch_select_indices(inverse)  # a layer with per-row state beyond keys / values
            continue
        for name in ("keys", "values"):
            t = getattr(layer, name)
            if in_runs:
                t = t[:, None].expand(t.shape[0], size, *t.shape[1:]).reshape(-1, *t.shape[1:])
            else:
                t = rows_of(t, inverse)
            setattr(layer, name, t)


def shared_prompt_logit_pieces(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    groups: torch.Tensor,
    width: int,
) -> list[torch.Tensor]:
    """Logits of the response tokens with each group's prompt processed once, in pieces along T.

    model: an HF causal LM (or a peft wrapper of one) that takes ``past_key_values`` / ``use_cache``.
    input_ids, attention_mask, position_ids: [N, P + T], prompts left-padded to P, responses
        right-padded to T = ``width``; position ids as the plain forward gets them.
    groups: [N] any ids; rows with equal ids must have the same prompt (``prompt_groups``).
    Returns pieces whose concatenation along dim 1 is [N, T, V], entry t predicting response token t
    (the values of ``plain_response_logits``): the last prompt position's logits [N, 1, V] and the
    response pass's [N, T - 1, V], or one piece (the plain forward's, or the response pass's
    [N, T, V] after the trimmed prompt pass of ``src.models.prompt_cache``, which leaves the prompt's
    last token to it). Kept apart, a caller that reduces each position
    (``token_log_probs_and_entropy``) never copies the pieces into one vocabulary-sized tensor.
    """
    total = input_ids.shape[1]
    prompt_len = total - width
    if not can_share(model, groups, prompt_len, width):
        return [plain_response_logits(model, input_ids, attention_mask, position_ids, width)]
    from transformers import DynamicCache

    first, inverse = _representatives(groups.to(input_ids.device))
    prompt_ids, prompt_mask, prompt_pos = (
        t[first, :prompt_len] for t in (input_ids, attention_mask, position_ids)
    )
    if trim_reason(model, prompt_mask) is None:
        # the prompts' first P - 1 tokens, the last layer's keys / values only; their last token
        # leads the response pass, whose logits are then all T pieces (src.models.prompt_cache)
        cache = trimmed_prompt_cache(model, prompt_ids[:, :-1], prompt_mask[:, :-1], prompt_pos[:, :-1])
        _spread_cache(cache, inverse)
        return [_response_pass(model, input_ids, attention_mask, position_ids, prompt_len - 1, cache)]
    # The prompt pass ends at the last prompt token and its logits are used: under FSDP2 a module's
    # pre-backward hook (which gathers its sharded weights) fires on its forward outputs, so the
    # prompt pass's output must carry gradient, not only the keys / values in its cache.
    prompt = model(
        input_ids=prompt_ids,
        attention_mask=prompt_mask,
        position_ids=prompt_pos,
        past_key_values=DynamicCache(),
        use_cache=True,
        logits_to_keep=1,
    )
    cache = getattr(prompt, "past_key_values", None)
    if cache is None or cache.get_seq_length() != prompt_len:
        log.warning(
            "the model returned no usable KV cache: shared-prompt forward falls back to the plain one"
        )
        return [plain_response_logits(model, input_ids, attention_mask, position_ids, width)]
    last_prompt = rows_of(prompt.logits[:, -1:], inverse)  # [N, 1, V] predicts response token 0
    if width == 1:
        return [last_prompt]
    _spread_cache(cache, inverse)  # [U, ...] -> [N, ...], differentiable
    return [last_prompt, _response_pass(model, input_ids, attention_mask, position_ids, prompt_len, cache)]


def _response_pass(model, input_ids, attention_mask, position_ids, start: int, cache) -> torch.Tensor:
    """Logits [N, L - 1 - start, V] of columns start .. L - 2 on top of ``cache`` (columns < start)."""
    return model(
        input_ids=input_ids[:, start:-1],
        attention_mask=attention_mask[:, :-1],
        position_ids=position_ids[:, start:-1],
        past_key_values=cache,
        use_cache=True,
    ).logits


def shared_prompt_logits(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    groups: torch.Tensor,
    width: int,
) -> torch.Tensor:
    """[N, T, V] :func:`shared_prompt_logit_pieces` in one tensor."""
    pieces = shared_prompt_logit_pieces(model, input_ids, attention_mask, position_ids, groups, width)
    return pieces[0] if len(pieces) == 1 else torch.cat(pieces, dim=1)


def response_logit_pieces(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    position_ids: torch.Tensor,
    width: int,
    groups: torch.Tensor | None = None,
) -> list[torch.Tensor]:
    """Response logits in pieces along T (concatenated: [N, width, V]): shared-prompt forward when
    ``groups`` is given, else plain (one piece)."""
    if groups is None:
        return [plain_response_logits(model, input_ids, attention_mask, position_ids, width)]
    return shared_prompt_logit_pieces(model, input_ids, attention_mask, position_ids, groups, width)
