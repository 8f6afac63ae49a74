"""Route-following SFT examples: the warm start that makes the router's decision binding.

Every row is shown under all three route-conditioned prompts (``src.router.routes``), with the
target a *route-following* actor would write:

    ANSWER route         the ground truth of a no-tool row; a direct answer for a tool row
    the row's own family the ground truth (its tool call)
    another family       a call of a tool the routed prompt lists for that family, the request
                         copied into its first parameter (the actor does what the route says)

Which listed tool a misrouted call names is ``misrouted_tool``: ``first`` (the family's first listed
tool) or ``request_hash`` (the listed tool picked by a CRC-32 of the request). ``first`` teaches the
actor a position rule: on its own family's route too it calls whichever tool is listed first, since
misrouted targets are most of the family-routed examples (docs/router_demo.md, "The position rule
is taught by the route SFT"). ``request_hash`` spreads them so that no position fits.

So under a tool route the actor always calls a tool (cost 1) and under ANSWER it never does
(cost 0): a tool route on a no-tool prompt costs a tool call and the answer's format reward, a
wrong family costs the call's correctness. Which route a prompt deserves is then a question only
the router can answer, which is what the budgeted router demo needs.
"""

from __future__ import annotations

import json
import re
import zlib
from typing import Any

from src.config.validate import MISROUTED_TOOLS
from src.datamodules.gpt_oss import convert_ground_truth
from src.formats.tools_block import parse_tools_block, tool_descriptions
from src.rewards.dispatch import response_format
from src.router.routes import Route, route_messages, weak_label

__all__ = ["DIRECT_ANSWER_XML", "misrouted_call", "route_following_examples"]

DIRECT_ANSWER_XML = (
    "<think> No tools are available for this turn, so I answer directly. </think>\n"
    "<response> I can't use tools right now; here is my best direct answer. </response>"
)
_KIND = {Route.SEARCH: "lookup", Route.CALCULATE: "calculation"}
_USER = re.compile(r"<user>\s*(.*?)\s*</user>", re.DOTALL)


def _request_text(messages: list[dict]) -> str:
    user = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
    found = _USER.findall(user)
    return found[-1] if found else user.strip()


def misrouted_call(
    routed_messages: list[dict], route: Route, families, misrouted_tool: str = "first"
) -> str | None:
    """XML target for a tool route the row does not belong to: one call of a listed tool of the
    route's family (else of the first listed tool), the request text as its first parameter.
    ``misrouted_tool``: ``first`` the family's first listed tool, ``request_hash`` the one at
    CRC-32(request) mod the family's listed count. None when that tool has no parameters."""
    system = next(m["content"] for m in routed_messages if m["role"] == "system")
    block = parse_tools_block(system)
    if block is None or not block.tools:
        return None
    labels = families.of_tools(block.tools)
    in_family = [t for t in block.tools if labels[t.name] == route.label] or [block.tools[0]]
    request = _request_text(routed_messages)
    if misrouted_tool == "first":
        tool = in_family[0]
    elif misrouted_tool == "request_hash":
        tool = in_family[zlib.crc32(request.encode()) % len(in_family)]
    else:
        raise ValueError(f"sft.misrouted_tool={misrouted_tool!r}; expected one of {MISROUTED_TOOLS}")
    params = tool.parameters_dict() or {}
    if not params:
        return None
    call = json.dumps({"name": tool.name, "parameters": {next(iter(params)): request}})
    return f"<think> A {_KIND[route]}: {tool.name}. </think>\n<tool_call>\n{call}\n</tool_call>"


def _row_examples(
    record: dict[str, Any], families, mode: str, misrouted_tool: str
) -> list[tuple[list[dict], str]]:
    fmt = response_format(record["data_source"])
    system = next(m["content"] for m in record["messages"] if m["role"] == "system")
    label = weak_label(record["ground_truth"], families, fmt=fmt, descriptions=tool_descriptions(system))
    as_fmt = (lambda xml: xml) if fmt == "xml" else convert_ground_truth
    out = []
    for route in Route:
        messages = route_messages(record["messages"], route, families, mode=mode, fmt=fmt)
        if route is Route.ANSWER:
            target = record["ground_truth"] if label == "ANSWER" else as_fmt(DIRECT_ANSWER_XML)
        elif label in (route.name, "MIXED"):
            target = record["ground_truth"]
        else:
            call = misrouted_call(messages, route, families, misrouted_tool)
            target = None if call is None else as_fmt(call)
        if target is not None:
            out.append((messages, target))
    return out


def route_following_examples(
    records: list[dict[str, Any]], families, mode: str = "emphasis", misrouted_tool: str = "first"
) -> list[tuple[list[dict], str]]:
    """(messages, target) pairs: each record under each route (``mode`` as the router's
    ``prompt_mode``), targets as in the module doc (``misrouted_tool`` as ``sft.misrouted_tool``)."""
    return [pair for record in records for pair in _row_examples(record, families, mode, misrouted_tool)]
