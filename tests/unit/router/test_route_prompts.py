"""Route-conditioned system prompts on every real RLLA row (XML and harmony) and synthetic prompts."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest

from src.formats.tools_block import parse_tools_block, section_title, split_sections
from src.router import routes as route_prompts
from src.router.families import ToolFamilies
from src.router.routes import (
    ANSWER_INSTRUCTIONS,
    PREFERENCE_HEADING,
    Route,
    route_messages,
    route_system_prompt,
)

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
TEST_PARQUET = DATA / "rlla_4k" / "test.parquet"
FAM = ToolFamilies()
OTHER_OF = {"search": "calculate", "calculate": "search"}


def _real_prompts() -> list[tuple[str, str]]:
    """(system text, fmt) for every real row, plus its harmony conversion when available."""
    if not TEST_PARQUET.exists():
        pytest.skip("real data absent")
    pd = pytest.importorskip("pandas")
    systems = [p[0]["content"] for p in pd.read_parquet(TEST_PARQUET)["prompt"]]
    out = [(s, "xml") for s in systems]
    try:
        from src.datamodules.gpt_oss import convert_system_prompt
    except ImportError:
        return out
    return out + [(convert_system_prompt(s), "harmony") for s in systems]


def _synthetic_prompts() -> list[tuple[str, str]]:
    synthetic = pytest.importorskip("src.datamodules.synthetic")
    tools = list(synthetic.TOOLS.values())
    prompts = [
        synthetic.build_system_prompt(tools[i : i + k]) for i in range(0, len(tools), 3) for k in (1, 3, 5)
    ]
    # a multi-line description and pretty-printed parameters
    prompts.append(
        synthetic.build_system_prompt(tools[:2]).replace(
            "Description: Search the web.", "Description: Search the web.\nReturns 3. results per page."
        )
    )
    return [(p, "xml") for p in prompts]


def _strip_numbers(lines):
    return [re.sub(r"^\d+\.", "#.", line) for line in lines]


def _is_subsequence(small, big) -> bool:
    it = iter(big)
    return all(any(x == y for y in it) for x in small)


def check_answer(system: str, fmt: str) -> None:
    block = parse_tools_block(system)
    out = route_system_prompt(system, Route.ANSWER, FAM, fmt=fmt)
    assert out.endswith("\n\n" + ANSWER_INSTRUCTIONS[fmt])
    body = out[: -len(ANSWER_INSTRUCTIONS[fmt]) - 2]
    assert "Available Tools" not in body
    for tool in block.tools:
        assert tool.name not in out, tool.name
    sections = {section_title(s): s for s in split_sections(body)}
    fmt_section = sections.get("Output Format", "")
    assert "to=functions" not in fmt_section and "<tool_call>" not in fmt_section
    assert "<think>" in fmt_section or "analysis" in fmt_section
    for title, section in sections.items():
        for item in re.split(r"\n(?=\d+\.\s)", section)[1:]:
            if re.search(r"tool|function", item, re.I):  # only history references may remain
                assert re.search(r"history|previous", item, re.I), (title, item)
    # the rest is the original text: same preamble, lines in order (items renumbered)
    assert split_sections(body)[0] == split_sections(system)[0]
    assert _is_subsequence(_strip_numbers(body.split("\n")), _strip_numbers(system.split("\n")))


def check_family(system: str, fmt: str, route: Route, caplog) -> None:
    family = route.label
    block = parse_tools_block(system)
    labels = FAM.of_tools(block.tools)
    mine = [n for n, f in labels.items() if f == family]
    theirs = [n for n, f in labels.items() if f == OTHER_OF[family]]

    emphasis = route_system_prompt(system, route, FAM, mode="emphasis", fmt=fmt)
    assert emphasis.startswith(system + "\n\n" + PREFERENCE_HEADING + "\n")
    note = emphasis[len(system) :]
    assert all(f"`{n}`" in note for n in mine + theirs)
    assert ("Avoid" in note) == bool(theirs)

    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="src.router.routes"):
        only = route_system_prompt(system, route, FAM, mode="only_family", fmt=fmt)
    if not mine:
        assert only == emphasis
        return
    new_block = parse_tools_block(only)
    assert [t.name for t in new_block.tools] == mine
    assert [t.number for t in new_block.tools] == list(range(1, len(mine) + 1))
    assert only[: new_block.start] == system[: block.start]
    assert only[new_block.end :].startswith(system[block.end :])
    assert only.endswith(
        f"only the {'search' if family == 'search' else 'calculation'} tools are listed above."
    )
    for name in labels:
        if name not in mine:
            assert f"Name: {name}\n" not in only[new_block.start : new_block.end]


def test_every_real_row_every_route(caplog):
    prompts = _real_prompts()
    assert len(prompts) in (80, 160)
    fallbacks = 0
    for system, fmt in prompts:
        check_answer(system, fmt)
        for route in (Route.SEARCH, Route.CALCULATE):
            check_family(system, fmt, route, caplog)
            fallbacks += not any(
                f == route.label for f in FAM.of_tools(parse_tools_block(system).tools).values()
            )
    assert fallbacks > 0  # the real data has prompts without calculate tools: the fallback ran


def test_synthetic_prompts_every_route(caplog):
    for system, fmt in _synthetic_prompts():
        check_answer(system, fmt)
        for route in (Route.SEARCH, Route.CALCULATE):
            check_family(system, fmt, route, caplog)


def test_answer_on_synthetic_prompt_exact():
    synthetic = pytest.importorskip("src.datamodules.synthetic")
    system = synthetic.build_system_prompt([synthetic.TOOLS["web_search"], synthetic.TOOLS["calculator"]])
    out = route_system_prompt(system, "answer", FAM)
    expected = "\n\n".join(
        [
            synthetic.INTRO,
            "**Steps for Each Turn**\n1. **Think:** analyze the goal.\n2. **Respond Appropriately:** else answer directly.",
            "**Output Format**\n```plaintext\n<think> reasoning </think>\n<response> answer </response>\n```",
            ANSWER_INSTRUCTIONS["xml"],
        ]
    )
    assert out == expected  # notes were all about tool calls: the section went with them


def test_only_family_falls_back_with_warning(caplog, monkeypatch):
    synthetic = pytest.importorskip("src.datamodules.synthetic")
    monkeypatch.setattr(route_prompts, "_fallbacks", 0)  # warnings are rate-limited per process
    system = synthetic.build_system_prompt([synthetic.TOOLS["web_search"], synthetic.TOOLS["send_email"]])
    with caplog.at_level(logging.WARNING, logger="src.router.routes"):
        out = route_system_prompt(system, Route.CALCULATE, FAM, mode="only_family")
    assert out == route_system_prompt(system, Route.CALCULATE, FAM, mode="emphasis")
    assert (
        "None of the listed tools is a calculation tool" in out
        and "Avoid the search tools (`web_search`)" in out
    )
    assert any("no calculate tool" in r.getMessage() for r in caplog.records)


def test_overrides_change_the_listed_family():
    synthetic = pytest.importorskip("src.datamodules.synthetic")
    system = synthetic.build_system_prompt([synthetic.TOOLS["web_search"], synthetic.TOOLS["calculator"]])
    fam = ToolFamilies({"web_search": "calculate"})
    out = route_system_prompt(system, Route.CALCULATE, fam, mode="only_family")
    assert [t.name for t in parse_tools_block(out).tools] == ["web_search", "calculator"]


def test_route_messages_copies_and_validates():
    messages = [
        {
            "role": "system",
            "content": "Hi.\n\n**Available Tools**\n1. Name: GetNews\nDescription: Retrieve news.",
        },
        {"role": "user", "content": "news?"},
    ]
    out = route_messages(messages, 0, FAM)
    assert out[1] == messages[1] and out[0] is not messages[0]
    assert "GetNews" in messages[0]["content"] and "GetNews" not in out[0]["content"]
    with pytest.raises(ValueError, match="no system message among roles"):
        route_messages([{"role": "user", "content": "x"}], 1, FAM)
    with pytest.raises(ValueError, match="unknown route prompt mode"):
        route_system_prompt("x", 1, FAM, mode="strict")
    with pytest.raises(ValueError, match="unknown prompt format"):
        route_system_prompt("x", 1, FAM, fmt="json")
    with pytest.raises(ValueError, match="unknown route"):
        route_system_prompt("x", "mixed", FAM)


def test_harmony_answer_prompt_keeps_analysis_and_final():
    gpt_oss = pytest.importorskip("src.datamodules.gpt_oss")
    synthetic = pytest.importorskip("src.datamodules.synthetic")
    system = gpt_oss.convert_system_prompt(synthetic.build_system_prompt([synthetic.TOOLS["calculator"]]))
    out = route_system_prompt(system, Route.ANSWER, FAM, fmt="harmony")
    assert "<|channel|>analysis" in out and "<|channel|>final" in out and "to=functions" not in out
    assert out.endswith(ANSWER_INSTRUCTIONS["harmony"])
