"""Tools-section parsing, the keyword labeller, sidecar overrides and weak labels."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from src.formats.tools_block import parse_tools_block, section_title, split_sections, tool_descriptions
from src.router.families import FAMILIES, ToolFamilies, label_tool, load_family_file
from src.router.routes import MIXED_INDEX, Route, WeakLabel, parse_route, weak_label, weak_label_index

DATA = Path(__file__).resolve().parents[3] / ".." / "shared" / "data"
TEST_PARQUET = DATA / "rlla_4k" / "test.parquet"

HEAD = "You are a helpful assistant.\n\n**Available Tools**\nIn your response, you can use the following tools:\n"
TAIL = "\n\n**Steps for Each Turn**\n1. **Think:** think.\n\n**Output Format**\n```\n<think> x </think>\n```"


def _prompt(items: str) -> str:
    return HEAD + items + TAIL


def test_split_sections_roundtrip_and_titles():
    text = _prompt("1. Name: A\nDescription: d\nParameters: {}")
    parts = split_sections(text)
    assert "\n\n".join(parts) == text
    assert [section_title(p) for p in parts] == [
        None,
        "Available Tools",
        "Steps for Each Turn",
        "Output Format",
    ]


def test_parse_named_items_with_multiline_description_and_json():
    items = (
        "1. Name: GetNews\nDescription: Retrieve news.\nSecond line mentioning 2. things\n"
        'Parameters: {"page": {"type": "int"},\n  "q": {"type": "str"}}\n'
        "2. Name: calc_sum\nDescription: Calculates a sum.\nParameters: {}"
    )
    text = _prompt(items)
    block = parse_tools_block(text)
    assert [t.name for t in block.tools] == ["GetNews", "calc_sum"]
    assert block.tools[0].description == "Retrieve news.\nSecond line mentioning 2. things"
    assert block.tools[0].parameters_dict() == {"page": {"type": "int"}, "q": {"type": "str"}}
    assert block.tools[1].parameters_dict() == {}
    assert text[block.start : block.end].startswith("**Available Tools**")
    assert text[block.end :].startswith("\n\n**Steps for Each Turn**")
    assert block.render(block.tools) == text[block.start : block.end]
    assert block.render([block.tools[1]]).endswith(
        "1. Name: calc_sum\nDescription: Calculates a sum.\nParameters: {}"
    )


def test_parse_inline_items_and_python_literal_parameters():
    items = "1. QueryMeeting: The API for retrieving meetings.\nParameters: {'user': {'type': 'str'}}\n2. AddNumbers: Adds."
    block = parse_tools_block(_prompt(items))
    assert [(t.number, t.name) for t in block.tools] == [(1, "QueryMeeting"), (2, "AddNumbers")]
    assert block.tools[0].description == "The API for retrieving meetings."
    assert block.tools[0].parameters_dict() == {"user": {"type": "str"}}
    assert block.tools[1].parameters == ""


def test_no_tools_section():
    assert parse_tools_block("just a system prompt\n\n**Output Format**\nx") is None
    assert tool_descriptions("plain") == {}


@pytest.mark.parametrize(
    ("name", "description", "family"),
    [
        ("GetNews", "Retrieve Azure news articles", "search"),
        ("Convert Currency", "Convert any amount from one currency to another.", "calculate"),
        (
            "6-TimeSeries Endpoint: Currency Exchange Rate",
            "Retrieve the exchange rates over a period.",
            "search",
        ),
        ("monthly_mortgage_payment", "Calculates the monthly mortgage payment.", "calculate"),
        ("createDraftingElement", "Create a new drafting element", "other"),
        ("ESG Risk Rating API", "This API provides the ESG Risk Rating for a given stock.", "search"),
        ("find_max_subarray_sum", "Finds the maximum sum of a contiguous subarray of integers.", "calculate"),
        ("find_files", "Finds all files with a specific extension in a directory.", "search"),
        (
            "hCOWBbL",
            "Performs binary search on a sorted list to find the index of a target value.",
            "calculate",
        ),
        ("is_hotel_available", "Checks the availability of a hotel for a given date range.", "search"),
        ("getWeather", "", "search"),
        ("calculate_bmi", "", "calculate"),
        ("xyz", "", "other"),
    ],
)
def test_label_tool_examples(name, description, family):
    assert label_tool(name, description) == family


def test_label_tool_on_real_tools_is_sensible():
    pd = pytest.importorskip("pandas")
    if not TEST_PARQUET.exists():
        pytest.skip("real data absent")
    df = pd.read_parquet(TEST_PARQUET)
    tools = {}
    for prompt in df["prompt"]:
        tools.update(tool_descriptions(prompt[0]["content"]))
    labels = {name: label_tool(name, desc) for name, desc in tools.items()}
    assert len(labels) == 259 and set(labels.values()) == set(FAMILIES)
    counts = {f: sum(v == f for v in labels.values()) for f in FAMILIES}
    assert counts["search"] > counts["calculate"] > counts["other"] > 0
    # spot checks drawn from the real list
    assert labels["GetNews"] == labels["Get Live Soccer Matches"] == labels["QKB30s6"] == "search"
    assert (
        labels["fibonacci"]
        == labels["greatest_common_divisor"]
        == labels["dice_roll_probability"]
        == "calculate"
    )
    assert labels["buildTower"] == labels["loginUser"] == labels["generate_password"] == "other"
    # every "Calculates ..." tool is a calculation, every "Retrieve(s) ..." one a search
    for name, desc in tools.items():
        if desc.startswith("Calculate"):
            assert labels[name] == "calculate", name
        if desc.startswith("Retrieve"):
            assert labels[name] == "search", name


def test_tool_families_overrides_win_and_validate(tmp_path):
    fam = ToolFamilies({"GetNews": "CALCULATE-family"})
    assert fam.family("GetNews", "Retrieve news") == "calculate"
    assert fam.family("GetWeather", "") == "search"
    with pytest.raises(ValueError, match="'Bad'.*'searchy'"):
        ToolFamilies({"Bad": "searchy"})

    good = tmp_path / "fam.json"
    good.write_text(json.dumps({"A": "search", "B": "Other"}))
    assert ToolFamilies.from_file(good).overrides == {"A": "search", "B": "other"}
    assert ToolFamilies.from_file(None).overrides == {}

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"A": "search", "B": "lookup"}))
    with pytest.raises(ValueError, match=r"bad\.json: tool 'B': family 'lookup'"):
        load_family_file(bad)
    (tmp_path / "list.json").write_text("[1]")
    with pytest.raises(ValueError, match="list.json: expected a JSON object"):
        load_family_file(tmp_path / "list.json")


def test_family_csv_rows_and_errors(tmp_path):
    good = tmp_path / "fam.csv"
    good.write_text("name,family\nGetNews,search\nadd,calculate\n")
    assert load_family_file(good) == {"GetNews": "search", "add": "calculate"}
    bad = tmp_path / "bad.csv"
    bad.write_text("name,family\nGetNews,search\nadd,maths\n")
    with pytest.raises(ValueError, match=r"bad\.csv: line 3: tool 'add': family 'maths'"):
        load_family_file(bad)
    clash = tmp_path / "clash.csv"
    clash.write_text("name,family\nX,search\nX,other\n")
    with pytest.raises(ValueError, match="line 3: tool 'X' is 'other' here but 'search' on line 2"):
        load_family_file(clash)
    header = tmp_path / "header.csv"
    header.write_text("tool,kind\nX,search\n")
    with pytest.raises(ValueError, match="header.csv: the header must have columns name,family"):
        load_family_file(header)
    with pytest.raises(ValueError, match=r"\.json or \.csv"):
        load_family_file(tmp_path / "fam.yaml")


def _gt(*calls: str) -> str:
    if not calls:
        return "<think> t </think>\n<response> hi </response>"
    return "<think> t </think>\n<tool_call>\n" + "\n".join(calls) + "\n</tool_call>"


def test_weak_label_rules_xml():
    fam = ToolFamilies({"s1": "search", "s2": "search", "c1": "calculate", "o1": "other"})
    call = lambda n: json.dumps({"name": n, "parameters": {}})  # noqa: E731
    assert weak_label(_gt(), fam) == "ANSWER"
    assert weak_label(_gt(call("s1"), call("s2")), fam) == "SEARCH"
    assert weak_label(_gt(call("c1")), fam) == "CALCULATE"
    assert weak_label(_gt(call("s1"), call("c1")), fam) == "MIXED"
    assert weak_label(_gt(call("o1")), fam) == "MIXED"
    assert weak_label(_gt("not json"), fam) == "MIXED"
    # reasoning quoting the tag is not a call
    assert (
        weak_label("<think> I could use <tool_call> here </think>\n<response> no </response>", fam)
        == "ANSWER"
    )
    # descriptions from the prompt sharpen unlabelled names
    assert (
        weak_label(_gt(call("zz")), ToolFamilies(), descriptions={"zz": "Computes the GCD."}) == "CALCULATE"
    )


def test_weak_label_harmony():
    pytest.importorskip("src.formats.harmony")
    fam = ToolFamilies({"s1": "search", "c1": "calculate"})
    analysis = "<|start|>assistant<|channel|>analysis<|message|>think<|end|>"
    call = "<|start|>assistant to=functions.{}<|channel|>commentary json<|message|>{{}}<|call|>"
    final = "<|start|>assistant<|channel|>final<|message|>hi<|return|>"
    assert weak_label(analysis + "\n" + final, fam, fmt="harmony") == "ANSWER"
    assert weak_label(analysis + "\n" + call.format("s1"), fam, fmt="harmony") == "SEARCH"
    assert weak_label(analysis + "\n" + call.format("c1"), fam, fmt="harmony") == "CALCULATE"
    both = analysis + "\n" + call.format("c1") + "\n" + call.format("s1")
    assert weak_label(both, fam, fmt="harmony") == "MIXED"


def test_weak_labels_on_real_rows_xml_and_harmony_agree():
    pd = pytest.importorskip("pandas")
    if not TEST_PARQUET.exists():
        pytest.skip("real data absent")
    df = pd.read_parquet(TEST_PARQUET)
    fam = ToolFamilies()
    xml_labels = [
        weak_label(rm["ground_truth"], fam, descriptions=tool_descriptions(p[0]["content"]))
        for p, rm in zip(df["prompt"], df["reward_model"])
    ]
    assert set(xml_labels) == {"ANSWER", "SEARCH", "CALCULATE", "MIXED"}
    assert xml_labels[0] == "SEARCH"  # GetNews
    assert xml_labels.count("ANSWER") == sum(
        "<tool_call>" not in rm["ground_truth"] for rm in df["reward_model"]
    )
    try:
        import src.formats.harmony  # noqa: F401
        from src.datamodules.gpt_oss import convert_ground_truth
    except ImportError:
        return
    harmony_labels = [
        weak_label(
            convert_ground_truth(rm["ground_truth"]), fam, "harmony", tool_descriptions(p[0]["content"])
        )
        for p, rm in zip(df["prompt"], df["reward_model"])
    ]
    assert harmony_labels == xml_labels


def test_routes_and_weak_label_indices():
    assert [r.label for r in Route] == ["answer", "search", "calculate"]
    assert [int(r) for r in Route] == [0, 1, 2]
    assert parse_route("SEARCH-FAMILY") is Route.SEARCH and parse_route(2) is Route.CALCULATE
    assert parse_route(Route.ANSWER) is Route.ANSWER
    for bad in ("mixed", 3, True, None):
        with pytest.raises(ValueError):
            parse_route(bad)
    assert [weak_label_index(x) for x in ("ANSWER", "SEARCH", "CALCULATE", "MIXED")] == [0, 1, 2, MIXED_INDEX]
    assert WeakLabel.MIXED.route() is None and WeakLabel("SEARCH").route() is Route.SEARCH
