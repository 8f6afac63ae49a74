"""RLVCR step format: ``<level>k</level><think>…</think><action>…</action>``.

k ∈ {1, 2, 3, 4} is the thinking level the model chose for this step. Level 1 acts directly and
has no ``<think>`` block; levels 2–4 must think first. The parser is lenient about junk a sampled
model produces (text before the level tag, whitespace anywhere, text after ``</action>``,
recoverable missing closing tags) but records every deviation in ``reasons`` so that malformed
steps are counted and penalised, never silently accepted.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

LEVELS: tuple[int, ...] = (1, 2, 3, 4)
LEVEL_OPEN, LEVEL_CLOSE = "<level>", "</level>"
THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
ACTION_OPEN, ACTION_CLOSE = "<action>", "</action>"

# Closed level tag first; an unclosed one (``<level>3<think>…``) is recovered from its digits.
_LEVEL_CLOSED = re.compile(r"<level>\s*([^<]*?)\s*</level>", re.DOTALL)
_LEVEL_UNCLOSED = re.compile(r"<level>\s*(\d+)", re.DOTALL)


@dataclass
class StepParse:
    """One parsed step.

    level: the declared level (1..4), or None when absent / not an integer in 1..4.
    think: the thinking text, stripped ("" when there is no think block).
    action: the action text, stripped ("" when there is none).
    malformed: True when any rule of the format is broken (see ``reasons``).
    reasons: short human-readable descriptions of each broken rule.
    """

    level: int | None
    think: str
    action: str
    malformed: bool
    reasons: list[str] = field(default_factory=list)


def action_tag_start(text: str) -> int | None:
    """Character index of the first ``<action>`` tag, or None when absent."""
    i = text.find(ACTION_OPEN)
    return None if i < 0 else i


def action_span(text: str) -> tuple[int, int] | None:
    """Half-open character span ``[start, end)`` of the first action's *content*.

    ``start`` is just after ``<action>``; ``end`` is the matching ``</action>`` or, when that is
    missing, the end of the text (the engine may have stopped on the closing tag). Content is not
    stripped, so ``text[start:end]`` is exactly what the model wrote between the tags.
    Returns None when there is no ``<action>`` tag.
    """
    open_at = action_tag_start(text)
    if open_at is None:
        return None
    start = open_at + len(ACTION_OPEN)
    close_at = text.find(ACTION_CLOSE, start)
    return start, (len(text) if close_at < 0 else close_at)


def thinking_prefix(text: str) -> str:
    """The text up to, not including, the first ``<action>`` tag (whole text if there is none).

    Not stripped, so the prefix plus ``<action>`` re-concatenates to the original text.
    """
    open_at = action_tag_start(text)
    return text if open_at is None else text[:open_at]


def token_span_from_offsets(offsets: list[tuple[int, int]], span: tuple[int, int]) -> tuple[int, int]:
    """Token index range ``[t0, t1)`` of the tokens overlapping a character span.

    Args:
        offsets: per-token ``(char_start, char_end)`` as returned by a fast tokenizer with
            ``return_offsets_mapping=True``; zero-width special tokens are ignored.
        span: half-open character span, e.g. from ``action_span``.
    Returns:
        ``(t0, t1)``; ``t0 == t1`` when no token overlaps the span.
    """
    lo, hi = span
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < hi and b > lo]
    return (hits[0], hits[-1] + 1) if hits else (0, 0)


def _parse_level(text: str, reasons: list[str]) -> tuple[int | None, int]:
    """Returns (level or None, index just past the level tag or 0 when there is none)."""
    m = _LEVEL_CLOSED.search(text)
    if m is None:
        m = _LEVEL_UNCLOSED.search(text)
        if m is None:
            reasons.append("no <level> tag")
            return None, 0
        reasons.append("missing </level>")
    raw = m.group(1).strip()
    if not raw.isdigit() or int(raw) not in LEVELS:
        reasons.append(f"level {raw!r} is not one of {list(LEVELS)}")
        return None, m.end()
    return int(raw), m.end()


def _parse_think(body: str, reasons: list[str]) -> tuple[str | None, int]:
    """Think text (None when there is no block) and the index where it ends inside ``body``."""
    open_at = body.find(THINK_OPEN)
    if open_at < 0:
        return None, 0
    start = open_at + len(THINK_OPEN)
    close_at = body.find(THINK_CLOSE, start)
    if close_at >= 0:
        return body[start:close_at].strip(), close_at + len(THINK_CLOSE)
    # unclosed: the thinking runs up to the action tag (or the end when there is no action)
    reasons.append("missing </think>")
    action_at = body.find(ACTION_OPEN, start)
    end = len(body) if action_at < 0 else action_at
    return body[start:end].strip(), end


def parse_step(text: str, allow_unclosed_action: bool = False) -> StepParse:
    """Parse one step written in the RLVCR format.

    Args:
        text: the model's step output.
        allow_unclosed_action: accept a missing ``</action>`` at the end without marking the step
            malformed (for engines that strip the stop string they stopped on).
    Returns:
        StepParse. Rules checked: a level tag with k in 1..4; closed tags; level 1 has no think
        block and levels 2–4 have a non-empty one; exactly one non-empty action block that
        comes after the thinking.
    """
    if not isinstance(text, str):
        raise TypeError(f"parse_step expects str, got {type(text).__name__}")
    reasons: list[str] = []
    level, after_level = _parse_level(text, reasons)
    body = text[after_level:]

    think, think_end = _parse_think(body, reasons)
    span = action_span(body)
    action = ""
    if span is None:
        reasons.append("no <action> block")
    else:
        action = body[span[0] : span[1]].strip()
        if span[1] == len(body) and not body.endswith(ACTION_CLOSE) and not allow_unclosed_action:
            reasons.append("missing </action>")
        if not action:
            reasons.append("empty action")
        if think is not None and span[0] - len(ACTION_OPEN) < think_end:
            reasons.append("<action> before </think>")
        if body.count(ACTION_OPEN) > 1:
            reasons.append("more than one <action> block")

    if level == 1 and think is not None:
        reasons.append("level 1 must not have a <think> block")
    if level is not None and level > 1 and not think:
        reasons.append(f"level {level} needs a non-empty <think> block")

    return StepParse(
        level=level,
        think=think or "",
        action=action,
        malformed=bool(reasons),
        reasons=reasons,
    )


def format_penalty(parse: StepParse, penalty: float) -> float:
    """Reward term for the format: ``-|penalty|`` when the step is malformed, else 0.0.

    The sign of ``penalty`` is ignored so configs may write it either way.
    """
    return -abs(float(penalty)) if parse.malformed else 0.0


def format_step(level: int, think: str, action: str) -> str:
    """Render a well-formed step (level 1 drops ``think``). Used for prompts and tests."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {list(LEVELS)}, got {level!r}")
    thinking = "" if level == 1 else f"{THINK_OPEN}{think}{THINK_CLOSE}"
    return f"{LEVEL_OPEN}{level}{LEVEL_CLOSE}{thinking}{ACTION_OPEN}{action}{ACTION_CLOSE}"
