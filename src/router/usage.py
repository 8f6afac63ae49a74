"""Which tools a decoded response called, by family: the input of the router's tool cost.

XML (``rlla``): tool calls are read from the text after the first ``</think>`` when there is one,
because reasoning sometimes quotes the literal ``<tool_call>`` tag (17 of the 400 SFT outputs).
Every ``<tool_call>`` block there is read as the reward's ``parse_tool_block`` reads it;
the reward scores only the first block, but the cost counts all of them since each was a call.
A block whose lines are not all JSON objects with a string ``name`` is read line by line: each
non-empty line still counts as one call (the model attempted a tool), and a line that is not
such an object is a call of family ``"unknown"``. ``parse_ok`` is then False.

Harmony (``rlla_gpt``): calls are ``<|start|>assistant to=functions.NAME<|channel|>commentary
json<|message|>{json}<|call|>`` blocks, read by ``src.formats.harmony``. When that parser
rejects the text, every block addressed to a recipient or ending in ``<|call|>`` still counts as
a call: of NAME's family when it is addressed to ``functions.NAME`` (the name is readable even
when the JSON is not), else of family ``"unknown"``; ``parse_ok`` is then False.

Unknown-family calls set ``used_other`` (a call that is neither search nor calculate), so costs
that charge "other" tools charge failed attempts too; ``calls_per_family["unknown"]`` keeps them
apart for logging.

The tool cost of one trajectory is the quantity the router's budget constrains.

Each cost is a pure function of a :class:`ToolUsage` and scalar weights, registered by name:

    any_tool    c_tool · [a tool-call block is present]
    per_family  c_search · used_search + c_calculate · used_calculate + c_other · used_other
    per_call    min(c_call · n_calls, cap)   (no cap when cap is None)

``used_other`` includes calls whose JSON could not be read (see ``tool_usage``), so failed
attempts are charged as "other" tools. ``make_cost_fn("per_family", c_search=1, c_other=0.5)``
binds the weights and checks their names.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import math
import numbers
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from src.router.families import ToolFamilies

__all__ = [
    "UNKNOWN",
    "ToolUsage",
    "extract_xml_calls",
    "tool_usage",
    "COST_FUNCTIONS",
    "any_tool",
    "batch_cost",
    "make_cost_fn",
    "max_cost",
    "per_call",
    "per_family",
    "register_cost",
]

log = logging.getLogger(__name__)

UNKNOWN = "unknown"
FORMATS = ("xml", "harmony")
_HARMONY_CALL = "<|call|>"
_FUNCTIONS = "functions."


@dataclass(frozen=True)
class ToolUsage:
    """Tool use of one response. ``calls_per_family`` keys: search, calculate, other, unknown."""

    used_any_tool: bool = False
    used_search: bool = False
    used_calculate: bool = False
    used_other: bool = False
    n_calls: int = 0
    calls_per_family: dict[str, int] = field(default_factory=dict)
    names: list[str | None] = field(default_factory=list)
    parse_ok: bool = True


def _after_think(text: str) -> str:
    return text.split("</think>", 1)[1] if "</think>" in text else text


def _is_call(item: Any) -> bool:
    return isinstance(item, dict) and isinstance(item.get("name"), str)


def _load_call(line: str, known_bad: set[str]) -> Any | None:
    """The JSON object a line holds when it is a call (a dict with a string ``name``), else None.

    ``known_bad`` collects the lines already found not to be calls: degenerate responses repeat
    one broken line thousands of times, and a failed ``json.loads`` is the slow case.
    """
    # Only text starting with "{" can decode to a dict, so the rest is never handed to json.
    if line in known_bad or not line.lstrip().startswith("{"):
        return None
    try:
        item = json.loads(line)
    except (ValueError, RecursionError):
        item = None
    if not _is_call(item):
        known_bad.add(line)
        return None
    return item


def xml_call_lines(response: str) -> tuple[bool, list[tuple[Any, str]], bool]:
    """(block present, one (parsed item or None, raw line) per call, parse_ok) of an XML response.

    Calls are read after ``</think>``, from every ``<tool_call>`` block, one JSON object per line.
    A block reads cleanly exactly when ``parse_tool_block`` would return only calls for it.
    """
    tail = _after_think(response if isinstance(response, str) else "")
    pieces = tail.split("<tool_call>")[1:]
    calls: list[tuple[Any, str]] = []
    ok = True
    known_bad: set[str] = set()
    for piece in pieces:
        items = _clean_block(piece.split("</tool_call>", 1)[0], known_bad)
        if items is not None:
            calls += [(item, json.dumps(item)) for item in items]
            continue
        ok = False
        # an unclosed block ends where the reply starts, so the reply is not read as a call
        block = piece.split("</tool_call>")[0] if "</tool_call>" in piece else piece.split("<response>")[0]
        calls += [(_load_call(line, known_bad), line.strip()) for line in block.split("\n") if line.strip()]
    return bool(pieces), calls, ok


def _clean_block(block: str, known_bad: set[str]) -> list[Any] | None:
    """The calls of a block whose every line is a call (as ``parse_tool_block`` reads it), else None."""
    items = []
    for line in block.strip().split("\n"):
        item = _load_call(line, known_bad)
        if item is None:
            return None
        items.append(item)
    return items


def extract_xml_calls(response: str) -> tuple[bool, list[str | None], bool]:
    """(block present, one name per call — None when unreadable, parse_ok) of an XML response."""
    present, calls, ok = xml_call_lines(response)
    return present, [item["name"] if item is not None else None for item, _ in calls], ok


def _harmony_calls(response: str) -> tuple[bool, list[str | None], bool]:
    # Optional sibling module: imported here so XML-only use never needs it.
    from src.formats.harmony import block_tool_call, parse_harmony, tool_calls_of

    parsed = parse_harmony(response if isinstance(response, str) else "")
    try:
        names: list[str | None] = [call["name"] for call in tool_calls_of(parsed)]
        return bool(names), names, True
    except ValueError:
        pass
    names = []
    for block in parsed.blocks:
        if block.recipient is None and block.terminator != _HARMONY_CALL:
            continue  # not addressed to a tool: reasoning or a reply, even if malformed
        try:
            call = block_tool_call(block)
            names.append(call["name"] if call else None)
        except ValueError:
            recipient = block.recipient or ""
            name = recipient[len(_FUNCTIONS) :] if recipient.startswith(_FUNCTIONS) else ""
            names.append(name if name.strip() else None)
    return bool(names), names, False


def tool_usage(
    response: str,
    families: ToolFamilies,
    fmt: str = "xml",
    descriptions: Mapping[str, str] | None = None,
) -> ToolUsage:
    """Tool calls of one decoded response, by family.

    Args:
        response: the assistant text (XML tags or harmony tokens as text).
        families: tool name -> family (overrides, then the keyword heuristic).
        fmt: "xml" for ``rlla`` data, "harmony" for ``rlla_gpt``.
        descriptions: optional tool name -> description from the prompt, for the heuristic.
    """
    if fmt == "xml":
        present, names, ok = extract_xml_calls(response)
    elif fmt == "harmony":
        present, names, ok = _harmony_calls(response)
    else:
        raise ValueError(f"unknown tool-call format {fmt!r}; expected one of {FORMATS}")
    descriptions = descriptions or {}
    per: dict[str, int] = {}
    for name, count in Counter(names).items():
        family = UNKNOWN if name is None else families.family(name, descriptions.get(name, ""))
        per[family] = per.get(family, 0) + count
    return ToolUsage(
        used_any_tool=present,
        used_search=per.get("search", 0) > 0,
        used_calculate=per.get("calculate", 0) > 0,
        used_other=per.get("other", 0) + per.get(UNKNOWN, 0) > 0,
        n_calls=len(names),
        calls_per_family=per,
        names=names,
        parse_ok=ok,
    )


# ---------------------------------------------------------------------------- tool cost
CostFn = Callable[[ToolUsage], float]
COST_FUNCTIONS: dict[str, Callable[..., float]] = {}


def register_cost(name: str) -> Callable[[Callable[..., float]], Callable[..., float]]:
    """Decorator adding a cost function ``fn(usage, **weights) -> float`` under ``name``."""

    def add(fn: Callable[..., float]) -> Callable[..., float]:
        if name in COST_FUNCTIONS:
            raise ValueError(f"cost function {name!r} is already registered")
        COST_FUNCTIONS[name] = fn
        return fn

    return add


@register_cost("any_tool")
def any_tool(usage: ToolUsage, c_tool: float = 1.0) -> float:
    """c_tool when the response holds any tool-call block, else 0."""
    return float(c_tool) if usage.used_any_tool else 0.0


@register_cost("per_family")
def per_family(
    usage: ToolUsage, c_search: float = 1.0, c_calculate: float = 1.0, c_other: float = 1.0
) -> float:
    """Weighted sum of the families used (each family counted once, however many calls)."""
    return (
        c_search * float(usage.used_search)
        + c_calculate * float(usage.used_calculate)
        + c_other * float(usage.used_other)
    )


@register_cost("per_call")
def per_call(usage: ToolUsage, c_call: float = 1.0, cap: float | None = None) -> float:
    """c_call per call, clipped at ``cap`` when given."""
    cost = c_call * usage.n_calls
    return float(cost if cap is None else min(cost, cap))


def make_cost_fn(name: str, **weights: float) -> CostFn:
    """The registered cost ``name`` with its weights bound: ``usage -> float``.

    Raises ValueError for an unknown name, an unknown weight, or a non-finite weight.
    """
    if name not in COST_FUNCTIONS:
        raise ValueError(f"unknown tool cost {name!r}; registered: {sorted(COST_FUNCTIONS)}")
    fn = COST_FUNCTIONS[name]
    params = {k: p for k, p in inspect.signature(fn).parameters.items() if k != "usage"}
    for key, value in weights.items():
        if key not in params:
            raise ValueError(f"tool cost {name!r} has no weight {key!r}; its weights: {list(params)}")
        if value is None and params[key].default is None:
            continue  # an optional weight such as per_call's cap
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"tool cost {name!r}: weight {key}={value!r} is not a finite number")
    return functools.partial(fn, **weights)


def max_cost(name: str, weights: dict[str, float]) -> float:
    """The largest cost one rollout can have: the bound cost of a response that uses every family
    and makes unboundedly many calls (inf when nothing caps it). ValueError as ``make_cost_fn``."""
    worst = ToolUsage(True, True, True, True, n_calls=math.inf)
    top = make_cost_fn(name, **weights)(worst)
    return 0.0 if math.isnan(top) else float(top)  # a zero per-call weight: 0 · inf


def batch_cost(usages: Iterable[ToolUsage], cost_fn: CostFn) -> list[float]:
    """One cost per trajectory, in order."""
    return [cost_fn(usage) for usage in usages]
