"""The router's action space, the weak (supervision) labels derived from ground truths, the
route-conditioned prompts and what the router side knows about one prompt.

Routes are the three actions the router head samples; their integer values are the logit
columns of ``router_logits`` ([P, 3]). Weak labels add ``MIXED`` for examples whose ground truth
fits no single route (several families, or tools that are neither search nor calculate):
MIXED is not an action, it means "no supervised signal" and maps to ``MIXED_INDEX`` (-1), which
callers pass as ``ignore_index`` to the cross-entropy term.

``weak_label`` gives the weak router label: what the ground truth's tool calls say the route should be.

Route-conditioned system messages (``route_messages``), the prompt each rollout sees after the router
acts:

ANSWER
    The ``**Available Tools**`` section is removed; in the other headed sections, the output
    format's tool-call lines (the ``<tool_call>`` ... ``</tool_call>`` lines in XML, the
    ``to=functions.`` line in harmony) and the numbered steps/notes that tell the model how to call
    tools are removed (items that mention tools but refer to the dialogue history or previous
    calls stay, since the history may hold them); the kept items are renumbered and a section
    left with only its heading is dropped. An
    ``**Answer Directly**`` section is appended: think, then answer, no tools. The preamble is
    left alone.
SEARCH / CALCULATE
    ``emphasis``: the prompt is kept whole and a ``**Tool Preference**`` section is appended that
    names the preferred family's tools and discourages the other family's.
    ``only_family``: the tools section lists only the route's family (renumbered from 1), plus
    the same appended section; when the prompt has no tool of that family this falls back to
    ``emphasis`` with a warning, so the model is never left without the tools it was given.

Everything else in the prompt is unchanged byte for byte (sections are split and re-joined on the
blank line before each ``**Heading**`` line).

Prompt context (``PromptContext``): what the router side knows about one prompt, computed once and
passed on as a typed value. A prompt's format (XML or harmony), the tool descriptions of its system
message and its weak label are what routing, the routed prompt, the tool-usage parse and the
router's supervision all need; the single-turn collector and inference build one
:class:`PromptContext` per prompt and hand it to each of them instead of re-deriving these from the
raw record.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum, IntEnum
from typing import Any

from src.formats.tools_block import (
    TOOLS_SECTION_TITLE,
    parse_tools_block,
    section_title,
    split_sections,
    tool_descriptions,
)
from src.rewards.dispatch import response_format
from src.router.families import CALCULATE, SEARCH, ToolFamilies
from src.router.usage import ToolUsage, tool_usage

__all__ = [
    "MIXED_INDEX",
    "Route",
    "WeakLabel",
    "parse_route",
    "weak_label_index",
    "weak_label",
    "ANSWER_INSTRUCTIONS",
    "MODES",
    "route_messages",
    "route_system_prompt",
    "PromptContext",
    "prompt_context",
    "record_context",
    "response_usage",
    "routed_messages",
]

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------- routes and weak labels
class Route(IntEnum):
    """Router actions; the value is the column in the router's logits."""

    ANSWER = 0
    SEARCH = 1
    CALCULATE = 2

    @property
    def label(self) -> str:
        """Lower-case name used in logs and configs: "answer", "search", "calculate"."""
        return self.name.lower()


class WeakLabel(str, Enum):
    """Per-example weak label from the ground truth's tool calls (values are the stored strings)."""

    ANSWER = "ANSWER"
    SEARCH = "SEARCH"
    CALCULATE = "CALCULATE"
    MIXED = "MIXED"

    def route(self) -> Route | None:
        """The route this label supervises, or None for MIXED."""
        return None if self is WeakLabel.MIXED else Route[self.value]


MIXED_INDEX = -1

_ALIASES = {"search-family": "search", "calculate-family": "calculate", "calc": "calculate"}


def parse_route(value: Route | int | str) -> Route:
    """A Route from itself, its index (0..2) or its name in any case ("search", "SEARCH-FAMILY").

    Raises ValueError naming the bad value.
    """
    if isinstance(value, Route):
        return value
    if isinstance(value, bool):
        raise ValueError(f"route must be a Route, an index 0..2 or a name, got {value!r}")
    if isinstance(value, int):
        try:
            return Route(value)
        except ValueError:
            raise ValueError(
                f"route index {value} is not one of 0 (answer), 1 (search), 2 (calculate)"
            ) from None
    if isinstance(value, str):
        key = value.strip().lower()
        key = _ALIASES.get(key, key)
        for route in Route:
            if route.label == key:
                return route
    raise ValueError(f"unknown route {value!r}; expected answer, search or calculate")


