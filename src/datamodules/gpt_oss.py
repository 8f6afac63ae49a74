"""Conversion of RLLA (ToolRL XML) rows to GPT-OSS harmony format, and back.

XML target                                   harmony target (blocks joined by "\\n")
    <think> T </think>                           <|start|>assistant<|channel|>analysis<|message|>T<|end|>
    <tool_call>                                  <|start|>assistant to=functions.N1<|channel|>commentary json<|message|>P1<|call|>
    {"name": N1, "parameters": P1}               <|start|>assistant to=functions.N2<|channel|>commentary json<|message|>P2<|call|>
    {"name": N2, "parameters": P2}
    </tool_call>
    <response> R </response>                     <|start|>assistant<|channel|>final<|message|>R<|return|>

Text handling: the reasoning T and the reply R lose their surrounding whitespace (ToolRL writes
``<think> T </think>``; the padding is tag layout, not content) and keep everything inside
verbatim, newlines included, so analysis word counts equal <think> word counts. Parameters are
compact JSON (no spaces, non-ASCII kept as is); ``harmony_to_xml`` writes ToolRL's
``json.dumps`` lines back, so a canonical XML target round-trips exactly.

The XML is read by position, not by first occurrence: the reasoning ends at the first
``</think>`` and only the text after it is searched for ``<tool_call>`` / ``<response>`` blocks
(some SFT reasoning mentions the literal ``<tool_call>``). The layout must be ToolRL's:
think, then at most one tool-call block, then at most one response. Anything else, a call that
is not {"name": non-empty one-line str, "parameters": object}, or text that would collide with harmony's
special tokens raises :class:`ConversionError`; ``convert_frame`` drops such rows and reports
them by index and reason.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from src.formats.harmony import block_tool_call, parse_harmony

__all__ = [
    "GPT_OSS_DATA_SOURCE",
    "GPT_OSS_TOKEN_IDS",
    "HARMONY_SPECIAL_TOKENS",
    "PATTERNS",
    "ConversionError",
    "ConversionStats",
    "XmlTurn",
    "convert_frame",
    "convert_ground_truth",
    "convert_row",
    "convert_sft_records",
    "convert_system_prompt",
    "harmony_to_xml",
    "harmony_turn",
    "output_pattern",
    "parse_xml_turn",
    "render_harmony",
]

log = logging.getLogger(__name__)

GPT_OSS_DATA_SOURCE = "rlla_gpt"
HARMONY_SPECIAL_TOKENS = ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>"]
# Ids in the o200k_harmony vocabulary of GPT-OSS (the seed's table).
GPT_OSS_TOKEN_IDS = {
    "<|start|>": 200006,
    "<|end|>": 200007,
    "<|message|>": 200008,
    "<|channel|>": 200005,
    "<|call|>": 200012,
    "<|return|>": 200002,
}
# Also refused inside converted text: the model reads it as structure.
_FORBIDDEN_IN_TEXT = tuple(HARMONY_SPECIAL_TOKENS) + ("<|constrain|>",)

# Output patterns counted by the converters.
PATTERN_CALL = "analysis+tool_call"
PATTERN_CALLS = "analysis+multiple_tool_calls"
PATTERN_FINAL = "analysis+final"
PATTERN_CALLS_FINAL = "analysis+tool_calls+final"
PATTERN_ANALYSIS_ONLY = "analysis_only"
PATTERNS = (PATTERN_CALL, PATTERN_CALLS, PATTERN_FINAL, PATTERN_CALLS_FINAL, PATTERN_ANALYSIS_ONLY)


class ConversionError(ValueError):
    """An XML target, harmony text or row that cannot be converted (the message says why)."""


@dataclass(frozen=True)
class XmlTurn:
    """One assistant turn, format-free: reasoning, tool calls (in order), optional reply."""

    think: str
    calls: tuple[dict[str, Any], ...]
    response: str | None


def output_pattern(n_calls: int, has_final: bool) -> str:
    """The pattern name of a turn with ``n_calls`` tool calls and/or a final reply."""
    if n_calls and has_final:
        return PATTERN_CALLS_FINAL
    if n_calls:
        return PATTERN_CALL if n_calls == 1 else PATTERN_CALLS
    return PATTERN_FINAL if has_final else PATTERN_ANALYSIS_ONLY


# ----------------------------------------------------------------------------- XML -> turn


def _check_text(text: str, what: str) -> str:
    for tok in _FORBIDDEN_IN_TEXT:
        if tok in text:
            raise ConversionError(f"{what} contains the harmony token {tok}")
    return text


def _parse_call_line(line: str, number: int) -> dict[str, Any]:
    try:
        call = json.loads(line)
    except (json.JSONDecodeError, RecursionError) as err:
        raise ConversionError(f"tool call line {number} is not JSON ({err}): {line[:80]!r}") from err
    if not isinstance(call, dict) or set(call) != {"name", "parameters"}:
        keys = sorted(call) if isinstance(call, dict) else type(call).__name__
        raise ConversionError(f"tool call line {number} must have exactly name and parameters, got {keys}")
    name, params = call["name"], call["parameters"]
    if not isinstance(name, str) or not name.strip() or "\n" in name:
        raise ConversionError(f"tool call line {number}: bad name {name!r}")
    if not isinstance(params, dict):
        raise ConversionError(
            f"tool call line {number}: parameters are {type(params).__name__}, not an object"
        )
    _check_text(name, f"tool call line {number}'s name")
    return {"name": name, "parameters": params}


def parse_xml_turn(xml_text: str) -> XmlTurn:
    """Read a ToolRL XML target (see module doc for the accepted layout)."""
    if not isinstance(xml_text, str):
        raise ConversionError(f"target is {type(xml_text).__name__}, not a string")
    text = xml_text.strip()
    if not text.startswith("<think>"):
        raise ConversionError("target does not start with <think>")
    end = text.find("</think>")
    if end < 0:
        raise ConversionError("target has no </think>")
    think = text[len("<think>") : end].strip()
    if "<think>" in think:
        raise ConversionError("nested <think>")
    rest, pos = text[end + len("</think>") :], 0
    calls: list[dict[str, Any]] | None = None
    response: str | None = None
    while True:
        while pos < len(rest) and rest[pos].isspace():
            pos += 1
        if pos == len(rest):
            break
        if rest.startswith("<tool_call>", pos):
            if calls is not None or response is not None:
                raise ConversionError("a second <tool_call> block, or one after <response>")
            close = rest.find("</tool_call>", pos)
            if close < 0:
                raise ConversionError("<tool_call> without </tool_call>")
            body = rest[pos + len("<tool_call>") : close]
            calls = [
                _parse_call_line(ln.strip(), i) for i, ln in enumerate(body.split("\n"), 1) if ln.strip()
            ]
            if not calls:
                raise ConversionError("empty <tool_call> block")
            pos = close + len("</tool_call>")
        elif rest.startswith("<response>", pos):
            if response is not None:
                raise ConversionError("a second <response> block")
            close = rest.find("</response>", pos)
            if close < 0:
                raise ConversionError("<response> without </response>")
            response = rest[pos + len("<response>") : close].strip()
            pos = close + len("</response>")
        else:
            raise ConversionError(f"unexpected text after </think>: {rest[pos : pos + 60]!r}")
    _check_text(think, "<think>")
    if response is not None:
        _check_text(response, "<response>")
    return XmlTurn(think, tuple(calls or ()), response)


# ----------------------------------------------------------------------------- turn <-> harmony


def render_harmony(turn: XmlTurn) -> str:
    """The harmony text of a turn (blocks joined by "\\n", final block ends with <|return|>)."""
    blocks = [f"<|start|>assistant<|channel|>analysis<|message|>{turn.think}<|end|>"]
    for call in turn.calls:
        args = json.dumps(call["parameters"], separators=(",", ":"), ensure_ascii=False)
        _check_text(args, f"parameters of {call['name']!r}")
        blocks.append(
            f"<|start|>assistant to=functions.{call['name']}<|channel|>commentary json<|message|>{args}<|call|>"
        )
    if turn.response is not None:
        blocks.append(f"<|start|>assistant<|channel|>final<|message|>{turn.response}<|return|>")
    return "\n".join(blocks)


def convert_ground_truth(xml_text: str) -> str:
    """ToolRL XML target -> harmony target. Raises ConversionError (see module doc)."""
    return render_harmony(parse_xml_turn(xml_text))


def harmony_turn(harmony_text: str) -> XmlTurn:
    """Read a well-formed harmony turn: one analysis block, tool calls, at most one final block."""
    parsed = parse_harmony(harmony_text)
    if parsed.stray:
        raise ConversionError(f"text outside harmony blocks: {parsed.stray[0][:60]!r}")
    if not parsed.blocks or parsed.blocks[0].channel != "analysis" or parsed.blocks[0].recipient:
        raise ConversionError("harmony text does not start with an analysis block")
    if parsed.blocks[0].error:
        raise ConversionError(f"analysis block: {parsed.blocks[0].error}")
    calls, response = [], None
    for i, block in enumerate(parsed.blocks[1:], 1):
        if response is not None:
            raise ConversionError(f"block {i} follows the final block")
        try:
            call = block_tool_call(block)
        except ValueError as err:
            raise ConversionError(f"block {i}: {err}") from err
        if call is not None:
            calls.append(call)
        elif block.channel == "final":
            response = block.message
        else:
            raise ConversionError(f"block {i} is neither a tool call nor a final block")
    return XmlTurn(parsed.blocks[0].message, tuple(calls), response)


def harmony_to_xml(harmony_text: str) -> str:
    """Harmony turn -> ToolRL XML with the same reasoning, calls (``json.dumps`` lines) and reply."""
    turn = harmony_turn(harmony_text)
    parts = [f"<think> {turn.think} </think>"]
    if turn.calls:
        lines = "\n".join(json.dumps({"name": c["name"], "parameters": c["parameters"]}) for c in turn.calls)
        parts.append(f"<tool_call>\n{lines}\n</tool_call>")
    if turn.response is not None:
        parts.append(f"<response> {turn.response} </response>")
    return "\n".join(parts)


# ----------------------------------------------------------------------------- system prompt

_OUTPUT_FORMAT_HEADER = "**Output Format**"
# The next bold section header after "**Important Notes**" (if any) ends the replaced span.
_NEXT_SECTION_RE = re.compile(r"\n\s*\n\*\*[^*\n]+\*\*\s*\n")

HARMONY_OUTPUT_FORMAT = """**Output Format**
Write your turn as harmony messages, each opened by <|start|>assistant and closed by its terminator:
```plaintext
<|start|>assistant<|channel|>analysis<|message|>Your reasoning<|end|>
<|start|>assistant to=functions.TOOL_NAME<|channel|>commentary json<|message|>{"parameter name": "parameter value"}<|call|>
<|start|>assistant<|channel|>final<|message|>Your reply to the user<|return|>
```

