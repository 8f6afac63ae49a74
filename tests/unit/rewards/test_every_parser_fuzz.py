"""Every parser in src/rewards and src/jobs/api_bank.py, fed hostile text, returns instead of raising
(or raises only the ValueError its contract names). A new public function must be listed here,
as a parser fuzzed below or as a non-parser with the reason, so the fuzz keeps covering them all.
"""

from __future__ import annotations

import importlib
import inspect
import json
import logging
import math
import pkgutil
import random

import pytest
from fuzz_text import HARMONY_FRAGMENTS, XML_FRAGMENTS, soup, synthetic_ground_truths

import src.rewards
from src.datamodules.gpt_oss import convert_ground_truth
from src.jobs import api_bank as api_bank_job
from src.rewards import api_bank, dispatch, gpt_oss, rlla
from src.rewards.rlla import RewardConfig

FUZZED = {
    "src.rewards.api_bank": {"api_bank_calls", "api_bank_correct", "expected_call"},
    "src.rewards.dispatch": {"row_problem", "score"},
    "src.rewards.gpt_oss": {"compute_score", "format_ok", "ground_truth_ok", "normalize_response"},
    "src.rewards.rlla": {
        "compute_score",
        "format_ok",
        "ground_truth_ok",
        "parse_tool_block",
        "length_reward",
        "matches_layout",
    },
    "src.jobs.api_bank": {"evaluate_api_bank", "load_api_bank"},
}
NOT_PARSERS = {
    # name lookups (unknown names raise KeyError), and a guard (raising on non-finite rewards is its job)
    "src.rewards.dispatch": {"reward_fn", "response_format", "check_finite_rewards"},
    # math on already-parsed values; compute_score maps their errors on malformed calls to the minimum
    "src.rewards.rlla": {
        "combine_parts",
        "correctness_range",
        "format_range",
        "match_score",
        "tool_call_score",
    },
    # tables and generators over already-scored rows / a model: no text is parsed
    "src.jobs.api_bank": {
        "level_table",
        "markdown_table",
        "make_model_generator",
        "make_run_generator",
        "write_level_table",
    },
}

XML_GT = synthetic_ground_truths(random.Random(5), 20)
HARMONY_GT = [convert_ground_truth(g) for g in XML_GT]
DEEP = 100_000


def _hostile() -> list:
    """The issue's cases and their relatives, both formats; then random soups."""
    call = "<think>x</think>\n<tool_call>\n{}\n</tool_call>"
    hcall = "<|start|>assistant to=functions.A<|channel|>commentary json<|message|>{}<|call|>"
    payloads = [
        "[" * 1000,
        "[" * DEEP,
        '{"a": ' * DEEP,
        "[" * DEEP + "]" * DEEP,
        '{"name": "A", "parameters": {"x": NaN}}',
        '{"name": "A", "parameters": {"x": 1e999}}',
        '{"name": "A", "parameters": {"x": -Infinity}}',
        '{"name": "\ud800", "parameters": {"\udfff": "\ud83d"}}',
        '{"name": "A", "parameters": ' + "[" * 900 + "]" * 900 + "}",
        "\x00\x01\x7f",
    ]
    texts = [
        "",
        " ",
        "\ud800",
        "<tool_call>",
        "</tool_call>",
        "<tool_call>\n" + "[" * 1000 + "\n</tool_call>",
    ]
    texts += [call.replace("{}", p) for p in payloads]
    texts += [hcall.replace("{}", p) for p in payloads]
    texts += ["<tool_call>\n" * 5000, "<|start|>" * 5000, "x" * 1_000_000]
    rng = random.Random(0)
    texts += [soup(rng, XML_FRAGMENTS, rng.choice([1, 10, 300])) for _ in range(60)]
    texts += [soup(rng, HARMONY_FRAGMENTS, rng.choice([1, 10, 300])) for _ in range(60)]
    return texts


HOSTILE = _hostile()
NON_STRINGS = [None, 3, 2.5, math.nan, b"<tool_call>", ["<tool_call>"], {"a": 1}]


@pytest.fixture(autouse=True)
def _quiet():
    logging.disable(logging.ERROR)
    yield
    logging.disable(logging.NOTSET)


def test_every_public_function_is_fuzzed_or_listed():
    modules = ["src.rewards." + m.name for m in pkgutil.iter_modules(src.rewards.__path__)]
    unlisted = []
    for name in [*modules, "src.jobs.api_bank"]:
        mod = importlib.import_module(name)
        for fn, obj in inspect.getmembers(mod, inspect.isfunction):
            if fn.startswith("_") or obj.__module__ != name:
                continue
            if fn not in FUZZED.get(name, set()) | NOT_PARSERS.get(name, set()):
                unlisted.append(f"{name}.{fn}")
    assert unlisted == [], "list each new public function in FUZZED (and fuzz it) or NOT_PARSERS"


