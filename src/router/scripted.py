"""A scripted responder that stands in for the actor's generation in router tests.

Given an RLLA row (XML format) and a route, it writes the response text a model following that
route would write; the task reward and the tool cost then come from the real scoring chain
(``rlla.compute_score``, ``tool_usage``, a cost function), so a router trained against it sees
exactly the rewards the real pipeline would compute for those texts.

Rules (``skill`` says how well the scripted model can use the prompt's right tool):
    ANSWER              ``<think>…</think>\\n<response>…</response>``, no tool: the ground truth's
                        reply when it has one, else an apology.
    SEARCH / CALCULATE  one ``<tool_call>`` block, always (a tool route always costs a call):
        the ground truth's calls are all of the route's family:
            skill "exact"  -> the ground truth verbatim (full correctness);
            skill "sloppy" -> the same tool names, but one made-up key ``input`` holding the
                              user's request (name credit only: a tool that helps a little).
        otherwise (wrong family, or no tool needed): the first listed tool of the route's
            family, or a generic one (``web_search`` / ``calculator``) when none is listed,
            with the same made-up ``input`` parameter.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from src.formats.tools_block import tool_descriptions
from src.rewards.rlla import RewardConfig, compute_score, parse_tool_block
from src.router.families import CALCULATE, SEARCH, ToolFamilies
from src.router.routes import Route, parse_route
from src.router.usage import ToolUsage, tool_usage

__all__ = ["FALLBACK_TOOL", "SKILLS", "RouteTable", "ScriptedResponder", "request_text", "route_table"]

SKILLS = ("exact", "sloppy")
FALLBACK_TOOL = {SEARCH: "web_search", CALCULATE: "calculator"}
_FAMILY_OF_ROUTE = {Route.SEARCH: SEARCH, Route.CALCULATE: CALCULATE}
_USER = re.compile(r"<user>(.*?)</user>", re.DOTALL)
_REPLY = re.compile(r"<response>(.*?)</response>", re.DOTALL)
APOLOGY = "Sorry, I cannot do that without a tool."


def request_text(user_content: str) -> str:
    """The last ``<user> … </user>`` turn of an RLLA user message (the whole text when untagged)."""
    turns = _USER.findall(user_content)
    return (turns[-1] if turns else user_content).strip()


def _call_text(think: str, calls: Sequence[Mapping[str, Any]]) -> str:
    lines = "\n".join(json.dumps(dict(call)) for call in calls)
    return f"<think> {think} </think>\n<tool_call>\n{lines}\n</tool_call>"


@dataclass(frozen=True)
class ScriptedResponder:
    """(prompt, route) -> response text, by the rules in the module doc (XML format only)."""

    families: ToolFamilies

    def respond(
        self, system: str, user: str, ground_truth: str, route: Route | int | str, skill: str = "exact"
    ) -> str:
        """The response to a row whose system/user messages and ground truth are given.

        Raises ValueError for an unknown skill or route, or a ground truth whose calls cannot be read.
        """
        if skill not in SKILLS:
            raise ValueError(f"unknown responder skill {skill!r}; expected one of {SKILLS}")
        route = parse_route(route)
        request = request_text(user)
        if route is Route.ANSWER:
            reply = _REPLY.search(ground_truth)
            text = reply.group(1).strip() if reply else APOLOGY
            return (
                f"<think> No tools this turn; I will answer directly. </think>\n<response> {text} </response>"
            )
        family = _FAMILY_OF_ROUTE[route]
        descriptions = tool_descriptions(system)
        gt_calls = self._ground_truth_calls(ground_truth)
        if gt_calls and all(
            self.families.family(c["name"], descriptions.get(c["name"], "")) == family for c in gt_calls
        ):
            if skill == "exact":
                return ground_truth.strip()
            calls = [{"name": c["name"], "parameters": {"input": request}} for c in gt_calls]
            return _call_text(f"I will call {calls[0]['name']}.", calls)
        listed = [n for n, d in descriptions.items() if self.families.family(n, d) == family]
        name = listed[0] if listed else FALLBACK_TOOL[family]
        return _call_text(
            f"The {family} route: I will call {name}.", [{"name": name, "parameters": {"input": request}}]
        )

    @staticmethod
    def _ground_truth_calls(ground_truth: str) -> list[dict[str, Any]]:
        if "<tool_call>" not in ground_truth:
            return []
        try:
            calls = parse_tool_block(ground_truth)
        except ValueError as err:
            raise ValueError(
                f"ground truth tool calls are not JSON lines ({err}): {ground_truth[:200]!r}"
            ) from None
        if not all(isinstance(c, dict) and isinstance(c.get("name"), str) for c in calls):
            raise ValueError(f"ground truth tool call without a string name: {ground_truth[:200]!r}")
        return calls


@dataclass(frozen=True)
class RouteTable:
    """Scored responses of every (prompt, route): rewards, costs [P, 3] float32; responses[p][route]."""

    rewards: torch.Tensor
    costs: torch.Tensor
    responses: list[list[str]]


def route_table(
    rows: Sequence[Mapping[str, Any]],
    skills: Sequence[str],
    families: ToolFamilies,
    cost_fn: Callable[[ToolUsage], float],
    step: int = 0,
    reward_config: RewardConfig | None = None,
) -> RouteTable:
    """Respond to every row under every route and score it with the real reward and tool cost.

    Args:
        rows: RLLA rows (``prompt`` = [system, user] messages, ``reward_model.ground_truth``).
        skills: one responder skill per row.
        families: tool family labels (for the responder and for ``tool_usage``).
        cost_fn: ``ToolUsage -> float`` (e.g. ``make_cost_fn("any_tool")``).
    Returns:
        RouteTable with rewards/costs [P, 3], columns in ``Route`` order.
    """
    if len(skills) != len(rows):
        raise ValueError(f"{len(skills)} skills for {len(rows)} rows")
    responder = ScriptedResponder(families)
    rewards, costs, texts = [], [], []
    for i, row in enumerate(rows):
        try:
            system, user = row["prompt"][0]["content"], row["prompt"][-1]["content"]
            ground_truth = row["reward_model"]["ground_truth"]
        except (KeyError, IndexError, TypeError) as err:
            raise ValueError(
                f"row {i}: needs prompt [system, user] and reward_model.ground_truth ({err!r})"
            ) from None
        descriptions = tool_descriptions(system)
        per_route = [responder.respond(system, user, ground_truth, route, skills[i]) for route in Route]
        rewards.append([compute_score(t, ground_truth, step, reward_config).total for t in per_route])
        costs.append([float(cost_fn(tool_usage(t, families, descriptions=descriptions))) for t in per_route])
        texts.append(per_route)
    return RouteTable(
        torch.tensor(rewards, dtype=torch.float32).reshape(-1, len(Route)),
        torch.tensor(costs, dtype=torch.float32).reshape(-1, len(Route)),
        texts,
    )
