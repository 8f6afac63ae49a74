"""The harmony reward: maximum on converted targets, XML parity on perturbations, floor on garbage."""

from __future__ import annotations

import copy
import json
import random
from dataclasses import fields
from pathlib import Path

import pandas as pd
import pytest

from src.datamodules.gpt_oss import convert_ground_truth
from src.formats.harmony import parse_harmony, parse_harmony_tool_calls
from src.rewards import gpt_oss, rlla
from src.rewards.rlla import RewardConfig, correctness_range, format_range, length_reward

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
TEST_PARQUET = DATA / "rlla_4k" / "test.parquet"
SFT_JSON = DATA / "rlla_4k_raw" / "rlla_sft.json"

# Default, each variant alone, and two combinations ToolRL's scripts use.
CONFIGS = (
    [RewardConfig()]
    + [RewardConfig(**{f.name: True}) for f in fields(RewardConfig)]
    + [
        RewardConfig(with_length=True, schedule_length=True, schedule_reward=True),
        RewardConfig(correct_max1=True, refined=True, with_length=True),
    ]
)
STEPS = (0, 35, 160)

CALL_GT = convert_ground_truth(
    '<think> pick the tool </think>\n<tool_call>\n{"name": "GetNews", "parameters": {"page": "1"}}\n'
    '{"name": "Domain WHOIS Lookup API", "parameters": {"domain_name": "a.com"}}\n</tool_call>'
)
ANSWER_GT = convert_ground_truth("<think> just answer </think>\n<response> Hello there </response>")


@pytest.fixture(scope="module")
def xml_targets() -> list[str]:
    """Every real XML target: 80 test rows + 400 SFT outputs."""
    if not TEST_PARQUET.is_file() or not SFT_JSON.is_file():
        pytest.skip("real RLLA data not present")
    df = pd.read_parquet(TEST_PARQUET)
    sft = json.loads(SFT_JSON.read_text(encoding="utf-8"))
    return [g["ground_truth"] for g in df["reward_model"]] + [r["output"] for r in sft]


def _all_parts_at(response: str, gt: str, cfg: RewardConfig, step: int, fmt: float, corr: float) -> None:
    got = gpt_oss.compute_score(response, gt, step, cfg)
    assert (got.format, got.correctness) == (fmt, corr), (cfg, step, response[:200])
    assert got.total == got.format + got.correctness + got.length


# ----------------------------------------------------------------------------- maximum on targets


def test_converted_targets_score_the_maximum(xml_targets):
    for i, xml in enumerate(xml_targets):
        harmony = convert_ground_truth(xml)
        has_call = "<|call|>" in harmony
        best = gpt_oss.compute_score(harmony, harmony)
        assert (best.format, best.correctness, best.total) == (
            (1.0, 3.0, 4.0) if has_call else (1.0, 0.0, 1.0)
        )
        if i % 4:  # every variant and step on a quarter of the rows keeps the test fast
            continue
        for cfg in CONFIGS:
            for step in STEPS:
                c_hi = correctness_range(step, cfg)[0] if has_call else 0.0
                _all_parts_at(harmony, harmony, cfg, step, format_range(step, cfg)[0], c_hi)


def test_length_reads_the_analysis_channel(xml_targets):
    cfg = RewardConfig(with_length=True)
    for xml in xml_targets[80:120]:  # SFT rows: long reasoning
        harmony = convert_ground_truth(xml)
        think = xml.split("<think>", 1)[1].split("</think>", 1)[0]
        assert gpt_oss.compute_score(harmony, harmony, 0, cfg).length == length_reward(think, 0, cfg) > 0.1
    no_analysis = CALL_GT.split("\n", 1)[1]
    assert gpt_oss.compute_score(no_analysis, CALL_GT, 0, cfg).length == 0.0


def test_response_with_or_without_the_generation_prompt():
    """The response may start after ``<|start|>assistant``; a final may end with <|end|>; blocks may touch."""
    gt_both = CALL_GT + "\n<|start|>assistant<|channel|>final<|message|>Done<|return|>"
    for gt in (CALL_GT, ANSWER_GT, gt_both):
        want = gpt_oss.compute_score(gt, gt)
        assert want.format == 1.0
        variants = [
            gt[len("<|start|>assistant") :],  # generation prompt already held <|start|>assistant
            gt.replace("\n<|start|>", "<|start|>"),  # as generated: no newline between blocks
            "  \n" + gt.replace("\n", "\n\n ") + "\n",
            gt.replace("<|return|>", "<|end|>"),  # inference stops the final block with <|end|>
        ]
        for response in variants:
            assert gpt_oss.compute_score(response, gt) == want, response


