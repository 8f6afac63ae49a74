"""Route-conditioned system messages: the prompt each rollout sees after the router acts.

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
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Mapping
from typing import Any

from src.formats.tools_block import TOOLS_SECTION_TITLE, parse_tools_block, section_title, split_sections
from src.router.families import CALCULATE, SEARCH, ToolFamilies
from src.router.routes import Route, parse_route

__all__ = ["ANSWER_INSTRUCTIONS", "MODES", "route_messages", "route_system_prompt"]

log = logging.getLogger(__name__)

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