def weak_label_index(label: WeakLabel | str) -> int:
    """Class index for the cross-entropy term: the route's value, or MIXED_INDEX for MIXED."""
    route = WeakLabel(label).route()
    return MIXED_INDEX if route is None else int(route)


def weak_label(
    ground_truth: str,
    families: ToolFamilies,
    fmt: str = "xml",
    descriptions: Mapping[str, str] | None = None,
) -> str:
    """Weak router label of an example from its ground-truth tool calls.

    No call -> "ANSWER"; every call a search tool -> "SEARCH"; every call a calculate tool ->
    "CALCULATE"; anything else (both families, any "other" tool, or a call whose JSON cannot be
    read so its family is unknown) -> "MIXED". ``descriptions`` (tool name -> description, e.g.
    from ``tool_descriptions(system prompt)``) sharpens the heuristic for unlabelled names.
    ``fmt`` is "xml" (``rlla``) or "harmony" (``rlla_gpt``).
    """
    usage = tool_usage(ground_truth, families, fmt=fmt, descriptions=descriptions)
    if usage.n_calls == 0 and not usage.used_any_tool:
        return WeakLabel.ANSWER.value
    per = usage.calls_per_family
    if usage.n_calls > 0 and per.get(SEARCH, 0) == usage.n_calls:
        return WeakLabel.SEARCH.value
    if usage.n_calls > 0 and per.get(CALCULATE, 0) == usage.n_calls:
        return WeakLabel.CALCULATE.value
    return WeakLabel.MIXED.value


# ---------------------------------------------------------------------------- route-conditioned prompts
MODES = ("emphasis", "only_family")
FORMATS = ("xml", "harmony")

ANSWER_INSTRUCTIONS = {
    "xml": (
        "**Answer Directly**\n"
        "No tools are available for this turn. Reason step by step inside <think> ... </think>, "
        "then give the user your complete answer inside <response> ... </response>. "
        "Do not make any tool calls."
    ),
    "harmony": (
        "**Answer Directly**\n"
        "No tools are available for this turn. Reason in one `analysis` message, then give the "
        "user your complete answer in a `final` message. Do not call any functions."
    ),
}
PREFERENCE_HEADING = "**Tool Preference**"
_GOAL = {SEARCH: "looking up information", CALCULATE: "computing a result"}
_KIND = {SEARCH: "search", CALCULATE: "calculation"}

_ITEM = re.compile(r"^\d+\.\s")
_TOOL_WORDS = re.compile(r"tool|function", re.IGNORECASE)
_HISTORY_WORDS = re.compile(r"history|previous", re.IGNORECASE)
_fallbacks = 0


def _drop_tool_items(section: str) -> str:
    """Remove numbered items that instruct tool use; renumber what is left."""
    lines = section.split("\n")
    groups: list[list[str]] = []  # each numbered item with its continuation lines; others alone
    for line in lines:
        if _ITEM.match(line) or not groups or not _ITEM.match(groups[-1][0]):
            groups.append([line])
        else:
            groups[-1].append(line)
    kept, number, dropped = [], 0, False
    for group in groups:
        text = "\n".join(group)
        if not _ITEM.match(group[0]):
            kept.append(text)
        elif _TOOL_WORDS.search(text) and not _HISTORY_WORDS.search(text):
            dropped = True
        else:
            number += 1
            kept.append(re.sub(r"^\d+\.", f"{number}.", text, count=1))
    return "\n".join(kept) if dropped else section


def _drop_call_lines(section: str, fmt: str) -> str:
    """Remove the tool-call lines of an output-format example."""
    out, inside = [], False
    for line in section.split("\n"):
        bare = line.strip()
        if fmt == "xml":
            if bare == "<tool_call>":
                inside = True
            if not inside:
                out.append(line)
            if bare == "</tool_call>":
                inside = False
        elif not (bare.startswith("<|start|>") and "to=functions." in bare):
            out.append(line)
    return "\n".join(out)


