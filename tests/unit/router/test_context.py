"""PromptContext: a prompt's format, tool descriptions and weak label, computed once."""

from __future__ import annotations

import pytest

from src.datamodules.gpt_oss import convert_system_prompt
from src.datamodules.synthetic import TOOLS, build_system_prompt, build_user_turn
from src.formats.tools_block import tool_descriptions
from src.router.families import ToolFamilies
from src.router.routes import (
    Route,
    prompt_context,
    record_context,
    response_usage,
    route_messages,
    routed_messages,
    weak_label,
)

SYSTEM = build_system_prompt([TOOLS["calculator"], TOOLS["web_search"]])
TRUTH = '<tool_call>\n{"name": "web_search", "parameters": {"query": "oslo"}}\n</tool_call>'


def messages(system: str = SYSTEM) -> list[dict]:
    return [{"role": "system", "content": system}, {"role": "user", "content": build_user_turn("Hi")}]


def test_context_matches_the_functions_it_replaces():
    fam = ToolFamilies()
    ctx = prompt_context(messages(), "rlla", fam, ground_truth=TRUTH)
    assert ctx.fmt == "xml" and ctx.descriptions == tool_descriptions(SYSTEM)
    assert ctx.weak_label == weak_label(TRUTH, fam, fmt="xml", descriptions=ctx.descriptions) == "SEARCH"
    assert prompt_context(messages(), "rlla", fam).weak_label is None  # no ground truth, no label
    assert prompt_context(messages(), "rlla", fam, TRUTH, label="MIXED").weak_label == "MIXED"
    harmony = prompt_context(messages(convert_system_prompt(SYSTEM)), "rlla_gpt", fam)
    assert harmony.fmt == "harmony" and set(harmony.descriptions) == set(ctx.descriptions)
    with pytest.raises(KeyError, match="data_source"):
        prompt_context(messages(), "nope", fam)


def test_routed_messages_and_usage_use_the_context():
    fam = ToolFamilies()
    record = {"messages": messages(), "data_source": "rlla", "ground_truth": TRUTH, "uid": 0}
    ctx = record_context(record, fam, with_label=True)
    assert ctx.weak_label == "SEARCH" and record_context(record, fam, with_label=False).weak_label is None
    for route in Route:
        assert routed_messages(ctx, int(route), fam, "emphasis") == route_messages(
            record["messages"], route, fam, mode="emphasis", fmt="xml"
        )
    unrouted = routed_messages(ctx, None, fam, "emphasis")
    assert unrouted == record["messages"] and unrouted[0] is not record["messages"][0]  # a copy
    usage = response_usage(TRUTH, ctx, fam)
    assert usage.used_search and usage.n_calls == 1
