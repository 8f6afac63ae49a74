"""The ``**Available Tools**`` section of an RLLA / harmony system prompt: split, parse, render.

An RLLA system prompt lists its tools in an ``**Available Tools**`` section, one numbered item
per tool. Two item layouts occur in the real data and both are read:

    1. Name: GetNews                       (RLLA train/test/SFT)
    Description: Retrieve Azure news articles
    Parameters: {"page": {...}}

    1. QueryMeeting: The API for ...       (API-Bank level 3)
    Parameters: {'user_name': {...}}

Descriptions and parameters may span several lines; an item ends where the next number starts
(numbers must follow 1, 2, 3, ... so a numbered line inside a description is not a new tool). The
section ends at the next blank-line-separated ``**Heading**`` line. The harmony (GPT-OSS) prompts
keep the same tools section, so the parse is shared by both formats.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

TOOLS_SECTION_TITLE = "available tools"

# ---------------------------------------------------------------- prompt sections and tools

_SECTION_SPLIT = re.compile(r"\n\n(?=\*\*[^*\n]+\*\*[ \t]*(?:\n|$))")
_HEADING = re.compile(r"\*\*([^*\n]+)\*\*[ \t]*(?:\n|$)")


def split_sections(text: str) -> list[str]:
    """Split a system prompt before each blank-line-separated ``**Heading**`` line.

    ``"\\n\\n".join(split_sections(text)) == text`` always holds; the first part is the preamble.
    """
    return _SECTION_SPLIT.split(text)


def section_title(section: str) -> str | None:
    """The heading text of a section ("Available Tools"), or None for a preamble."""
    match = _HEADING.match(section)
    return match.group(1).strip() if match else None


@dataclass(frozen=True)
class ToolSpec:
    """One tool item of the Available Tools section.

    ``text`` is the item exactly as written (all its lines, starting with "N. "); ``parameters``
    is the raw text after "Parameters:" (JSON in RLLA, a Python literal in API-Bank).
    """

    number: int
    name: str
    description: str
    parameters: str
    text: str

    def renumbered(self, number: int) -> str:
        """The item's text with its leading number replaced."""
        return re.sub(r"^\d+\.", f"{number}.", self.text, count=1)

    def parameters_dict(self) -> dict[str, Any] | None:
        """The parameters as a dict (JSON, else Python literal), or None when unreadable."""
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(self.parameters)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                continue
            if isinstance(value, dict):
                return value
        return None


@dataclass(frozen=True)
class ToolsBlock:
    """The Available Tools section of a system prompt: ``text[start:end]`` is the section."""

    start: int
    end: int
    heading: str
    intro: tuple[str, ...]
    tools: tuple[ToolSpec, ...]

    def render(self, tools: Iterable[ToolSpec]) -> str:
        """The section text listing ``tools`` (renumbered from 1) under the same heading and intro."""
        items = [tool.renumbered(i) for i, tool in enumerate(tools, start=1)]
        return "\n".join([self.heading, *self.intro, *items])


def _item_start(line: str, number: int, layout: str | None) -> tuple[str, str, str] | None:
    """(layout, name, rest of line) when ``line`` opens tool item ``number``."""
    named = re.match(rf"{number}\.\s+Name:\s*(.*)$", line)
    if named and layout in (None, "named"):
        return "named", named.group(1).strip(), ""
    inline = re.match(rf"{number}\.\s+(\S[^:\n]*?):\s*(.*)$", line)
    if inline and layout in (None, "inline") and not named:
        return "inline", inline.group(1).strip(), inline.group(2)
    return None


def _parse_item(number: int, layout: str, name: str, rest: str, lines: list[str]) -> ToolSpec:
    body = lines[1:]
    param_at = next((i for i, line in enumerate(body) if line.startswith("Parameters:")), None)
    desc_lines = body if param_at is None else body[:param_at]
    parameters = "" if param_at is None else "\n".join(body[param_at:])[len("Parameters:") :].strip()
    if layout == "named":
        desc = "\n".join(desc_lines)
        desc = desc[len("Description:") :] if desc.startswith("Description:") else desc
    else:
        desc = "\n".join([rest, *desc_lines])
    return ToolSpec(number, name, desc.strip(), parameters, "\n".join(lines))


def parse_tools_block(system_text: str) -> ToolsBlock | None:
    """Find and parse the Available Tools section; None when the prompt has none."""
    sections = split_sections(system_text)
    offset = 0
    for section in sections:
        title = section_title(section)
        if title is not None and title.lower() == TOOLS_SECTION_TITLE:
            return _parse_section(section, offset)
        offset += len(section) + 2
    return None


def _parse_section(section: str, offset: int) -> ToolsBlock:
    lines = section.split("\n")
    heading, body = lines[0], lines[1:]
    starts: list[tuple[int, str, str, str]] = []  # (line index, layout, name, rest)
    layout: str | None = None
    for i, line in enumerate(body):
        found = _item_start(line, len(starts) + 1, layout)
        if found:
            layout = found[0]
            starts.append((i, *found))
    intro = tuple(body[: starts[0][0]] if starts else body)
    tools = []
    for k, (i, item_layout, name, rest) in enumerate(starts):
        stop = starts[k + 1][0] if k + 1 < len(starts) else len(body)
        tools.append(_parse_item(k + 1, item_layout, name, rest, body[i:stop]))
    return ToolsBlock(offset, offset + len(section), heading, intro, tuple(tools))


def tool_descriptions(system_text: str) -> dict[str, str]:
    """Tool name -> description for the tools listed in a system prompt (empty when none)."""
    block = parse_tools_block(system_text)
    return {} if block is None else {tool.name: tool.description for tool in block.tools}