def test_model_style_tool_call_header_is_accepted():
    """GPT-OSS writes the recipient after the channel, with <|constrain|>json."""
    response = (
        "<|channel|>analysis<|message|>need news<|end|>"
        '<|start|>assistant<|channel|>commentary to=functions.GetNews <|constrain|>json<|message|>{"page": "1"}<|call|>'
        "<|start|>assistant<|channel|>commentary to=functions.Domain WHOIS Lookup API json<|message|>"
        '{"domain_name":"a.com"}<|call|>'
    )
    assert gpt_oss.compute_score(response, CALL_GT) == rlla.RewardBreakdown(4.0, 1.0, 3.0, 0.0)


# ----------------------------------------------------------------------------- parity with XML


def _perturb(calls: list[dict], rng: random.Random) -> tuple[str, list[dict]]:
    calls = copy.deepcopy(calls)
    kind = rng.choice(
        ["same", "drop", "rename", "value", "key", "add_key", "drop_key", "add_call", "dup_call",
         "shuffle", "type", "empty_params", "none", "multi"]
    )  # fmt: skip
    with_params = [c for c in calls if c["parameters"]]
    if kind == "drop" and calls:
        calls.pop(rng.randrange(len(calls)))
    elif kind == "rename" and calls:
        rng.choice(calls)["name"] += "_v2"
    elif kind in ("value", "key", "drop_key", "type") and with_params:
        params = rng.choice(with_params)["parameters"]
        key = rng.choice(list(params))
        if kind == "value":
            params[key] = f"{params[key]}!"
        elif kind == "key":
            params[key + "_x"] = params.pop(key)
        elif kind == "drop_key":
            del params[key]
        else:
            params[key] = str(params[key]) if not isinstance(params[key], str) else 7
    elif kind == "add_key" and calls:
        rng.choice(calls)["parameters"]["extra"] = "yes"
    elif kind == "add_call":
        calls.append({"name": "UnrelatedTool", "parameters": {"q": "x"}})
    elif kind == "dup_call" and calls:
        calls.append(copy.deepcopy(rng.choice(calls)))
    elif kind == "shuffle":
        rng.shuffle(calls)
    elif kind == "empty_params" and calls:
        rng.choice(calls)["parameters"] = {}
    elif kind == "none":
        calls = []
    elif kind == "multi":
        for _ in range(3):
            _, calls = _perturb(calls, rng)
    return kind, calls


def _xml_response(think: str, calls: list[dict], response: str | None) -> str:
    parts = [f"<think> {think} </think>"]
    if calls:
        parts.append("<tool_call>\n" + "\n".join(json.dumps(c) for c in calls) + "\n</tool_call>")
    if response is not None or not calls:
        parts.append(f"<response> {response or 'Sure.'} </response>")
    return "\n".join(parts)


def test_perturbed_calls_score_as_their_xml_twins(xml_targets):
    """Harmony and XML scores agree on every part, for hundreds of perturbations of real targets."""
    rng = random.Random(1234)
    # rlla misreads targets whose <think> mentions <tool_call> (it splits on the first tag); skip those.
    usable = [x for x in xml_targets if "<tool_call>" not in x.split("</think>", 1)[0]]
    n_pairs, kinds, differing = 0, set(), 0
    for xml_gt in rng.sample(usable, 120):
        harmony_gt = convert_ground_truth(xml_gt)
        gt_calls = parse_harmony_tool_calls(harmony_gt)
        gt_response = "Sure." if "<response>" in xml_gt else None
        for _ in range(3):
            kind, calls = _perturb(gt_calls, rng)
            think = " ".join(rng.choice(["a", "bb", "ccc"]) for _ in range(rng.randrange(0, 700)))
            xml_resp = _xml_response(think, calls, gt_response if rng.random() < 0.8 else None)
            harmony_resp = convert_ground_truth(xml_resp)
            for cfg in CONFIGS:
                for step in STEPS[:2]:  # 0 and 35: both sides of MAX1STEP30MAX3, mid-schedule
                    want = rlla.compute_score(xml_resp, xml_gt, step, cfg)
                    got = gpt_oss.compute_score(harmony_resp, harmony_gt, step, cfg)
                    assert got == want, (kind, cfg, step, xml_resp[-300:], xml_gt[-300:])
            n_pairs += 1
            kinds.add(kind)
            differing += calls != gt_calls
    assert n_pairs == 360 and differing > 220 and len(kinds) == 14


# ----------------------------------------------------------------------------- the floor


