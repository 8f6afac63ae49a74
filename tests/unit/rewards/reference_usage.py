"""Reference: ``src/router/usage.py``'s call readers as they were before the rewrite (commit 545d290).

Kept verbatim, reading through the reference copies of the old parsers, as the oracle of the
differential test in test_parity_fuzz.py.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

from reference_rlla import parse_tool_block

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
FORMATS = ("xml", "harmony")
_HARMONY_CALL = "<|call|>"
_FUNCTIONS = "functions."


@dataclass(frozen=True)
class ToolUsage:
    """Tool use of one response. ``calls_per_family`` keys: search, calculate, other, unknown."""

    used_any_tool: bool = False
    used_search: bool = False
    used_calculate: bool = False
    used_other: bool = False
    n_calls: int = 0
    calls_per_family: dict[str, int] = field(default_factory=dict)
    names: list[str | None] = field(default_factory=list)
    parse_ok: bool = True


def _after_think(text: str) -> str:
    return text.split("</think>", 1)[1] if "</think>" in text else text


def _is_call(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str)


def xml_call_lines(response: str) -> tuple[bool, list[tuple[Any, str]], bool]:
    """(block present, one (parsed item or None, raw line) per call, parse_ok) of an XML response.

    Calls are read after ``</think>``, from every ``<tool_call>`` block, one JSON object per line.
    """
    tail = _after_think(response if isinstance(response, str) else "")
    pieces = tail.split("<tool_call>")[1:]
    calls: list[tuple[Any, str]] = []
    ok = True
    for piece in pieces:
        try:
            items = parse_tool_block("<tool_call>" + piece)
        except (ValueError, RecursionError):
            items = None
        if items is not None and all(_is_call(item) for item in items):
            calls += [(item, json.dumps(item)) for item in items]
            continue
        ok = False
        # an unclosed block ends where the reply starts, so the reply is not read as a call
        block = piece.split("</tool_call>")[0] if "</tool_call>" in piece else piece.split("<response>")[0]
        for line in block.split("\n"):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except (ValueError, RecursionError):
                item = None
            calls.append((item if _is_call(item) else None, line.strip()))
    return bool(pieces), calls, ok


def extract_xml_calls(response: str) -> tuple[bool, list[str | None], bool]:
    """(block present, one name per call — None when unreadable, parse_ok) of an XML response."""
    present, calls, ok = xml_call_lines(response)
    return present, [item["name"] if item is not None else None for item, _ in calls], ok


def _harmony_calls(response: str) -> tuple[bool, list[str | None], bool]:
    # Optional sibling module: imported here so XML-only use never needs it.
    from reference_harmony import block_tool_call, parse_harmony, parse_harmony_tool_calls

    text = response if isinstance(response, str) else ""
    try:
        names: list[str | None] = [call["name"] for call in parse_harmony_tool_calls(text)]
        return bool(names), names, True
    except ValueError:
        pass
    names = []
    for block in parse_harmony(text).blocks:
        if block.recipient is None and block.terminator != _HARMONY_CALL:
            continue  # not addressed to a tool: reasoning or a reply, even if malformed
        try:
            call = block_tool_call(block)
            names.append(call["name"] if call else None)
        except ValueError:
            recipient = block.recipient or ""
            name = recipient[len(_FUNCTIONS) :] if recipient.startswith(_FUNCTIONS) else ""
            names.append(name if name.strip() else None)
    return bool(names), names, False
