"""XML (ToolRL) -> harmony (GPT-OSS) conversion: targets, system prompts, rows, frames, the script."""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from src.datamodules.gpt_oss import (
    GPT_OSS_TOKEN_IDS,
    HARMONY_SPECIAL_TOKENS,
    PATTERNS,
    ConversionError,
    convert_frame,
    convert_ground_truth,
    convert_row,
    convert_sft_records,
    convert_system_prompt,
    harmony_to_xml,
)
from src.formats.harmony import parse_harmony, parse_harmony_tool_calls

REPO = Path(__file__).resolve().parents[3]
DATA = REPO / ".." / "shared" / "data"
TEST_PARQUET = DATA / "rlla_4k" / "test.parquet"
SFT_JSON = DATA / "rlla_4k_raw" / "rlla_sft.json"


@pytest.fixture(scope="module")
def test_df() -> pd.DataFrame:
    if not TEST_PARQUET.is_file():
        pytest.skip(f"{TEST_PARQUET} not present")
    return pd.read_parquet(TEST_PARQUET)


@pytest.fixture(scope="module")
def sft() -> list[dict]:
    if not SFT_JSON.is_file():
        pytest.skip(f"{SFT_JSON} not present")
    return json.loads(SFT_JSON.read_text(encoding="utf-8"))


def _calls_after_think(xml: str) -> list[dict]:
    """Reference reading: JSON lines of the <tool_call> block that follows </think>."""
    tail = xml.split("</think>", 1)[1]
    if "<tool_call>" not in tail:
        return []
    block = tail.split("<tool_call>", 1)[1].split("</tool_call>", 1)[0]
    return [json.loads(line) for line in block.strip().split("\n")]


# ----------------------------------------------------------------------------- targets


def test_seed_examples_convert_exactly():
    xml = '<think>I should use the appropriate tool</think>\n<tool_call>\n{"name": "esg", "parameters": {"symb": "MSFT"}}\n</tool_call>'
    assert convert_ground_truth(xml) == (
        "<|start|>assistant<|channel|>analysis<|message|>I should use the appropriate tool<|end|>\n"
        '<|start|>assistant to=functions.esg<|channel|>commentary json<|message|>{"symb":"MSFT"}<|call|>'
    )
    xml = (
        "<think> I need to call two tools </think>\n<tool_call>\n"
        '{"name": "tool1", "parameters": {"p1": "v1"}}\n{"name": "tool2", "parameters": {"p2": "v2"}}\n</tool_call>\n'
        "<response>  Done.\n  Bye </response>"
    )
    assert convert_ground_truth(xml) == (
        "<|start|>assistant<|channel|>analysis<|message|>I need to call two tools<|end|>\n"
        '<|start|>assistant to=functions.tool1<|channel|>commentary json<|message|>{"p1":"v1"}<|call|>\n'
        '<|start|>assistant to=functions.tool2<|channel|>commentary json<|message|>{"p2":"v2"}<|call|>\n'
        "<|start|>assistant<|channel|>final<|message|>Done.\n  Bye<|return|>"
    )


def test_analysis_is_stripped_outside_and_verbatim_inside():
    xml = "<think>\n  first line\n\n  second  line \n</think>\n<response> ok </response>"
    blocks = parse_harmony(convert_ground_truth(xml)).blocks
    assert blocks[0].message == "first line\n\n  second  line"
    assert blocks[1].channel == "final" and blocks[1].message == "ok"


def test_empty_parameters_and_unicode_and_spaced_names():
    xml = '<think>t</think>\n<tool_call>\n{"name": "Get Top Paid Mac Apps ", "parameters": {}}\n{"name": "x", "parameters": {"q": "caf\\u00e9", "n": [1, 2.5, null]}}\n</tool_call>'
    harmony = convert_ground_truth(xml)
    assert '<|message|>{"q":"café","n":[1,2.5,null]}<|call|>' in harmony
    assert parse_harmony_tool_calls(harmony) == [
        {"name": "Get Top Paid Mac Apps ", "parameters": {}},
        {"name": "x", "parameters": {"q": "café", "n": [1, 2.5, None]}},
    ]
    assert harmony_to_xml(harmony) == xml.replace("<think>t</think>", "<think> t </think>")


def test_think_mentioning_tool_call_is_read_by_position():
    xml = (
        "<think> I will put it in <tool_call> tags, no <response> needed. </think>\n"
        '<tool_call>\n{"name": "a", "parameters": {"k": 1}}\n</tool_call>'
    )
    harmony = convert_ground_truth(xml)
    assert parse_harmony_tool_calls(harmony) == [{"name": "a", "parameters": {"k": 1}}]
    assert "<tool_call> tags" in parse_harmony(harmony).blocks[0].message


