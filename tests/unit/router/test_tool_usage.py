"""ToolUsage from decoded XML and harmony responses, on hand-made and real outputs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from src.formats.tools_block import tool_descriptions
from src.router.families import ToolFamilies
from src.router.usage import UNKNOWN, ToolUsage, tool_usage

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
FAM = ToolFamilies({"s1": "search", "s2": "search", "c1": "calculate", "o1": "other"})


def call(name: str, **params) -> str:
    return json.dumps({"name": name, "parameters": params})


def xml(*lines: str, think: str = "t", response: str | None = None) -> str:
    out = f"<think> {think} </think>"
    if lines:
        out += "\n<tool_call>\n" + "\n".join(lines) + "\n</tool_call>"
    if response is not None:
        out += f"\n<response> {response} </response>"
    return out


def test_no_tool():
    usage = tool_usage(xml(response="hello"), FAM)
    assert usage == ToolUsage(parse_ok=True)
    assert not usage.used_any_tool and usage.n_calls == 0 and usage.names == []


def test_calls_by_family():
    usage = tool_usage(xml(call("s1", q="x"), call("c1"), call("s2")), FAM)
    assert usage.used_any_tool and usage.used_search and usage.used_calculate and not usage.used_other
    assert usage.n_calls == 3 and usage.names == ["s1", "c1", "s2"]
    assert usage.calls_per_family == {"search": 2, "calculate": 1}
    assert usage.parse_ok


def test_unparseable_lines_count_as_unknown_calls():
    usage = tool_usage(xml(call("s1"), '{"name": "c1", "parameters": {', "[1, 2]", '{"parameters": {}}'), FAM)
    assert usage.used_any_tool and not usage.parse_ok
    assert usage.n_calls == 4 and usage.names == ["s1", None, None, None]
    assert usage.calls_per_family == {"search": 1, UNKNOWN: 3}
    assert usage.used_other and usage.used_search and not usage.used_calculate


def test_empty_block_is_a_tool_attempt_without_calls():
    usage = tool_usage("<think> t </think>\n<tool_call>\n\n</tool_call>", FAM)
    assert usage.used_any_tool and usage.n_calls == 0 and not usage.parse_ok


def test_blank_line_inside_block_is_not_a_call():
    usage = tool_usage(
        "<think> t </think>\n<tool_call>\n" + call("s1") + "\n\n" + call("c1") + "\n</tool_call>", FAM
    )
    assert usage.names == ["s1", "c1"] and not usage.parse_ok  # the reward's parser rejects the blank line


def test_tag_inside_think_is_ignored_and_all_blocks_count():
    text = xml(call("c1"), think="maybe <tool_call> " + call("s1") + " </tool_call> later")
    usage = tool_usage(text, FAM)
    assert usage.names == ["c1"]
    text = (
        "<think> a </think>\n<tool_call>\n"
        + call("s1")
        + "\n</tool_call>\n<tool_call>\n"
        + call("o1")
        + "\n</tool_call>"
    )
    assert tool_usage(text, FAM).names == ["s1", "o1"]
    # no </think>: the whole text is read
    assert tool_usage("<tool_call>\n" + call("s1") + "\n</tool_call>", FAM).names == ["s1"]


def test_unclosed_block_still_counts():
    usage = tool_usage("<think> t </think>\n<tool_call>\n" + call("s1"), FAM)
    assert usage.used_any_tool and usage.names == ["s1"] and usage.parse_ok
    usage = tool_usage("<think> t </think>\n<tool_call>\n" + call("s1") + "\n<response> hi </response>", FAM)
    assert usage.names == ["s1"] and not usage.parse_ok


def test_bad_format_and_non_string():
    with pytest.raises(ValueError, match="unknown tool-call format 'json'"):
        tool_usage("x", FAM, fmt="json")
    assert tool_usage(None, FAM) == ToolUsage()


def test_descriptions_feed_the_heuristic():
    usage = tool_usage(
        xml(call("zz")), ToolFamilies(), descriptions={"zz": "Computes the average of numbers."}
    )
    assert usage.calls_per_family == {"calculate": 1}


def test_real_sft_outputs_read_after_think():
    path = DATA / "rlla_4k_raw" / "rlla_sft.json"
    if not path.exists():
        pytest.skip("real data absent")
    records = json.loads(path.read_text())
    fam = ToolFamilies()
    quoted = 0
    for rec in records:
        out = rec["output"]
        think, tail = out.split("</think>", 1)
        quoted += "<tool_call>" in think
        usage = tool_usage(out, fam, descriptions=tool_descriptions(rec["instruction"]))
        assert usage.used_any_tool == ("<tool_call>" in tail)
        assert usage.parse_ok
        if usage.used_any_tool:
            block = tail.split("<tool_call>")[1].split("</tool_call>")[0].strip()
            assert usage.names == [json.loads(line)["name"] for line in block.split("\n")]
    assert quoted == 17


# ----------------------------------------------------------------------------- harmony

ANALYSIS = "<|start|>assistant<|channel|>analysis<|message|>think<|end|>"
FINAL = "<|start|>assistant<|channel|>final<|message|>done<|return|>"


def hcall(name: str, args: str = "{}") -> str:
    return f"<|start|>assistant to=functions.{name}<|channel|>commentary json<|message|>{args}<|call|>"


@pytest.fixture
def harmony():
    return pytest.importorskip("src.formats.harmony")


def test_harmony_calls(harmony):
    usage = tool_usage(
        "\n".join([ANALYSIS, hcall("s1", '{"q":"x"}'), hcall("c1"), FINAL]), FAM, fmt="harmony"
    )
    assert usage.names == ["s1", "c1"] and usage.parse_ok
    assert usage.used_search and usage.used_calculate and usage.n_calls == 2
    assert tool_usage(ANALYSIS + "\n" + FINAL, FAM, fmt="harmony") == ToolUsage()
    # GPT-OSS's own header layout reads the same
    native = "<|start|>assistant<|channel|>commentary to=functions.c1 <|constrain|>json<|message|>{}<|call|>"
    assert tool_usage(ANALYSIS + native, FAM, fmt="harmony").names == ["c1"]


def test_harmony_malformed_keeps_readable_names(harmony):
    text = "\n".join(
        [
            ANALYSIS,
            hcall("s1", "{not json"),
            hcall("c1"),
            "<|start|>assistant to=browser.search<|channel|>commentary<|message|>{}<|call|>",
        ]
    )
    usage = tool_usage(text, FAM, fmt="harmony")
    assert not usage.parse_ok and usage.used_any_tool
    assert usage.names == ["s1", "c1", None]
    assert usage.calls_per_family == {"search": 1, "calculate": 1, UNKNOWN: 1}
    assert usage.used_other


def test_harmony_matches_xml_on_real_ground_truths(harmony):
    pd = pytest.importorskip("pandas")
    gpt_oss = pytest.importorskip("src.datamodules.gpt_oss")
    path = DATA / "rlla_4k" / "test.parquet"
    if not path.exists():
        pytest.skip("real data absent")
    df = pd.read_parquet(path)
    fam = ToolFamilies()
    for prompt, rm in zip(df["prompt"], df["reward_model"]):
        desc = tool_descriptions(prompt[0]["content"])
        a = tool_usage(rm["ground_truth"], fam, descriptions=desc)
        b = tool_usage(
            gpt_oss.convert_ground_truth(rm["ground_truth"]), fam, fmt="harmony", descriptions=desc
        )
        assert a == b