**Important Notes**
1. Always open with exactly one `analysis` message holding your reasoning. After it, call tools, reply on the `final` channel, or do both (tool calls first, then the reply).
2. Every tool call is its own `commentary` message addressed to `functions.` followed by the exact tool name; its content is a JSON object with the call's parameters (`{}` if the tool takes none). To call several tools at once, write one such message per call.
3. The dialogue history shows earlier tool calls as `<tool_call>`, earlier replies as `<response>` and tool feedback as `<obs>` (where present); use it as context, but answer in the harmony format above."""  # noqa: E501


def convert_system_prompt(system_text: str) -> str:
    """Replace the XML ``**Output Format**`` section and its ``**Important Notes**`` with harmony's.

    Everything before ``**Output Format**`` (role line, **Available Tools**, **Steps for Each
    Turn**) is kept byte for byte, as is any section after the notes. Raises ConversionError when
    the prompt has no ``**Output Format**`` section.
    """
    if not isinstance(system_text, str):
        raise ConversionError(f"system prompt is {type(system_text).__name__}, not a string")
    start = system_text.find(_OUTPUT_FORMAT_HEADER)
    if start < 0:
        raise ConversionError("system prompt has no **Output Format** section")
    notes = system_text.find("**Important Notes**", start)
    tail_from = notes if notes >= 0 else start + len(_OUTPUT_FORMAT_HEADER)
    nxt = _NEXT_SECTION_RE.search(system_text, tail_from)
    tail = system_text[nxt.start() :] if nxt else ""
    return system_text[:start] + HARMONY_OUTPUT_FORMAT + tail


# ----------------------------------------------------------------------------- rows and frames


@dataclass
class ConversionStats:
    """Counts of converted output patterns and the rows that could not be converted."""

    n_rows: int = 0
    patterns: Counter = field(default_factory=Counter)
    failures: list[tuple[Any, str]] = field(default_factory=list)  # (row index, reason)

    @property
    def n_converted(self) -> int:
        return self.n_rows - len(self.failures)

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_rows": self.n_rows,
            "n_converted": self.n_converted,
            "n_failed": len(self.failures),
            "patterns": {p: self.patterns.get(p, 0) for p in PATTERNS},
            "failures": [{"index": _plain_index(i), "reason": r} for i, r in self.failures],
        }

    def log(self, what: str) -> None:
        log.info(
            "%s: %d rows, %d converted, %d failed", what, self.n_rows, self.n_converted, len(self.failures)
        )
        for pattern in PATTERNS:
            log.info("%s:   %-30s %d", what, pattern, self.patterns.get(pattern, 0))
        for index, reason in self.failures:
            log.warning("%s: row %s dropped: %s", what, index, reason)


def _plain_index(index: Any) -> Any:
    return index.item() if hasattr(index, "item") else index


def _convert_target(xml_text: str, stats: ConversionStats) -> str:
    turn = parse_xml_turn(xml_text)
    harmony = render_harmony(turn)
    stats.patterns[output_pattern(len(turn.calls), turn.response is not None)] += 1
    return harmony


def _require(row: Mapping[str, Any], key: str) -> Any:
    if key not in row:
        raise ConversionError(f"missing key {key!r}")
    return row[key]


def _convert_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    out, n_system = [], 0
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping) or "role" not in message or "content" not in message:
            raise ConversionError(f"prompt message {i} is not a {{role, content}} mapping")
        message = dict(message)
        if message["role"] == "system":
            message["content"] = convert_system_prompt(message["content"])
            n_system += 1
        out.append(message)
    if n_system != 1:
        raise ConversionError(f"prompt has {n_system} system messages, expected 1")
    return out


def convert_row(row: Mapping[str, Any], stats: ConversionStats | None = None) -> dict[str, Any]:
    """One RLLA row -> its ``rlla_gpt`` twin (system prompt and ground truth converted).

    ``extra_info`` and all other columns are kept as they are (``extra_info.output`` stays the
    XML original). Raises ConversionError naming the problem; ``stats`` (optional) counts the
    output pattern of a converted row.
    """
    stats = stats if stats is not None else ConversionStats()
    reward_model = _require(row, "reward_model")
    if not isinstance(reward_model, Mapping) or "ground_truth" not in reward_model:
        raise ConversionError("missing key 'reward_model.ground_truth'")
    out = dict(row)
    out["prompt"] = _convert_messages(_require(row, "prompt"))
    try:  # last step that can fail, so a failing row never reaches stats.patterns
        out["reward_model"] = {
            **reward_model,
            "ground_truth": _convert_target(reward_model["ground_truth"], stats),
        }
    except ConversionError as err:
        raise ConversionError(f"reward_model.ground_truth: {err}") from err
    out["data_source"] = GPT_OSS_DATA_SOURCE
    return out


def convert_frame(df: pd.DataFrame) -> tuple[pd.DataFrame, ConversionStats]:
    """Convert every row; rows that fail are dropped and listed in ``stats.failures``.

    The result keeps the input's columns (same order) and index labels of the converted rows.
    """
    stats = ConversionStats(n_rows=len(df))
    rows, kept = [], []
    for index, row in zip(df.index, df.to_dict("records")):
        try:
            rows.append(convert_row(row, stats))
            kept.append(index)
        except ConversionError as err:
            stats.failures.append((index, str(err)))
    return pd.DataFrame(rows, index=pd.Index(kept, dtype=df.index.dtype), columns=df.columns), stats


def convert_sft_records(records: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], ConversionStats]:
    """ToolRL SFT records ({instruction, input, output}) -> harmony: instruction's output-format
    section and the output converted, input kept. Failing records are dropped and reported."""
    stats = ConversionStats(n_rows=len(records))
    out = []
    for i, record in enumerate(records):
        try:
            if not isinstance(record, Mapping):
                raise ConversionError(f"record is {type(record).__name__}, not an object")
            instruction = convert_system_prompt(_require(record, "instruction"))
            _require(record, "input")
            output = _convert_target(_require(record, "output"), stats)
        except ConversionError as err:
            stats.failures.append((i, str(err)))
            continue
        out.append({**record, "instruction": instruction, "output": output})
    return out, stats