def _answer_prompt(system_text: str, fmt: str) -> str:
    sections = split_sections(system_text)
    out = [sections[0]]
    for section in sections[1:]:
        title = (section_title(section) or "").lower()
        if title == TOOLS_SECTION_TITLE:
            continue
        edited = _drop_tool_items(_drop_call_lines(section, fmt))
        if edited.split("\n", 1)[1:] in ([], [""]) and edited != section:
            continue  # only the heading is left: every item was about tools
        out.append(edited)
    return "\n\n".join([*out, ANSWER_INSTRUCTIONS[fmt]])


def _names(names: Iterable[str]) -> str:
    return ", ".join(f"`{name}`" for name in names)


def _preference(family: str, labels: Mapping[str, str], only_listed: bool) -> str:
    other = CALCULATE if family == SEARCH else SEARCH
    preferred = [n for n, f in labels.items() if f == family]
    avoided = [n for n, f in labels.items() if f == other]
    goal, kind, other_kind = _GOAL[family], _KIND[family], _KIND[other]
    if only_listed:
        text = f"This turn calls for {goal}; only the {kind} tools are listed above."
    elif preferred:
        text = f"This turn calls for {goal}. Prefer the {kind} tools: {_names(preferred)}."
    else:
        text = (
            f"This turn calls for {goal}. None of the listed tools is a {kind} tool; "
            "use a tool only if you need it."
        )
    if avoided and not only_listed:
        text += (
            f" Avoid the {other_kind} tools ({_names(avoided)}) unless the task cannot be done without them."
        )
    return f"{PREFERENCE_HEADING}\n{text}"


def _family_prompt(system_text: str, family: str, families: ToolFamilies, mode: str) -> str:
    block = parse_tools_block(system_text)
    labels = families.of_tools(block.tools) if block is not None else {}
    if mode == "only_family":
        keep = [tool for tool in block.tools if labels[tool.name] == family] if block is not None else []
        if keep:
            text = system_text[: block.start] + block.render(keep) + system_text[block.end :]
            return f"{text}\n\n{_preference(family, labels, only_listed=True)}"
        _warn_fallback(family, labels)
    return f"{system_text}\n\n{_preference(family, labels, only_listed=False)}"


def _warn_fallback(family: str, labels: Mapping[str, str]) -> None:
    # Rollouts hit this for every prompt lacking the family: warn early, then only now and then.
    global _fallbacks
    _fallbacks += 1
    if _fallbacks <= 10 or _fallbacks % 1000 == 0:
        log.warning(
            "route %s, mode only_family: no %s tool among %s; using emphasis instead"
            " (%d such prompts so far)",
            family,
            family,
            list(labels) or "no tools",
            _fallbacks,
        )


def route_system_prompt(
    system_text: str,
    route: Route | int | str,
    families: ToolFamilies,
    mode: str = "emphasis",
    fmt: str = "xml",
) -> str:
    """The system message for ``route`` built from the original one (rules in the module doc).

    Args:
        system_text: the row's original system message.
        route: Route, its index, or its name.
        families: tool family labels (sidecar overrides + heuristic).
        mode: "emphasis" or "only_family" (SEARCH / CALCULATE only; ANSWER ignores it).
        fmt: "xml" (``rlla``) or "harmony" (``rlla_gpt``).
    """
    if not isinstance(system_text, str):
        raise ValueError(f"system message must be a string, got {type(system_text).__name__}")
    if mode not in MODES:
        raise ValueError(f"unknown route prompt mode {mode!r}; expected one of {MODES}")
    if fmt not in FORMATS:
        raise ValueError(f"unknown prompt format {fmt!r}; expected one of {FORMATS}")
    route = parse_route(route)
    if route is Route.ANSWER:
        return _answer_prompt(system_text, fmt)
    return _family_prompt(system_text, SEARCH if route is Route.SEARCH else CALCULATE, families, mode)


def route_messages(
    messages: Iterable[Mapping[str, Any]],
    route: Route | int | str,
    families: ToolFamilies,
    mode: str = "emphasis",
    fmt: str = "xml",
) -> list[dict[str, Any]]:
    """Copies of chat ``messages`` with the first system message rewritten for ``route``.

    Raises ValueError when there is no system message.
    """
    out = [dict(message) for message in messages]
    for message in out:
        if message.get("role") == "system":
            message["content"] = route_system_prompt(message.get("content"), route, families, mode, fmt)
            return out
    raise ValueError(f"no system message among roles {[m.get('role') for m in out]}; cannot route the prompt")


# ---------------------------------------------------------------------------- prompt context
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
