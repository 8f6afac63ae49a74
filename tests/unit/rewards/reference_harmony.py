"""Reference: ``src/formats/harmony.py`` as it was before the linear-time rewrite (commit 545d290).

Kept verbatim (docstring and ``__all__`` trimmed) as the oracle of the differential test in
test_parity_fuzz.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

START, END, MESSAGE, CHANNEL, CALL, RETURN = (
    "<|start|>",
    "<|end|>",
    "<|message|>",
    "<|channel|>",
    "<|call|>",
    "<|return|>",
)
CONSTRAIN = "<|constrain|>"
TERMINATORS = (END, CALL, RETURN)
CHANNELS = ("analysis", "commentary", "final")
FUNCTIONS_PREFIX = "functions."
# Any of these inside a block's message means the block structure is broken.
_STRUCTURE_TOKENS = (START, MESSAGE, CHANNEL, CONSTRAIN) + TERMINATORS
_ROLE_RE = re.compile(r"\s*(\S*)\s*(.*)", re.DOTALL)
_TERMINATOR_RE = re.compile("|".join(re.escape(t) for t in TERMINATORS))


@dataclass(frozen=True)
class HarmonyBlock:
    """One ``<|start|>…<|terminator|>`` block.

    role          "assistant" for model output ("" when missing)
    recipient     e.g. "functions.GetNews", None when the block is addressed to no one
    channel       "analysis" / "commentary" / "final" (None when missing)
    content_type  e.g. "json" (``<|constrain|>json`` reads as "json"), None when absent
    message       the text between ``<|message|>`` and the terminator, verbatim
    terminator    "<|end|>" / "<|call|>" / "<|return|>", None when missing
    error         why the block is malformed, None when it is well formed
    """

    role: str
    recipient: str | None
    channel: str | None
    content_type: str | None
    message: str
    terminator: str | None
    error: str | None = None


@dataclass(frozen=True)
class HarmonyParse:
    """All blocks in order, and the non-whitespace text found outside any block."""

    blocks: tuple[HarmonyBlock, ...]
    stray: tuple[str, ...]

    @property
    def well_formed(self) -> bool:
        return not self.stray and all(b.error is None for b in self.blocks)


def parse_harmony(text: str) -> HarmonyParse:
    """Split harmony text into blocks; never raises (problems are recorded, see module doc)."""
    chunks = text.split(START)
    stray = [chunks[0].strip()] if chunks[0].strip() else []
    blocks = []
    for chunk in chunks[1:]:
        block, after = _parse_chunk(chunk)
        blocks.append(block)
        if after.strip():
            stray.append(after.strip())
    return HarmonyParse(tuple(blocks), tuple(stray))


def _parse_chunk(chunk: str) -> tuple[HarmonyBlock, str]:
    """One block from the text after a ``<|start|>``; also returns what follows its terminator."""
    header, sep, rest = chunk.partition(MESSAGE)
    errors = []
    if not sep:
        errors.append("no <|message|>")
        header, rest = chunk, ""
    match = _TERMINATOR_RE.search(rest)
    if match:
        message, terminator, after = rest[: match.start()], match.group(), rest[match.end() :]
    else:
        message, terminator, after = rest, None, ""
        if sep:
            errors.append("no terminator")
    if any(tok in message for tok in _STRUCTURE_TOKENS):
        errors.append("special token inside the message")
    role, recipient, channel, content_type, header_error = _parse_header(header)
    if header_error:
        errors.insert(0, header_error)
    block = HarmonyBlock(
        role, recipient, channel, content_type, message, terminator, "; ".join(errors) or None
    )
    return block, after


def _parse_header(header: str) -> tuple[str, str | None, str | None, str | None, str | None]:
    """(role, recipient, channel, content_type, error) of a block header."""
    role_part, sep, channel_part = header.partition(CHANNEL)
    role, role_rest = _ROLE_RE.match(role_part).group(1, 2)
    recipient, error = None, None
    if role_rest.startswith("to="):
        # Verbatim up to <|channel|>: ToolRL has names with a trailing space, and our template
        # writes no separator here, so nothing is stripped.
        recipient = role_rest[3:]
    elif role_rest.strip():
        error = f"unexpected text in the role header: {role_rest[:40]!r}"
    if not role:
        error = error or "no role"
    if not sep:
        return role, recipient, None, None, error or "no <|channel|>"
    if CHANNEL in channel_part:
        return role, recipient, None, None, error or "two <|channel|> tokens"
    channel, _, rest = channel_part.strip().partition(" ")
    rest = rest.strip()
    content_type = None
    if CONSTRAIN in rest:
        rest, _, content_type = (s.strip() for s in rest.partition(CONSTRAIN))
    if rest.startswith("to="):
        if recipient is not None:
            error = error or "two recipients"
        recipient = rest[3:].strip()
        if content_type is None and recipient.endswith(" json"):
            recipient, content_type = recipient[: -len(" json")].strip(), "json"
    elif rest:
        if content_type is not None:
            error = error or f"unexpected text after the channel: {rest[:40]!r}"
        content_type = rest
    if channel not in CHANNELS:
        error = error or f"unknown channel {channel[:40]!r}"
    return role, recipient, channel, content_type or None, error


def block_tool_call(block: HarmonyBlock) -> dict[str, Any] | None:
    """The call a block makes as {"name", "parameters"}, or None when it is not a call.

    A block is a call when it has a recipient or ends with ``<|call|>``. Raises ValueError when
    such a block is malformed: no ``functions.NAME`` recipient, an empty name, a terminator
    other than ``<|call|>``, or a message that is not a JSON object.
    """
    if block.error:
        raise ValueError(f"malformed block: {block.error}")
    if block.recipient is None and block.terminator != CALL:
        return None
    if block.recipient is None:
        raise ValueError("tool call without a name (no to=functions.NAME)")
    if not block.recipient.startswith(FUNCTIONS_PREFIX):
        raise ValueError(f"recipient {block.recipient[:60]!r} is not functions.NAME")
    name = block.recipient[len(FUNCTIONS_PREFIX) :]
    if not name.strip():
        raise ValueError("tool call without a name (empty after functions.)")
    if block.terminator != CALL:
        raise ValueError(f"tool call to {name!r} ends with {block.terminator}, not <|call|>")
    try:
        parameters = json.loads(block.message)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ValueError(f"tool call to {name!r}: arguments are not JSON ({err})") from err
    if not isinstance(parameters, dict):
        raise ValueError(f"tool call to {name!r}: arguments are {type(parameters).__name__}, not an object")
    return {"name": name, "parameters": parameters}


def parse_harmony_tool_calls(text: str) -> list[dict[str, Any]]:
    """Every tool call in the text, in order, as {"name": str, "parameters": dict}.

    Raises ValueError (naming the block) when any block is malformed — structure (no
    ``<|message|>``, no terminator, unknown channel) or call (see :func:`block_tool_call`).
    Text outside blocks is ignored here (it is a format fault, not a call fault).
    """
    return tool_calls_of(parse_harmony(text))


def tool_calls_of(parsed: HarmonyParse) -> list[dict[str, Any]]:
    """:func:`parse_harmony_tool_calls` on already parsed text (same result, same errors)."""
    calls = []
    for i, block in enumerate(parsed.blocks):
        try:
            call = block_tool_call(block)
        except ValueError as err:
            raise ValueError(f"harmony block {i}: {err}") from err
        if call is not None:
            calls.append(call)
    return calls
