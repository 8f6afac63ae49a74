"""ToolRL's rule reward for the RLLA XML format, re-implemented as pure functions.

The numbers match ToolRL's public ``rlla`` reward for every response, variant and step; the
eight environment-variable switches of the original are the fields of :class:`RewardConfig`.
Differences are deliberate and do not change any score ToolRL can compute: nothing is printed,
``response`` is the assistant text only (ToolRL strips the chat-template wrapper, then
whitespace; we strip whitespace), and a ground truth whose tool calls cannot be parsed (where
ToolRL raises) is logged and scored with correctness 0 instead of crashing the batch.

Parts (defaults):
    format       0..1   exact <think>/<tool_call>/<response> layout implied by the ground truth
    correctness -3..3   frequency-aware name matching + parameter keys + parameter values
    length       0..1   <think> word count / 512 (only with ``with_length``)

Every reading is a linear scan (``str.find`` / ``partition``): ToolRL's lazy ``.*?`` layout regexes
are quadratic to cubic on degenerate responses (see ``matches_layout`` below); the answers are
identical (tests/rewards/test_parity_fuzz.py compares against a copy of the regex version).

Layouts (``matches_layout``): linear-time matching of "literal, anything, literal, ..., literal"
layouts. ToolRL checks a response's tag layout with patterns such as
``^<think>.*?</think>\\n<tool_call>\\n.*?\\n</tool_call>$`` (``re.DOTALL``). A backtracking
engine tries every occurrence of each inner literal against every occurrence of the next one,
which is quadratic to cubic on degenerate text (``<think>`` then thousands of repeated
``</think>\\n<tool_call>\\n``): a 1 MB model output would stall a training step for minutes.

Such a pattern matches exactly when the text starts with the first literal, ends with the last
one (Python's ``$`` also accepts one trailing ``"\\n"``) and the inner literals occur in order,
without overlapping, in between. Taking the earliest occurrence of each inner literal is never
worse than a later one (every constraint after it is "starts at or after"), so one left-to-right
pass of ``str.find`` decides it: O(len(text)) for the fixed, short literals used here.
"""

from __future__ import annotations

import json
import logging
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from src.config.schema import RewardConfig

__all__ = [
    "RewardBreakdown",
    "RewardConfig",
    "combine_parts",
    "compute_score",
    "correctness_range",
    "format_ok",
    "format_range",
    "length_reward",
    "match_score",
    "matches_layout",
    "tool_call_score",
    "parse_tool_block",
]

log = logging.getLogger(__name__)

FORMAT_RANGE = (1.0, 0.0)
CORRECTNESS_RANGE = (3.0, -3.0)
CORRECTNESS_RANGE_MAX1 = (1.0, -1.0)
LENGTH_RANGE = (1.0, 0.0)


@dataclass(frozen=True)
class RewardBreakdown:
    """One scored response: total = format + correctness + length."""

    total: float
    format: float
    correctness: float
    length: float


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
    # partition, not split: a degenerate text repeats the tag thousands of times
    block = text.partition("<tool_call>")[2].partition("<tool_call>")[0].partition("</tool_call>")[0].strip()
    try:
        return [json.loads(line) for line in block.split("\n")]
    except RecursionError:  # JSON nested deeper than the interpreter's stack: not a call
        raise ValueError("tool-call JSON nested too deep to parse") from None


def ground_truth_ok(ground_truth: str) -> bool:
    """Whether a ground truth can score a response: a tool-call block (if any) of JSON objects."""
    if "<tool_call>" not in ground_truth:
        return True
    try:
        calls = parse_tool_block(ground_truth)
    except ValueError:
        return False
    return all(isinstance(c, dict) for c in calls)


# The layouts ToolRL's regexes describe, as the literals between their lazy ``.*?`` gaps:
# (ground truth has <response>, ground truth has <tool_call>) -> literals. See layout.py.
_FORMAT_LAYOUTS = {
    (True, False): ("<think>", "</think>\n<response>", "</response>"),
    (False, True): ("<think>", "</think>\n<tool_call>\n", "\n</tool_call>"),
    (True, True): ("<think>", "</think>\n<tool_call>\n", "\n</tool_call>\n<response>", "</response>"),
    (False, False): ("<think>", "</think>"),
}


def format_ok(response: str, ground_truth: str) -> bool:
    """Does the response have exactly the tag layout the ground truth has? Linear time."""
    has_resp, has_call = "<response>" in ground_truth, "<tool_call>" in ground_truth
    if not matches_layout(response, _FORMAT_LAYOUTS[(has_resp, has_call)]):
        return False
    tags = (["<response>", "</response>"] if has_resp else []) + (
        ["<tool_call>", "</tool_call>"] if has_call else []
    )
    return all(response.count(tag) == 1 for tag in tags)


def _think_text(response: str) -> str | None:
    if "<think>" not in response or "</think>" not in response:
        return None
    return response.rpartition("<think>")[2].partition("</think>")[0]


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
    except ValueError as err:
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


# ---------------------------------------------------------------------------- layouts
def matches_layout(text: str, literals: Sequence[str]) -> bool:
    """Same answer as ``re.search("^" + ".*?".join(map(re.escape, literals)) + "$", text, re.DOTALL)``.

    Args:
        text: the string to test (any length).
        literals: at least two literal strings; ``.*?`` (any text, newlines included) sits
            between each consecutive pair.
    """
    if len(literals) < 2:
        raise ValueError(f"a layout needs at least two literals, got {len(literals)}")
    first, *inner, last = literals
    if not text.startswith(first):
        return False
    pos = len(first)
    for literal in inner:
        found = text.find(literal, pos)
        if found < 0:
            return False
        pos = found + len(literal)
    return _ends_with_at_or_after(text, last, pos)


def _ends_with_at_or_after(text: str, last: str, pos: int) -> bool:
    """Does ``last`` end the text (or precede its one final newline) starting at or after ``pos``?"""
    if text.endswith(last) and len(text) - len(last) >= pos:
        return True
    # ``$`` without MULTILINE also matches just before a newline that ends the string
    return text.endswith(last + "\n") and len(text) - len(last) - 1 >= pos
