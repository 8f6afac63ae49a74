"""Reference: ``src/rewards/rlla.py`` as it was before the linear-time rewrite (commit 545d290).

Kept verbatim (docstring and ``__all__`` trimmed) as the oracle of the differential test in
test_parity_fuzz.py: its lazy ``.*?`` layout regexes are exact but quadratic to cubic on
degenerate text, so only feed it inputs of a few kilobytes.
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from typing import Any

from src.rewards.rlla import RewardBreakdown, RewardConfig

log = logging.getLogger(__name__)

FORMAT_RANGE = (1.0, 0.0)
CORRECTNESS_RANGE = (3.0, -3.0)
CORRECTNESS_RANGE_MAX1 = (1.0, -1.0)
LENGTH_RANGE = (1.0, 0.0)


class GroundTruthError(ValueError):
    """The ground truth's tool calls cannot be parsed."""


def match_score(list1: list, list2: list, refined: bool = False) -> float:
    """Multiset similarity |A∩B| / (|A|+|B|-|A∩B|), order ignored; 1 for equal lists.

    With ``refined`` only exactly equal lists score (1), anything else 0.
    """
    if list1 == list2:
        return 1.0
    if refined:
        return 0.0
    if not list1 or not list2:
        return 0.0
    count1, count2 = Counter(list1), Counter(list2)
    intersection = sum(min(count1[k], count2[k]) for k in count1.keys() & count2.keys())
    max_possible = len(list1) + len(list2) - intersection
    return intersection / max_possible if max_possible > 0 else 0.0


def format_range(step: int, config: RewardConfig) -> tuple[float, float]:
    """(max, min) of the format reward at ``step`` under the step-scheduled variants."""
    hi, lo = FORMAT_RANGE
    if config.max1_step30_max3 and step >= 30:
        hi, lo = hi / 2, lo / 2
    if config.schedule_reward:
        hi = 2 - (2 - hi) * step / 150
        lo = -2 + (2 + lo) * step / 150
        if hi < 1.0:
            hi = 1.0
        if lo > -1.0:
            lo = -1.0
    return hi, lo


def correctness_range(step: int, config: RewardConfig) -> tuple[float, float]:
    """(max, min) of the correctness reward at ``step`` under the step-scheduled variants."""
    hi, lo = CORRECTNESS_RANGE_MAX1 if config.correct_max1 else CORRECTNESS_RANGE
    if config.max1_step30_max3 and step < 30:
        hi, lo = hi / 3, lo / 3
    if config.schedule_reward:
        hi = (hi - 2) * step / 150 + 2
        lo = (lo + 2) * step / 150 - 2
        if hi > 3.0:
            hi = 3.0
        if lo < -3.0:
            lo = -3.0
    return hi, lo


def length_reward(think: str | None, step: int, config: RewardConfig) -> float:
    """Word count of the reasoning text relative to the target (512, or scheduled 384->640).

    ``think`` is None when the response has no reasoning block (scores the minimum).
    """
    hi, lo = LENGTH_RANGE
    if think is None:
        return lo
    target = (640 - 384) * step / 105 + 384 if config.schedule_length else 512
    ratio = round(len(think.strip().split()) / target, 2)
    if ratio > 1.0:
        ratio = 1.0
    return ratio * (hi - lo) + lo


def tool_call_score(
    gt_tools: list[Any], pd_tools: list[Any], hi: float, lo: float, config: RewardConfig
) -> float:
    """Correctness of predicted calls against ground-truth calls, mapped into [lo, hi].

    Score = name match_score + Σ over ground-truth calls of the best unused predicted call with
    the same name (key match_score + count of equal values), normalised by
    1 + Σ (1 + n_params). Raises on malformed calls (missing keys, wrong types); callers map
    that to the minimum, as ToolRL does.
    """
    if gt_tools == pd_tools:
        return hi
    if config.coarse:
        return lo
    score = match_score([t["name"] for t in gt_tools], [t["name"] for t in pd_tools], config.refined)
    local_max = 1.0
    used: set[int] = set()
    for gt_tool in gt_tools:
        gt_name, gt_params = gt_tool["name"], gt_tool["parameters"]
        local_max += 1.0 if config.intermediate else 1.0 + len(gt_params)
        best, best_score, best_index = None, 0.0, -1
        for i, pd_tool in enumerate(pd_tools):
            if i in used or pd_tool["name"] != gt_name:
                continue
            if config.intermediate:
                if gt_tool == pd_tool:
                    best, best_index, best_score = pd_tool, i, 1.0
                    break
                continue
            pd_params = pd_tool["parameters"]
            key_score = match_score(list(gt_params.keys()), list(pd_params.keys()), config.refined)
            value_score = sum(1.0 for k, v in gt_params.items() if k in pd_params and pd_params[k] == v)
            if key_score + value_score > best_score:
                best, best_score, best_index = pd_tool, key_score + value_score, i
        if best:
            used.add(best_index)
            score += best_score
    return (hi - lo) * score / local_max + lo


