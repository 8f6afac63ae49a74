"""Route decisions and routed prompts: the router half of a single-turn rollout, shared by the
training collector and inference.

Rows are prompt-major: P prompts × ``copies`` gives N = P·copies rows, row i from prompt i // copies.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from src.rollout.engines.types import left_pad
from src.router.context import PromptContext, routed_messages
from src.router.families import ToolFamilies
from src.router.head import RouterHead
from src.router.routes import Route, parse_route

ROUTE_NAMES = tuple(r.label for r in Route)  # ("answer", "search", "calculate")

LogitsFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass
class RouteDecision:
    """logits [P, 3] float (CPU); action [N] long; log_prob [N] float (of ``action`` under logits)."""

    logits: torch.Tensor
    action: torch.Tensor
    log_prob: torch.Tensor

    @property
    def probs(self) -> torch.Tensor:
        """[P, 3] route probabilities (answer, search, calculate)."""
        return torch.softmax(self.logits.float(), dim=-1)

    def names(self) -> list[str]:
        return [ROUTE_NAMES[int(a)] for a in self.action]


def router_logits(
    logits_fn: LogitsFn, prompt_ids: Sequence[list[int]], pad_id: int, micro_batch: int | None = None
) -> torch.Tensor:
    """Router logits [P, 3] (float32, CPU) of P un-routed prompts, left-padded per micro-batch
    (``micro_batch`` None: all P in one call)."""
    step = len(prompt_ids) if micro_batch is None else max(1, int(micro_batch))
    out = []
    for start in range(0, len(prompt_ids), step):
        ids, mask = left_pad(list(prompt_ids[start : start + step]), pad_id)
        out.append(logits_fn(ids, mask).float().cpu())
    return torch.cat(out)


def decide_routes(
    logits: torch.Tensor, copies: int, sample: bool, generator: torch.Generator | None = None
) -> RouteDecision:
    """One route per copy: ``copies`` rows per prompt, sampled (or argmax) from logits [P, 3]."""
    out = RouterHead.act(logits.repeat_interleave(copies, dim=0), sample=sample, generator=generator)
    return RouteDecision(logits, out.router_action, out.router_log_prob)


def forced_routes(logits: torch.Tensor | None, routes: Sequence[Route | int | str]) -> RouteDecision:
    """A decision that takes the given routes (one per prompt); log-probs from ``logits`` when known
    (else 0 and logits all zero)."""
    action = torch.tensor([int(parse_route(r)) for r in routes], dtype=torch.long)
    if logits is None:
        return RouteDecision(torch.zeros(len(routes), len(Route)), action, torch.zeros(len(routes)))
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    return RouteDecision(logits, action, log_probs.gather(-1, action[:, None]).squeeze(-1))


def routed_prompts(
    encode: Callable[[list[dict[str, Any]]], list[int]],
    contexts: Sequence[PromptContext],
    routes: Sequence[int | None],
    families: ToolFamilies,
    mode: str,
) -> tuple[list[list[dict[str, Any]]], list[list[int]]]:
    """(messages, prompt ids) of each row: row i is ``contexts[i]`` under ``routes[i]`` (None: as given)."""
    messages = [routed_messages(ctx, r, families, mode) for ctx, r in zip(contexts, routes)]
    return messages, [encode(m) for m in messages]