def _malformed(gt: str) -> dict[str, str]:
    return {
        "call without terminator": gt.replace("<|call|>", "", 1),
        "analysis without terminator": gt.replace("<|end|>", "", 1),
        "unknown channel": gt.replace("commentary", "comentary", 1),
        "analysis on an unknown channel": gt.replace("analysis", "thinking", 1),
        "broken JSON": gt.replace('{"page":"1"}', '{"page":"1"'),
        "JSON array": gt.replace('{"page":"1"}', '["1"]'),
        "call without name": gt.replace("to=functions.GetNews", "to=functions.", 1),
        "call without recipient": gt.replace(" to=functions.GetNews", "", 1),
        "no message token": gt.replace("<|message|>", " ", 2),
        "truncated": gt[: len(gt) // 2],
        "two channels": gt.replace("<|channel|>commentary", "<|channel|>commentary<|channel|>final", 1),
        "recipient not a function": gt.replace("to=functions.GetNews", "to=browser.search", 1),
    }


@pytest.mark.parametrize("cfg", [CONFIGS[0], CONFIGS[3], CONFIGS[5], CONFIGS[-1]])
def test_malformed_harmony_scores_the_minimum(cfg):
    for name, response in _malformed(CALL_GT).items():
        assert response != CALL_GT, name
        for step in STEPS:
            _all_parts_at(
                response, CALL_GT, cfg, step, format_range(step, cfg)[1], correctness_range(step, cfg)[1]
            )
    for response in ("", "   ", "plain text", "<think> x </think>\n<response> y </response>", None, 42):
        _all_parts_at(response, CALL_GT, cfg, 0, format_range(0, cfg)[1], correctness_range(0, cfg)[1])


def test_layout_faults_cost_format_only():
    """Well-formed calls in a wrong layout keep full correctness (as with ToolRL's XML)."""
    analysis, call1, call2 = CALL_GT.split("\n")
    final = "<|start|>assistant<|channel|>final<|message|>ok<|return|>"
    faults = {
        "calls before analysis": f"{call1}\n{analysis}\n{call2}",
        "no analysis": f"{call1}\n{call2}",
        "two analyses": f"{analysis}\n{analysis}\n{call1}\n{call2}",
        "final not asked for": f"{analysis}\n{call1}\n{call2}\n{final}",
        "stray text": f"{analysis}\nhmm\n{call1}\n{call2}",
        "text after the end": f"{analysis}\n{call1}\n{call2} bye",
        "no content type": f"{analysis}\n{call1.replace(' json', '')}\n{call2}",
        "user role": f"{analysis.replace('assistant', 'user')}\n{call1}\n{call2}",
        "analysis ends with return": f"{analysis.replace('<|end|>', '<|return|>')}\n{call1}\n{call2}",
    }
    for name, response in faults.items():
        got = gpt_oss.compute_score(response, CALL_GT)
        assert (got.format, got.correctness) == (0.0, 3.0), name
    gt = f"{CALL_GT}\n{final}"
    for response in (f"{analysis}\n{final}\n{call1}\n{call2}", f"{analysis}\n{call1}\n{call2}"):
        assert gpt_oss.compute_score(response, gt).format == 0.0
    assert gpt_oss.compute_score(f"{analysis}\n{call1}", ANSWER_GT) == rlla.RewardBreakdown(
        0.0, 0.0, 0.0, 0.0
    )


def test_random_token_soup_never_raises():
    rng = random.Random(7)
    pieces = ["<|start|>", "assistant", " to=functions.", "GetNews", "<|channel|>", "analysis", "commentary",
              "final", " json", "<|constrain|>", "<|message|>", '{"page":"1"}', "{", "<|end|>", "<|call|>",
              "<|return|>", "\n", " ", "text"]  # fmt: skip
    for _ in range(400):
        soup = "".join(rng.choice(pieces) for _ in range(rng.randrange(0, 30)))
        parse_harmony(soup)
        got = gpt_oss.compute_score(soup, CALL_GT, 10, CONFIGS[-1])
        assert got.total == got.format + got.correctness + got.length


def test_parse_harmony_tool_calls_reads_and_raises():
    assert parse_harmony_tool_calls(CALL_GT) == [
        {"name": "GetNews", "parameters": {"page": "1"}},
        {"name": "Domain WHOIS Lookup API", "parameters": {"domain_name": "a.com"}},
    ]
    assert parse_harmony_tool_calls(ANSWER_GT) == [] and parse_harmony_tool_calls("") == []
    for name, bad in _malformed(CALL_GT).items():
        if name != "truncated":  # the first half holds only complete blocks before the cut
            with pytest.raises(ValueError, match="harmony block"):
                parse_harmony_tool_calls(bad)


def test_blocks_record_their_parts():
    blocks = parse_harmony(CALL_GT + "\n<|start|>assistant<|channel|>final<|message|>Hi<|end|>").blocks
    assert [(b.role, b.recipient, b.channel, b.content_type, b.terminator) for b in blocks] == [
        ("assistant", None, "analysis", None, "<|end|>"),
        ("assistant", "functions.GetNews", "commentary", "json", "<|call|>"),
        ("assistant", "functions.Domain WHOIS Lookup API", "commentary", "json", "<|call|>"),
        ("assistant", None, "final", None, "<|end|>"),
    ]
    assert all(b.error is None for b in blocks)
    broken = parse_harmony("lead<|start|>assistant<|channel|>final<|message|>no end")
    assert broken.stray == ("lead",) and broken.blocks[0].error == "no terminator" and not broken.well_formed
