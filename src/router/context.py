"""What the router side knows about one prompt, computed once and passed on as a typed value.

A prompt's format (XML or harmony), the tool descriptions of its system message and its weak
label are what routing, the routed prompt, the tool-usage parse and the router's supervision all
need; the single-turn collector and inference build one :class:`PromptContext` per prompt and
hand it to each of them instead of re-deriving these from the raw record.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from src.formats.tools_block import tool_descriptions
from src.rewards.dispatch import response_format
from src.router.families import ToolFamilies
from src.router.labels import weak_label
from src.router.prompts import route_messages
from src.router.routes import Route, parse_route
from src.router.usage import ToolUsage, tool_usage

__all__ = ["PromptContext", "prompt_context", "record_context", "response_usage", "routed_messages"]


@dataclass(frozen=True)
class PromptContext:
    """One prompt as the router sees it.

    messages: the original chat messages (copies); data_source: ``rlla`` | ``rlla_gpt``;
    fmt: ``xml`` | ``harmony``; descriptions: tool name -> description from the system message;
    weak_label: ``ANSWER`` | ``SEARCH`` | ``CALCULATE`` | ``MIXED``, or None when not asked for.
    """

    messages: list[dict[str, Any]]
    data_source: str
    fmt: str
    descriptions: dict[str, str] = field(default_factory=dict)
    weak_label: str | None = None


def system_text(messages: Sequence[Mapping[str, Any]]) -> str:
    """Content of the first system message ("" when there is none)."""
    return next((str(m.get("content") or "") for m in messages if m.get("role") == "system"), "")


def prompt_context(
    messages: Sequence[Mapping[str, Any]],
    data_source: str,
    families: ToolFamilies,
    ground_truth: str | None = None,
    label: str | None = None,
) -> PromptContext:
    """Context of one prompt; the weak label is ``label`` if given, else read from ``ground_truth``
    (None when neither is given). Raises KeyError naming an unknown ``data_source``."""
    fmt = response_format(data_source)
    descriptions = tool_descriptions(system_text(messages))
    if label is None and ground_truth is not None:
        label = weak_label(ground_truth, families, fmt=fmt, descriptions=descriptions)
    return PromptContext([dict(m) for m in messages], data_source, fmt, descriptions, label)


def record_context(record: Mapping[str, Any], families: ToolFamilies, with_label: bool) -> PromptContext:
    """Context of a datamodule record (keys messages, data_source, ground_truth, optional weak_label)."""
    label = record.get("weak_label") if with_label else None
    truth = record.get("ground_truth") if with_label else None
    return prompt_context(record["messages"], record["data_source"], families, truth, label)


def routed_messages(
    ctx: PromptContext, route: Route | int | str | None, families: ToolFamilies, mode: str
) -> list[dict[str, Any]]:
    """The messages the actor sees under ``route`` (None: the prompt as given)."""
    if route is None:
        return [dict(m) for m in ctx.messages]
    return route_messages(ctx.messages, parse_route(route), families, mode=mode, fmt=ctx.fmt)


def response_usage(text: str, ctx: PromptContext, families: ToolFamilies) -> ToolUsage:
    """Tool usage of a decoded response, read with the prompt's format and tool descriptions."""
    return tool_usage(text, families, fmt=ctx.fmt, descriptions=ctx.descriptions)