def test_real_sft_rows_with_tool_call_in_think(sft):
    odd = [r["output"] for r in sft if "<tool_call>" in r["output"].split("</think>", 1)[0]]
    assert len(odd) == 17
    for xml in odd:
        harmony = convert_ground_truth(xml)
        assert parse_harmony_tool_calls(harmony) == _calls_after_think(xml)
        assert "<tool_call>" in parse_harmony(harmony).blocks[0].message


def test_real_targets_round_trip_exactly(test_df, sft):
    targets = [g["ground_truth"] for g in test_df["reward_model"]] + [r["output"] for r in sft]
    assert len(targets) == 480
    for xml in targets:
        harmony = convert_ground_truth(xml)
        assert parse_harmony(harmony).well_formed
        assert parse_harmony_tool_calls(harmony) == _calls_after_think(xml)
        # ToolRL's targets are "<think> T </think>" with json.dumps lines: the inverse is exact.
        assert harmony_to_xml(harmony) == xml


@pytest.mark.parametrize(
    "xml, reason",
    [
        ("no think here", "does not start with <think>"),
        ("<think> never closed", "no </think>"),
        ("<think>a</think>\n<tool_call>\n{bad json}\n</tool_call>", "not JSON"),
        ('<think>a</think>\n<tool_call>\n{"name": "x"}\n</tool_call>', "exactly name and parameters"),
        (
            '<think>a</think>\n<tool_call>\n{"name": "x", "arguments": {}}\n</tool_call>',
            "exactly name and parameters",
        ),
        ('<think>a</think>\n<tool_call>\n{"name": "", "parameters": {}}\n</tool_call>', "bad name"),
        ('<think>a</think>\n<tool_call>\n{"name": "x", "parameters": [1]}\n</tool_call>', "not an object"),
        ('<think>a</think>\n<tool_call>\n{"name": "x", "parameters": {}}\n', "without </tool_call>"),
        ("<think>a</think>\n<tool_call>\n\n</tool_call>", "empty <tool_call>"),
        ("<think>a</think>\n<response> r </response>\n<response> s </response>", "second <response>"),
        (
            '<think>a</think>\n<response> r </response>\n<tool_call>\n{"name": "x", "parameters": {}}\n</tool_call>',
            "after <response>",
        ),
        ("<think>a</think>\nstray words", "unexpected text"),
        ("<think>a <|end|> b</think>\n<response> r </response>", "harmony token"),
        (
            '<think>a</think>\n<tool_call>\n{"name": "x", "parameters": {"v": "<|call|>"}}\n</tool_call>',
            "harmony token",
        ),
    ],
)
def test_bad_targets_raise_with_reason(xml, reason):
    with pytest.raises(ConversionError, match=re.escape(reason)):
        convert_ground_truth(xml)


def test_harmony_to_xml_rejects_malformed():
    good = convert_ground_truth(
        '<think>a</think>\n<tool_call>\n{"name": "x", "parameters": {}}\n</tool_call>'
    )
    for bad in (good.replace("<|call|>", ""), good.replace("analysis", "analyze"), "text", good + "\njunk"):
        with pytest.raises(ConversionError):
            harmony_to_xml(bad)


# ----------------------------------------------------------------------------- system prompt


def test_system_prompt_keeps_tools_and_rewrites_format(test_df):
    system = test_df["prompt"][0][0]["content"]
    converted = convert_system_prompt(system)
    head = system[: system.index("**Output Format**")]
    assert converted.startswith(head) and "**Available Tools**" in head  # tools block byte-identical
    new_part = converted[len(head) :]
    for token in HARMONY_SPECIAL_TOKENS:
        assert token in new_part
    assert "<think>" not in converted and "</tool_call>" not in converted
    assert "**Important Notes**" in new_part and "functions." in new_part
    assert convert_system_prompt(system) == converted  # deterministic; every row shares the section


def test_system_prompt_keeps_sections_after_the_notes():
    system = "Intro\n\n**Output Format**\n<think> x </think>\n\n**Important Notes**\n1. `<think>`\n\n**Extra**\nkeep me"
    converted = convert_system_prompt(system)
    assert converted.startswith("Intro\n\n**Output Format**\n") and converted.endswith(
        "\n\n**Extra**\nkeep me"
    )
    assert "<think>" not in converted
    with pytest.raises(ConversionError, match="Output Format"):
        convert_system_prompt("no format section")


# ----------------------------------------------------------------------------- rows and frames


