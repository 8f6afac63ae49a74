"""ToolRL's rule reward for GPT-OSS harmony responses (``data_source == "rlla_gpt"``).

Same config, ranges and matching as :mod:`src.rewards.rlla`; only the reading of the text
differs. Parts (defaults):

    format       0..1   the response is exactly the block sequence the ground truth implies
    correctness -3..3   rlla's tool-call matching on calls read from commentary blocks
    length       0..1   analysis-channel word count / 512 (only with ``with_length``)

Format. The ground truth's pattern (tool calls? final reply?) fixes the sequence: one analysis
block (``<|end|>``), then — if the ground truth calls tools — one or more tool-call blocks
(recipient ``functions.NAME``, channel ``commentary``, content type ``json`` or
``<|constrain|>json``, a JSON object, ``<|call|>``), then — if it replies — one final block
ending with ``<|return|>`` or, as at inference, ``<|end|>``. Nothing but whitespace between
blocks; every block's role is ``assistant``. Like ToolRL's layout check, the number of calls is
left to correctness.

Correctness. No tool call in the ground truth → 0. Otherwise the response must read as harmony
without a malformed block (missing terminator, unknown channel, broken JSON, call without a
name…) and contain at least one call, else the minimum; then ``rlla.tool_call_score``.

Response start. The response is what the model generated after a generation prompt ending in
``<|start|>assistant``, so it may begin with ``<|channel|>`` (or `` to=``); we then prepend
``<|start|>assistant`` before reading. A response that already starts with
``<|start|>assistant`` is read as is. The stop tokens (``<|return|>``, ``<|call|>``) must be kept
in the decoded text.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from src.config.schema import RewardConfig
from src.formats.harmony import (
    CALL,
    END,
    FUNCTIONS_PREFIX,
    RETURN,
    HarmonyBlock,
    HarmonyParse,
    block_tool_call,
    parse_harmony,
    tool_calls_of,
)
from src.rewards.rlla import RewardBreakdown, combine_parts, correctness_range, tool_call_score

__all__ = ["RewardBreakdown", "RewardConfig", "compute_score", "format_ok", "normalize_response"]

log = logging.getLogger(__name__)

GENERATION_PROMPT = "<|start|>assistant"


def normalize_response(response: str) -> str:
    """Strip whitespace; prepend ``<|start|>assistant`` when the text starts inside that header."""
    text = response.strip()
    if text.startswith("<|channel|>"):
        return GENERATION_PROMPT + text
    if text.startswith("to="):
        return GENERATION_PROMPT + " " + text
    return text


def _is_analysis(block: HarmonyBlock) -> bool:
    return block.channel == "analysis" and block.recipient is None and block.terminator == END


def _is_final(block: HarmonyBlock) -> bool:
    return block.channel == "final" and block.recipient is None and block.terminator in (RETURN, END)


def _is_tool_call(block: HarmonyBlock) -> bool:
    if block.channel != "commentary" or block.content_type != "json" or block.recipient is None:
        return False
    if not block.recipient.startswith(FUNCTIONS_PREFIX):
        return False
    try:
        return block_tool_call(block) is not None
    except ValueError:
        return False


def _blocks_match(blocks: Sequence[HarmonyBlock], has_calls: bool, has_final: bool) -> bool:
    """Is ``blocks`` analysis, then ≥1 tool calls iff ``has_calls``, then a final iff ``has_final``?"""
    if not blocks or not _is_analysis(blocks[0]):
        return False
    rest = list(blocks[1:])
    if has_final:
        if not rest or not _is_final(rest[-1]):
            return False
        rest = rest[:-1]
    if has_calls != bool(rest):
        return False
    return all(_is_tool_call(b) for b in rest)


def format_ok(response: str, ground_truth: str) -> bool:
    """Does the (normalised) response have exactly the block layout the ground truth implies?"""
    return _format_ok(parse_harmony(normalize_response(response)), parse_harmony(ground_truth))


def _format_ok(response: HarmonyParse, ground_truth: HarmonyParse) -> bool:
    gt_blocks = ground_truth.blocks
    has_final = any(b.channel == "final" for b in gt_blocks)
    has_calls = any(b.recipient is not None or b.terminator == CALL for b in gt_blocks)
    if not response.well_formed or any(b.role != "assistant" for b in response.blocks):
        return False
    return _blocks_match(response.blocks, has_calls, has_final)


def _analysis_text(response: HarmonyParse) -> str | None:
    """The first complete analysis block's text (None when there is none), for the length part."""
    for block in response.blocks:
        if block.error is None and _is_analysis(block):
            return block.message
    return None


def ground_truth_ok(ground_truth: str) -> bool:
    """Whether a harmony ground truth can score a response: blocks whose tool calls parse."""
    parsed = parse_harmony(ground_truth)
    if not parsed.blocks:
        return False
    try:
        tool_calls_of(parsed)
    except (ValueError, RecursionError):
        return False
    return True


def compute_score(
    response: str, ground_truth: str, step: int = 0, config: RewardConfig | None = None
) -> RewardBreakdown:
    """Score one harmony response against its ``rlla_gpt`` ground truth.

    Args:
        response: the generated assistant text, with or without the leading ``<|start|>assistant``.
        ground_truth: ``reward_model.ground_truth`` of the row (harmony).
        step: the training step (used by the scheduled variants).
        config: reward variants; defaults to all off.
    """
    config = config or RewardConfig()
    parsed = parse_harmony(normalize_response(response if isinstance(response, str) else ""))
    if not isinstance(ground_truth, str):
        log.error(
            "gpt_oss reward: ground truth is %s, not a string; row scored 0", type(ground_truth).__name__
        )
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0)
    gt_parsed = parse_harmony(ground_truth)
    if not gt_parsed.blocks:
        log.error(
            "gpt_oss reward: the ground truth has no harmony block (XML data under rlla_gpt?): %.120r",
            ground_truth,
        )

    return combine_parts(
        _format_ok(parsed, gt_parsed),
        _correctness(parsed, gt_parsed, step, config),
        _analysis_text(parsed),
        step,
        config,
    )


def _correctness(
    response: HarmonyParse, ground_truth: HarmonyParse, step: int, config: RewardConfig
) -> float:
    try:
        gt_tools = tool_calls_of(ground_truth)
    except ValueError as err:
        log.error("gpt_oss reward: cannot parse the ground truth's tool calls (%s); correctness 0", err)
        return 0.0
    if not gt_tools:
        return 0.0
    hi, lo = correctness_range(step, config)
    try:
        pd_tools = tool_calls_of(response)
    except ValueError:
        return lo
    if not pd_tools:  # as rlla: a response without a tool-call block scores the minimum
        return lo
    try:
        return tool_call_score(gt_tools, pd_tools, hi, lo, config)
    except Exception:  # any malformed prediction scores the minimum, as in ToolRL
        return lo