def _finite(breakdown) -> bool:
    return all(
        math.isfinite(x) for x in (breakdown.total, breakdown.format, breakdown.correctness, breakdown.length)
    )


def test_rlla_parsers_never_raise():
    cfg = RewardConfig(with_length=True)
    gts = XML_GT[:4] + HOSTILE[:30]
    for text in HOSTILE:
        for gt in gts[:6]:
            assert _finite(rlla.compute_score(text, gt, 0, cfg))
            assert isinstance(rlla.format_ok(text, gt), bool)
        assert _finite(rlla.compute_score(XML_GT[0], text, 0, cfg))  # hostile ground truth
        assert isinstance(rlla.ground_truth_ok(text), bool)
        assert math.isfinite(rlla.length_reward(text, 0, cfg))
        try:
            rlla.parse_tool_block(text)
        except ValueError:
            pass  # its contract: ValueError for text that is not a call block
    for obj in NON_STRINGS:
        assert _finite(rlla.compute_score(obj, XML_GT[0], 0, cfg))
        assert _finite(rlla.compute_score(XML_GT[0], obj, 0, cfg))


def test_harmony_parsers_never_raise():
    cfg = RewardConfig(with_length=True)
    for text in HOSTILE:
        for gt in HARMONY_GT[:4] + [text]:
            assert _finite(gpt_oss.compute_score(text, gt, 0, cfg))
            assert isinstance(gpt_oss.format_ok(text, gt), bool)
        assert isinstance(gpt_oss.ground_truth_ok(text), bool)
        assert isinstance(gpt_oss.normalize_response(text), str)
    for obj in NON_STRINGS:
        assert _finite(gpt_oss.compute_score(obj, HARMONY_GT[0], 0, cfg))
        assert _finite(gpt_oss.compute_score(HARMONY_GT[0], obj, 0, cfg))


def test_layout_and_dispatch_never_raise():
    for text in HOSTILE:
        assert isinstance(
            rlla.matches_layout(text, ("<think>", "</think>\n<tool_call>\n", "\n</tool_call>")), bool
        )
        for source in ("rlla", "rlla_gpt", "toolbench", "", "\ud800"):
            assert dispatch.row_problem(source, text) in (
                None,
                "unknown_data_source",
                "unparseable_ground_truth",
            )
        assert _finite(dispatch.score("rlla", text, XML_GT[1]))
        assert _finite(dispatch.score("rlla_gpt", text, HARMONY_GT[1]))


ANSWER = {"name": "A", "parameters": {"x": 1}}


def test_api_bank_parsers_never_raise():
    assert api_bank.api_bank_calls("<tool_call>\n" + "[" * 1000 + "\n</tool_call>") == []  # the case
    for text in HOSTILE:
        calls = api_bank.api_bank_calls(text)
        assert isinstance(calls, list)
        assert isinstance(api_bank.api_bank_correct(calls, ANSWER), bool)
    for obj in NON_STRINGS:
        assert api_bank.api_bank_calls(obj) == []
    deep = [[]]
    for _ in range(DEEP):
        deep = [deep]
    odd = [deep, {"name": "A", "parameters": deep}, math.nan, None, "[" * DEEP, "{", 1e308, {"name": deep}]
    assert api_bank.api_bank_correct(odd, ANSWER) in (True, False)
    for answer in (None, [], "x", [None], {"name": "A"}, deep):
        with pytest.raises(ValueError):
            api_bank.expected_call(answer)


def test_api_bank_evaluation_scores_every_hostile_response():
    items = [
        api_bank_job.ApiBankItem(1, i, [{"role": "user", "content": "q"}], ANSWER)
        for i in range(len(HOSTILE))
    ]
    responses = iter(HOSTILE)

    def generate(batch):
        return [next(responses) for _ in batch], [None] * len(batch)

    rows = api_bank_job.evaluate_api_bank(items, generate, batch_size=16)
    assert len(rows) == len(HOSTILE) and rows["correct"].dtype == bool


@pytest.mark.parametrize(
    "content",
    [
        b"\xff\xfe",
        b"",
        b"{",
        b'{"a": 1}',
        b"[" * 100_000,
        b"[1, 2]",
        b'[{"system": "s"}]',
        b'[{"system": "s", "user": "u", "answer": []}]',
    ],
)
def test_api_bank_loader_names_the_file(tmp_path, content):
    for level in (1, 2, 3):
        (tmp_path / f"level-{level}-api_processed.json").write_bytes(content)
    with pytest.raises(ValueError, match="level-1-api_processed.json"):
        api_bank_job.load_api_bank(tmp_path)


def test_api_bank_loader_reads_good_rows(tmp_path):
    row = {"system": "s", "user": "u", "answer": ANSWER}
    for level in (1, 2, 3):
        (tmp_path / f"level-{level}-api_processed.json").write_text(json.dumps([row]))
    assert len(api_bank_job.load_api_bank(tmp_path)) == 3
