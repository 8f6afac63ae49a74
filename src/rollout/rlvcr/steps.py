"""RLVCR steps: the step format, the prompts that make a model think at a chosen level, and the
steps of collected episodes as RLVCR scores them (parse, level, and the generated action ids).

Format: ``<level>k</level><think>…</think><action>…</action>``. k ∈ {1, 2, 3, 4} is the thinking
level the model chose for this step. Level 1 acts directly and has no ``<think>`` block; levels 2–4
must think first. The parser is lenient about junk a sampled model produces (text before the level
tag, whitespace anywhere, text after ``</action>``, recoverable missing closing tags) but records
every deviation in ``reasons`` so that malformed steps are counted and penalised, never silently
accepted.

Level prompts: RLVCR scores the action a policy took under four thinking contexts (levels 1..4).
The three levels the policy did not pick are produced by asking the same model to continue the same
history at that level: the prompt ends with the forced ``<level>k</level>`` tag (plus ``<think>``
for k > 1) so the generation is thinking text, and everything from ``<action>`` on is cut off
afterwards because the original action is what gets scored.

Collected steps: the action is scored as the ids the policy generated (a slice of the episode's
``response_ids``), never as a re-tokenisation of its decoded text: decode -> encode can merge or
split tokens differently (token drift), and the log-probs the scorer compares would then be of ids
the policy never produced.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

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


LEVEL_INSTRUCTIONS: dict[int, str] = {
    1: "Thinking level 1: do not deliberate. Write no thinking at all and go straight to the action.",
    2: (
        "Thinking level 2: in one or two short sentences, check the current state and confirm "
        "the next action makes sense, then act."
    ),
    3: (
        "Thinking level 3: reason step by step at moderate length: what the goal needs, what "
        "the last observation tells you, and which action follows from that."
    ),
    4: (
        "Thinking level 4: analyse thoroughly before acting: restate the goal, review the "
        "history and the latest observation, weigh several candidate actions and their likely "
        "outcomes, and pick the best one with a reason."
    ),
}

FORMAT_REMINDER = (
    "Answer in the format <level>k</level><think>your thinking</think><action>your action"
    "</action>; level 1 has no <think> block."
)


def _check_level(level: int) -> None:
    if level not in LEVELS:
        raise ValueError(f"level must be one of {list(LEVELS)}, got {level!r}")


def level_tag(level: int) -> str:
    """``<level>k</level>``."""
    _check_level(level)
    return f"{LEVEL_OPEN}{level}{LEVEL_CLOSE}"


def forced_prefix(level: int) -> str:
    """The text the generation is forced to start with: the level tag, plus ``<think>`` if k > 1."""
    return level_tag(level) + ("" if level == 1 else THINK_OPEN)


def build_level_prompt(history: str, level: int) -> str:
    """Prompt text that makes a model write level-``level`` thinking for the next step.

    Layout: ``history`` + blank line + the level's instruction + format reminder + newline +
    ``forced_prefix(level)``. The model's continuation is the thinking text (for level 1 there is
    nothing to generate: its thinking context is just the level tag).
    """
    _check_level(level)
    sep = "" if not history or history.endswith("\n") else "\n"
    return f"{history}{sep}\n{LEVEL_INSTRUCTIONS[level]} {FORMAT_REMINDER}\n{forced_prefix(level)}"


def extract_level_thinking(generated: str, level: int) -> str:
    """The thinking context for ``level`` built from a generation, ready for scoring.

    Args:
        generated: what the model wrote after the forced prefix. A text that contains the level
            tag itself (an engine that echoes the prefix, or a whole original step such as
            ``<level>3</level><think>…</think><action>…</action>``) is accepted too: everything up
            to its ``<think>`` is dropped.
        level: the target level.
    Returns:
        ``<level>k</level>`` for level 1 (anything generated is dropped: level 1 does not think);
        otherwise ``<level>k</level><think>{thinking}</think>`` where ``thinking`` is the
        generation cut right before ``<action>`` and before any ``</think>``, stripped. The
        scorer appends ``<action>`` + the original action to this text, so all four contexts of a
        group (the original step's included) share one normalised layout.
    """
    _check_level(level)
    if level == 1:
        return level_tag(1)
    body = thinking_prefix(generated)
    level_at = body.find(LEVEL_OPEN)
    if level_at >= 0:
        think_at = body.find(THINK_OPEN, level_at)
        body = body[think_at + len(THINK_OPEN) :] if think_at >= 0 else ""
    close_at = body.find(THINK_CLOSE)
    if close_at >= 0:
        body = body[:close_at]
    return f"{level_tag(level)}{THINK_OPEN}{body.strip()}{THINK_CLOSE}"


Encode = Callable[[str], list[int]]


@dataclass
class TagIds:
    """Token ids of the tags, each tokenised on its own (``score_level_groups`` needs this)."""

    action: list[int]
    levels: list[list[int]]
    stop: list[int] = field(default_factory=list)


def tag_ids(encode: Encode) -> TagIds:
    """Tag ids; single-token ``<action>`` / ``</think>`` become stop ids for the alternative-thinking
    generation (multi-token tags rely on max_new_tokens and truncation)."""
    action = encode(ACTION_OPEN)
    stop = [ids[0] for ids in (action, encode(THINK_CLOSE)) if len(ids) == 1]
    return TagIds(action=action, levels=[encode(level_tag(k)) for k in LEVELS], stop=stop)


@dataclass
class ActionTokens:
    """The generated ids of one step's action.

    action_ids: ``turn_ids[start:end]`` exactly; prefix_ids: the context that goes between a
    thinking context and the action (the ``<action>`` tag, or the part of it the action's first
    token does not already hold).
    """

    prefix_ids: list[int]
    action_ids: list[int]
    start: int
    end: int


def decode_with_offsets(
    tokenizer, ids: Sequence[int], drop_ids: set[int]
) -> tuple[str, list[tuple[int, int]]]:
    """Text of ``ids`` without ``drop_ids`` and each id's character span in it (dropped ids: empty)."""
    kept: list[int] = []
    offsets, end = [], 0
    for t in ids:
        if t in drop_ids:
            offsets.append((end, end))
            continue
        kept.append(int(t))
        new_end = len(tokenizer.decode(kept, skip_special_tokens=False))
        offsets.append((end, max(end, new_end)))
        end = max(end, new_end)
    return tokenizer.decode(kept, skip_special_tokens=False), offsets


def action_char_span(text: str, env_action: str) -> tuple[int, int, int | None] | None:
    """(content start, content end, ``<action>`` tag start or None) of the step's action in ``text``:
    the tagged action, else the command the env received where the text holds it."""
    span = action_span(text)
    if span is not None:
        return span[0], span[1], span[0] - len(ACTION_OPEN)
    action = env_action.strip()
    at = text.find(action) if action else -1
    return None if at < 0 else (at, at + len(action), None)


def generated_action_tokens(
    text: str, offsets: list[tuple[int, int]], turn_ids: Sequence[int], env_action: str, encode: Encode
) -> ActionTokens | None:
    """The generated ids whose characters overlap the action (None when there are none, or when the
    first one reaches back before the ``<action>`` tag, so no prefix can be put before it)."""
    where = action_char_span(text, env_action)
    if where is None:
        return None
    lo, hi, tag_at = where
    hits = [i for i, (a, b) in enumerate(offsets) if b > a and a < hi and b > lo]
    if not hits:
        return None
    first_char = offsets[hits[0]][0]
    if tag_at is None:
        prefix = encode(ACTION_OPEN)
    elif first_char < tag_at:
        return None
    else:
        prefix = encode(text[tag_at:first_char])
    start, end = hits[0], hits[-1] + 1
    return ActionTokens(prefix, [int(t) for t in turn_ids[start:end]], start, end)


@dataclass
class StepRef:
    """One step of one episode, as the augmenter sees it.

    parse: the step's parse (its declared level feeds the metrics).
    level / think: what is scored: the step's level (None = not scorable) and its own thinking.
    action: the generated action ids (None when the turn holds no action).
    executed: False for a turn the token budget cut off (never sent to the env): it is neither
        scored nor counted as malformed; its tokens carry the trajectory advantage.
    """

    row: int
    start: int
    end: int
    parse: StepParse
    history_ids: list[int]
    level: int | None
    think: str
    action: ActionTokens | None
    executed: bool = True


def scored_step(parse: StepParse, env_action: str, score_malformed: bool) -> tuple[int | None, str, str]:
    """(level, thinking, action) to score for one step; level None when the step is not scorable.

    A well-formed step is scored as written. A malformed one only with ``score_malformed``: the
    declared level when it parses (else 1), its thinking for levels > 1, and its action (else the
    command the env received); without any action it is not scorable.
    """
    if not parse.malformed:
        return parse.level, parse.think, parse.action
    action = parse.action or env_action.strip()
    if not score_malformed or not action:
        return None, "", ""
    level = parse.level or 1
    return level, (parse.think if level > 1 else ""), action


@dataclass
class StepReader:
    """Turns an episode's steps into :class:`StepRef` (parse, scored level, generated action ids)."""

    tokenizer: Any
    drop_ids: set[int]
    encode: Encode
    allow_unclosed_action: bool = True
    score_malformed: bool = False

    def read(self, row: int, episode: Any, width: int) -> list[StepRef]:
        prompt, response = list(episode.prompt_ids), [int(t) for t in episode.response_ids]
        return [self.read_step(row, j, st, prompt, response, width) for j, st in enumerate(episode.steps)]

    def read_step(
        self, row: int, j: int, st: Any, prompt: list[int], response: list[int], width: int
    ) -> StepRef:
        if not 0 <= st.action_start <= st.action_end <= min(len(response), width):
            raise ValueError(
                f"RLVCR: episode {row} step {j}: token span [{st.action_start}, {st.action_end}) "
                f"is outside its {len(response)} response tokens (batch width {width})"
            )
        turn = response[st.action_start : st.action_end]
        # the turn's own ids, decoded without its stop token (generated_text keeps it)
        text, offsets = decode_with_offsets(self.tokenizer, turn, self.drop_ids)
        parse = parse_step(text, allow_unclosed_action=self.allow_unclosed_action)
        level, think, action = scored_step(parse, st.action_text, self.score_malformed)
        tokens = generated_action_tokens(text, offsets, turn, action, self.encode) if level else None
        history = prompt + response[: st.action_start]
        executed = bool(getattr(st, "executed", True))
        return StepRef(row, st.action_start, st.action_end, parse, history, level, think, tokens, executed)
