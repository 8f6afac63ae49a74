"""Prompts that make a model think at a chosen RLVCR level, and the parse of what it wrote.

RLVCR scores the action a policy took under four thinking contexts (levels 1..4). The three
levels the policy did not pick are produced by asking the same model to continue the same
history at that level: the prompt ends with the forced ``<level>k</level>`` tag (plus
``<think>`` for k > 1) so the generation is thinking text, and everything from ``<action>`` on
is cut off afterwards because the original action is what gets scored.
"""

from __future__ import annotations

from src.rollout.rlvcr.format import (
    LEVEL_CLOSE,
    LEVEL_OPEN,
    LEVELS,
    THINK_CLOSE,
    THINK_OPEN,
    thinking_prefix,
)

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
