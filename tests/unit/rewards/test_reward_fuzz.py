"""Fuzz: random, huge, nested and unbalanced responses always score, finitely, in range, fast.

Speed is checked without timing asserts: the 1 MB degenerate responses are scored in a child
process with a 10 s timeout, so a return of catastrophic backtracking fails instead of hanging
(they take well under a second each; see the report the child prints).
"""

from __future__ import annotations

import json
import logging
import math
import random
import subprocess
import sys
from dataclasses import fields
from pathlib import Path

import pytest
from fuzz_text import HARMONY_FRAGMENTS, XML_FRAGMENTS, soup, synthetic_ground_truths

from src.datamodules.gpt_oss import convert_ground_truth
from src.rewards import gpt_oss, rlla
from src.rewards.rlla import RewardConfig, correctness_range, format_range
from src.router.families import ToolFamilies
from src.router.usage import tool_usage

REPO = Path(__file__).resolve().parents[3]
FLAGS = [f.name for f in fields(RewardConfig)]
XML_GT = synthetic_ground_truths(random.Random(3), 40)
HARMONY_GT = [convert_ground_truth(g) for g in XML_GT]


@pytest.fixture(autouse=True)
def _quiet_errors():
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def _nested(rng: random.Random) -> str:
    depth = rng.choice([10, 1000, 100_000])
    opener, closer = rng.choice([("[", "]"), ('{"a": ', "}")])
    return opener * depth + "1" + closer * rng.choice([0, depth])


def _xml_case(rng: random.Random) -> str:
    kind = rng.randrange(4)
    if kind == 0:
        return soup(rng, XML_FRAGMENTS, rng.choice([1, 10, 100, 5000]))
    if kind == 1:  # nested JSON inside an otherwise valid call block
        return f"<think>x</think>\n<tool_call>\n{_nested(rng)}\n</tool_call>"
    if kind == 2:  # unbalanced: openers only, or closers only, many times
        return rng.choice(["<think>", "</think>", "<tool_call>\n", "\n</tool_call>"]) * rng.randrange(1, 3000)
    return rng.choice(XML_GT) * rng.randrange(1, 200)  # a valid response repeated


def _harmony_case(rng: random.Random) -> str:
    kind = rng.randrange(3)
    if kind == 0:
        return soup(rng, HARMONY_FRAGMENTS, rng.choice([1, 10, 100, 5000]))
    if kind == 1:
        return f"<|start|>assistant to=functions.A<|channel|>commentary json<|message|>{_nested(rng)}<|call|>"
    return rng.choice(HARMONY_GT) * rng.randrange(1, 200)


def _assert_in_range(got, gt: str, step: int, cfg: RewardConfig, has_calls: bool) -> None:
    assert all(math.isfinite(x) for x in (got.total, got.format, got.correctness, got.length)), got
    assert got.format in format_range(step, cfg)
    c_hi, c_lo = correctness_range(step, cfg)
    if has_calls:
        assert min(c_hi, c_lo) - 1e-12 <= got.correctness <= max(c_hi, c_lo) + 1e-12
    else:
        assert got.correctness == 0.0
    assert 0.0 <= got.length <= 1.0
    assert got.total == pytest.approx(got.format + got.correctness + got.length, abs=1e-12)


@pytest.mark.parametrize("seed", range(3))
def test_random_xml_responses_score_finitely_in_range(seed):
    rng = random.Random(seed)
    families = ToolFamilies()
    for _ in range(150):
        response, gt = _xml_case(rng), rng.choice(XML_GT)
        step, cfg = rng.choice([0, 30, 200]), RewardConfig(**{k: rng.random() < 0.4 for k in FLAGS})
        _assert_in_range(rlla.compute_score(response, gt, step, cfg), gt, step, cfg, "<tool_call>" in gt)
        used = tool_usage(response, families, fmt="xml")
        assert used.n_calls == len(used.names) == sum(used.calls_per_family.values())