def parse_tool_block(text: str) -> list[Any]:
    """JSON lines after the first <tool_call>, up to the next </tool_call> (ToolRL's reading).

    Raises ValueError (json.JSONDecodeError included) when there is no opening tag or a line is
    not JSON. The closing tag is not required here; ``compute_score`` requires it of responses.
    """
    if "<tool_call>" not in text:
        raise ValueError("no <tool_call> tag")
    block = text.split("<tool_call>")[1].split("</tool_call>")[0].strip()
    return [json.loads(line) for line in block.split("\n")]


_FORMAT_PATTERNS = {
    (True, False): r"^<think>.*?</think>\n<response>.*?</response>$",
    (False, True): r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>$",
    (True, True): r"^<think>.*?</think>\n<tool_call>\n.*?\n</tool_call>\n<response>.*?</response>$",
    (False, False): r"^<think>.*?</think>$",
}


def format_ok(response: str, ground_truth: str) -> bool:
    """Does the response have exactly the tag layout the ground truth has?"""
    has_resp, has_call = "<response>" in ground_truth, "<tool_call>" in ground_truth
    if not re.search(_FORMAT_PATTERNS[(has_resp, has_call)], response, re.DOTALL):
        return False
    tags = (["<response>", "</response>"] if has_resp else []) + (
        ["<tool_call>", "</tool_call>"] if has_call else []
    )
    return all(response.count(tag) == 1 for tag in tags)


def _think_text(response: str) -> str | None:
    if "<think>" not in response or "</think>" not in response:
        return None
    return response.split("<think>")[-1].split("</think>")[0]


def compute_score(
    response: str, ground_truth: str, step: int = 0, config: RewardConfig | None = None
) -> RewardBreakdown:
    """Score one assistant response against its RLLA ground truth.

    Args:
        response: the assistant's text only (no chat-template wrapper).
        ground_truth: ``reward_model.ground_truth`` of the row.
        step: the training step (used by the scheduled variants).
        config: reward variants; defaults to all off.
    """
    config = config or RewardConfig()
    response = (response if isinstance(response, str) else "").strip()
    if not isinstance(ground_truth, str):
        log.error("rlla reward: ground truth is %s, not a string; row scored 0", type(ground_truth).__name__)
        return RewardBreakdown(0.0, 0.0, 0.0, 0.0)

    return combine_parts(
        format_ok(response, ground_truth),
        _correctness(response, ground_truth, step, config),
        _think_text(response),
        step,
        config,
    )


def combine_parts(
    layout_ok: bool, correctness: float, think: str | None, step: int, config: RewardConfig
) -> RewardBreakdown:
    """Format (max/min of its scheduled range) + correctness + optional length = total."""
    f_hi, f_lo = format_range(step, config)
    fmt = f_hi if layout_ok else f_lo
    length = length_reward(think, step, config) if config.with_length else 0.0
    return RewardBreakdown(fmt + correctness + length, fmt, correctness, length)


def _correctness(response: str, ground_truth: str, step: int, config: RewardConfig) -> float:
    if "<tool_call>" not in ground_truth:
        return 0.0
    try:
        gt_tools = parse_tool_block(ground_truth)
    except (ValueError, RecursionError) as err:
        log.error(
            "rlla reward: cannot parse the ground truth's tool calls (%s); correctness 0: %.200r",
            err,
            ground_truth,
        )
        return 0.0
    hi, lo = correctness_range(step, config)
    if "</tool_call>" not in response:
        return lo
    try:
        return tool_call_score(gt_tools, parse_tool_block(response), hi, lo, config)
    except Exception:  # any malformed prediction scores the minimum, as in ToolRL
        return lo