def test_convert_row_changes_only_what_it_should(test_df):
    row = test_df.iloc[0].to_dict()
    out = convert_row(row)
    assert out["data_source"] == "rlla_gpt"
    assert out["ability"] == row["ability"] and out["extra_info"] == row["extra_info"]
    assert out["reward_model"]["style"] == row["reward_model"]["style"]
    assert out["reward_model"]["ground_truth"] == convert_ground_truth(row["reward_model"]["ground_truth"])
    assert [m["role"] for m in out["prompt"]] == ["system", "user"]
    assert out["prompt"][1] == dict(row["prompt"][1])
    assert out["prompt"][0]["content"] == convert_system_prompt(row["prompt"][0]["content"])


def test_convert_frame_counts_patterns_and_reports_failures(test_df):
    out, stats = convert_frame(test_df)
    assert len(out) == 80 and not stats.failures
    assert dict(stats.patterns) == {
        "analysis+tool_call": 36,
        "analysis+multiple_tool_calls": 35,
        "analysis+final": 9,
    }
    assert list(out.columns) == list(test_df.columns) and (out["data_source"] == "rlla_gpt").all()

    bad = test_df.head(6).copy()
    bad.at[1, "reward_model"] = {"ground_truth": "<think> unclosed", "style": "rule"}
    bad.at[4, "prompt"] = [{"role": "user", "content": "no system message"}]
    out, stats = convert_frame(bad)
    assert list(out.index) == [0, 2, 3, 5]
    assert [i for i, _ in stats.failures] == [1, 4]
    assert "no </think>" in stats.failures[0][1] and "system" in stats.failures[1][1]
    assert stats.n_converted == 4 and sum(stats.patterns.values()) == 4
    assert set(stats.as_dict()["patterns"]) == set(PATTERNS)


def test_convert_sft_records(sft):
    out, stats = convert_sft_records(sft)
    assert len(out) == 400 and not stats.failures
    assert dict(stats.patterns) == {
        "analysis+tool_call": 187,
        "analysis+multiple_tool_calls": 159,
        "analysis+final": 54,
    }
    assert all(set(o) == set(r) and o["input"] == r["input"] for o, r in zip(out, sft))
    _, stats = convert_sft_records([{"instruction": "x"}, sft[0]])
    assert [i for i, _ in stats.failures] == [0] and stats.n_converted == 1


def test_token_ids_follow_the_table():
    assert list(GPT_OSS_TOKEN_IDS) == HARMONY_SPECIAL_TOKENS
    assert GPT_OSS_TOKEN_IDS == {
        "<|start|>": 200006, "<|end|>": 200007, "<|message|>": 200008,
        "<|channel|>": 200005, "<|call|>": 200012, "<|return|>": 200002,
    }  # fmt: skip


# ----------------------------------------------------------------------------- script


def _run_script(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(REPO / "scripts" / "convert_to_gpt_oss.py"), *args],
        cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_script_converts_parquet_and_sft_with_the_input_schema(tmp_path, test_df, sft):
    out_dir = tmp_path / "out"
    proc = _run_script(str(TEST_PARQUET.parent), str(out_dir), "--sft-json", str(SFT_JSON))
    assert proc.returncode == 0, proc.stderr
    assert "analysis+multiple_tool_calls   35" in proc.stderr  # pattern counts logged at INFO
    assert pq.read_schema(out_dir / "test.parquet").equals(pq.read_schema(TEST_PARQUET))
    assert not (out_dir / "train.parquet").exists()
    converted = pd.read_parquet(out_dir / "test.parquet")
    assert len(converted) == 80 and set(converted["data_source"]) == {"rlla_gpt"}
    expected, _ = convert_frame(test_df)
    assert list(converted["reward_model"].map(lambda r: r["ground_truth"])) == list(
        expected["reward_model"].map(lambda r: r["ground_truth"])
    )
    records = json.loads((out_dir / "sft_gpt.json").read_text(encoding="utf-8"))
    assert len(records) == 400 and set(records[0]) == {"instruction", "input", "output"}
    stats = json.loads((out_dir / "conversion_stats.json").read_text())
    assert stats["test.parquet"]["n_converted"] == 80 and stats["rlla_sft.json"]["n_failed"] == 0


def test_script_refuses_an_empty_input_dir(tmp_path, caplog):
    spec = importlib.util.spec_from_file_location(
        "convert_to_gpt_oss", REPO / "scripts" / "convert_to_gpt_oss.py"
    )
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    assert script.main([str(tmp_path), str(tmp_path / "out")]) == 2
    assert "neither train.parquet nor test.parquet" in caplog.text and not (tmp_path / "out").exists()