@pytest.mark.parametrize("seed", range(3))
def test_random_harmony_responses_score_finitely_in_range(seed):
    rng = random.Random(100 + seed)
    families = ToolFamilies()
    for _ in range(150):
        response, i = _harmony_case(rng), rng.randrange(len(XML_GT))
        step, cfg = rng.choice([0, 30, 200]), RewardConfig(**{k: rng.random() < 0.4 for k in FLAGS})
        got = gpt_oss.compute_score(response, HARMONY_GT[i], step, cfg)
        _assert_in_range(got, HARMONY_GT[i], step, cfg, "<tool_call>" in XML_GT[i])
        used = tool_usage(response, families, fmt="harmony")
        assert used.n_calls == len(used.names) == sum(used.calls_per_family.values())


# Scores 1 MB degenerate responses of both formats and reads their tool usage; prints, per
# case, the slowest of reward / usage in seconds and the rewards' totals.
_CHILD = r"""
import json, math, sys, time
sys.path.insert(0, sys.argv[1])
from src.rewards import gpt_oss, rlla
from src.rewards.rlla import RewardConfig
from src.router.families import ToolFamilies
from src.router.usage import tool_usage

MB = 1_000_000
def rep(s): return (s * (MB // len(s) + 1))[:MB]
XML = {
    "think_then_call_openers": "<think>" + rep("</think>\n<tool_call>\n\n"),
    "think_call_response_openers": "<think>" + rep("</think>\n<tool_call>\n\n</tool_call>\n<response>"),
    "call_lines": "<think>x</think>\n<tool_call>\n" + rep('{"name": "A", "parameters": {"x": 1}}\n'),
    "broken_call_lines": "<think>x</think>\n<tool_call>\n" + rep('{"name": \n') + "\n</tool_call>",
    "nested_json": "<think>x</think>\n<tool_call>\n" + "[" * MB + "\n</tool_call>",
    "tool_call_tags": rep("<tool_call>"),
    "long_think": "<think>" + rep("word ") + "</think>",
}
HARMONY = {
    "start_tokens": rep("<|start|>"),
    "calls": rep('<|start|>assistant to=functions.A<|channel|>commentary json<|message|>{"x": 1}<|call|>'),
    "unterminated_calls": rep("<|start|>assistant to=functions.x<|channel|>commentary json<|message|>{"),
    "nested_json": "<|start|>assistant to=functions.A<|channel|>commentary json<|message|>" + "[" * MB + "<|call|>",
}
XML_GT = '<think>p</think>\n<tool_call>\n{"name": "A", "parameters": {"x": 1}}\n</tool_call>\n<response>ok</response>'
HARMONY_GT = ('<|start|>assistant<|channel|>analysis<|message|>p<|end|><|start|>assistant to=functions.A'
              '<|channel|>commentary json<|message|>{"x": 1}<|call|>')
cfg, families, report = RewardConfig(with_length=True), ToolFamilies(), {}
for fmt, cases, score, gt in (("xml", XML, rlla.compute_score, XML_GT), ("harmony", HARMONY, gpt_oss.compute_score, HARMONY_GT)):
    for name, text in cases.items():
        t0 = time.perf_counter(); got = score(text, gt, 0, cfg); t1 = time.perf_counter()
        tool_usage(text, families, fmt=fmt); t2 = time.perf_counter()
        report[f"{fmt}/{name}"] = {"reward_s": t1 - t0, "usage_s": t2 - t1, "total": got.total,
                                   "finite": all(map(math.isfinite, (got.total, got.format, got.correctness, got.length)))}
print(json.dumps(report))
"""


def test_one_megabyte_degenerate_responses_score_quickly_and_finitely():
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, str(REPO)], check=False, capture_output=True, text=True, timeout=10
        )
    except subprocess.TimeoutExpired:
        pytest.fail("scoring eleven 1 MB degenerate responses took over 10 s: backtracking is back")
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(report) == 11
    assert all(case["finite"] for case in report.values()), report
