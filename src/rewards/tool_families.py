"""Tool families (search / calculate / other): prompt parsing, a keyword labeller, overrides.

An RLLA system prompt lists its tools in an ``**Available Tools**`` section, one numbered item
per tool. Two item layouts occur in the real data and both are read:

    1. Name: GetNews                       (RLLA train/test/SFT)
    Description: Retrieve Azure news articles
    Parameters: {"page": {...}}

    1. QueryMeeting: The API for ...       (API-Bank level 3)
    Parameters: {'user_name': {...}}

Descriptions and parameters may span several lines; an item ends where the next number starts
(numbers must follow 1, 2, 3, ... so a numbered line inside a description is not a new tool). The
section ends at the next blank-line-separated ``**Heading**`` line. The harmony (GPT-OSS) prompts
keep the same tools section, so the parse is shared by both formats.

Family labels (``label_tool``), in order of precedence:
  1. the description's leading verb (after fillers such as "This API", "API that"):
     retrieve/fetch/get/search/query/return/provide/list... -> search;
     calculate/compute/convert/estimate/sum/count/sort... -> calculate;
     create/generate/send/update/delete/book/schedule/... (actions with side effects) -> other;
  2. when that verb is unknown or missing, the name's leading word, read the same way;
  3. for verbs that can go either way (find, check, validate, analyze, ...) or no known verb:
     a vote of topic keywords in name + description (news/weather/info/database... vs
     math/rate/percentage/loan/number/average...), the larger count wins;
  4. a tie falls back to the ambiguous verb's default (find -> search, check/verify/validate ->
     calculate), else ``other``.
The leading verb comes first because it says what the tool does ("Retrieve the exchange rates"
is a lookup even though "rate" is a calculation word). Overrides from a sidecar file always win.
"""

from __future__ import annotations

import ast
import csv
import json
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from src.rollout.routes import WeakLabel

__all__ = [
    "CALCULATE",
    "FAMILIES",
    "OTHER",
    "SEARCH",
    "ToolFamilies",
    "ToolSpec",
    "ToolsBlock",
    "label_tool",
    "load_family_file",
    "normalise_family",
    "parse_tools_block",
    "section_title",
    "split_sections",
    "tool_descriptions",
    "weak_label",
]

log = logging.getLogger(__name__)

SEARCH, CALCULATE, OTHER = "search", "calculate", "other"
FAMILIES = (SEARCH, CALCULATE, OTHER)

TOOLS_SECTION_TITLE = "available tools"

# ---------------------------------------------------------------- prompt sections and tools

_SECTION_SPLIT = re.compile(r"\n\n(?=\*\*[^*\n]+\*\*[ \t]*(?:\n|$))")
_HEADING = re.compile(r"\*\*([^*\n]+)\*\*[ \t]*(?:\n|$)")


def split_sections(text: str) -> list[str]:
    """Split a system prompt before each blank-line-separated ``**Heading**`` line.

    ``"\\n\\n".join(split_sections(text)) == text`` always holds; the first part is the preamble.
    """
    return _SECTION_SPLIT.split(text)


def section_title(section: str) -> str | None:
    """The heading text of a section ("Available Tools"), or None for a preamble."""
    match = _HEADING.match(section)
    return match.group(1).strip() if match else None


@dataclass(frozen=True)
class ToolSpec:
    """One tool item of the Available Tools section.

    ``text`` is the item exactly as written (all its lines, starting with "N. "); ``parameters``
    is the raw text after "Parameters:" (JSON in RLLA, a Python literal in API-Bank).
    """

    number: int
    name: str
    description: str
    parameters: str
    text: str

    def renumbered(self, number: int) -> str:
        """The item's text with its leading number replaced."""
        return re.sub(r"^\d+\.", f"{number}.", self.text, count=1)

    def parameters_dict(self) -> dict[str, Any] | None:
        """The parameters as a dict (JSON, else Python literal), or None when unreadable."""
        for parse in (json.loads, ast.literal_eval):
            try:
                value = parse(self.parameters)
            except (ValueError, SyntaxError, TypeError, RecursionError, MemoryError):
                continue
            if isinstance(value, dict):
                return value
        return None


@dataclass(frozen=True)
class ToolsBlock:
    """The Available Tools section of a system prompt: ``text[start:end]`` is the section."""

    start: int
    end: int
    heading: str
    intro: tuple[str, ...]
    tools: tuple[ToolSpec, ...]

    def render(self, tools: Iterable[ToolSpec]) -> str:
        """The section text listing ``tools`` (renumbered from 1) under the same heading and intro."""
        items = [tool.renumbered(i) for i, tool in enumerate(tools, start=1)]
        return "\n".join([self.heading, *self.intro, *items])


def _item_start(line: str, number: int, layout: str | None) -> tuple[str, str, str] | None:
    """(layout, name, rest of line) when ``line`` opens tool item ``number``."""
    named = re.match(rf"{number}\.\s+Name:\s*(.*)$", line)
    if named and layout in (None, "named"):
        return "named", named.group(1).strip(), ""
    inline = re.match(rf"{number}\.\s+(\S[^:\n]*?):\s*(.*)$", line)
    if inline and layout in (None, "inline") and not named:
        return "inline", inline.group(1).strip(), inline.group(2)
    return None


def _parse_item(number: int, layout: str, name: str, rest: str, lines: list[str]) -> ToolSpec:
    body = lines[1:]
    param_at = next((i for i, line in enumerate(body) if line.startswith("Parameters:")), None)
    desc_lines = body if param_at is None else body[:param_at]
    parameters = "" if param_at is None else "\n".join(body[param_at:])[len("Parameters:") :].strip()
    if layout == "named":
        desc = "\n".join(desc_lines)
        desc = desc[len("Description:") :] if desc.startswith("Description:") else desc
    else:
        desc = "\n".join([rest, *desc_lines])
    return ToolSpec(number, name, desc.strip(), parameters, "\n".join(lines))


def parse_tools_block(system_text: str) -> ToolsBlock | None:
    """Find and parse the Available Tools section; None when the prompt has none."""
    sections = split_sections(system_text)
    offset = 0
    for section in sections:
        title = section_title(section)
        if title is not None and title.lower() == TOOLS_SECTION_TITLE:
            return _parse_section(section, offset)
        offset += len(section) + 2
    return None


def _parse_section(section: str, offset: int) -> ToolsBlock:
    lines = section.split("\n")
    heading, body = lines[0], lines[1:]
    starts: list[tuple[int, str, str, str]] = []  # (line index, layout, name, rest)
    layout: str | None = None
    for i, line in enumerate(body):
        found = _item_start(line, len(starts) + 1, layout)
        if found:
            layout = found[0]
            starts.append((i, *found))
    intro = tuple(body[: starts[0][0]] if starts else body)
    tools = []
    for k, (i, item_layout, name, rest) in enumerate(starts):
        stop = starts[k + 1][0] if k + 1 < len(starts) else len(body)
        tools.append(_parse_item(k + 1, item_layout, name, rest, body[i:stop]))
    return ToolsBlock(offset, offset + len(section), heading, intro, tuple(tools))


# ---------------------------------------------------------------- keyword labeller


def _forms(*verbs: str) -> frozenset[str]:
    out = set()
    for verb in verbs:
        out |= {verb, verb + "s", verb + "es", verb + "d", verb + "ed"}
        if verb.endswith("y"):
            out.add(verb[:-1] + "ies")
    return frozenset(out)


_SEARCH_VERBS = _forms(
    "retrieve",
    "fetch",
    "get",
    "search",
    "lookup",
    "look",
    "query",
    "return",
    "list",
    "provide",
    "read",
    "track",
    "monitor",
    "download",
    "scrape",
    "browse",
    "show",
    "display",
    "view",
    "locate",
    "obtain",
    "access",
    "collect",
    "gather",
    "request",
    "load",
    "find",
)
_CALC_VERBS = _forms(
    "calculate",
    "compute",
    "convert",
    "estimate",
    "sum",
    "count",
    "sort",
    "reverse",
    "split",
    "integrate",
    "multiply",
    "divide",
    "solve",
    "project",
    "round",
    "merge",
    "measure",
    "differentiate",
    "simulate",
    "average",
    "quantify",
    "approximate",
)
_ACTION_VERBS = _forms(
    "create",
    "generate",
    "build",
    "sell",
    "buy",
    "upgrade",
    "schedule",
    "enroll",
    "send",
    "post",
    "update",
    "delete",
    "remove",
    "cancel",
    "modify",
    "book",
    "register",
    "set",
    "manage",
    "login",
    "log",
    "authenticate",
    "sign",
    "upload",
    "join",
    "test",
    "play",
    "start",
    "stop",
    "submit",
    "save",
    "make",
    "edit",
    "add",
    "reserve",
    "transfer",
    "pay",
    "publish",
    "share",
    "subscribe",
    "translate",
    "record",
    "assign",
    "invite",
    "notify",
    "allow",
    "apply",
    "open",
    "close",
    "change",
    "plan",
    "design",
    "draw",
    "render",
    "encode",
    "decode",
    "shorten",
    "resize",
    "optimize",
    "allocate",
    "configure",
    "install",
    "execute",
    "run",
    "control",
    "move",
    "place",
)
# Verbs that do not decide on their own; what they fall back to after the keyword vote.
_AMBIGUOUS_DEFAULT = {
    **dict.fromkeys(_forms("find"), SEARCH),
    **dict.fromkeys(_forms("check", "verify", "validate", "determine", "compare"), CALCULATE),
    **dict.fromkeys(
        _forms(
            "detect",
            "analyze",
            "analyse",
            "evaluate",
            "assess",
            "perform",
            "extract",
            "identify",
            "classify",
            "predict",
            "recognize",
            "process",
            "format",
            "parse",
        ),
        OTHER,
    ),
}
_SEARCH_WORDS = frozenset(
    "search retrieve retrieves lookup fetch fetches news weather info information query database "
    "details latest current forecast trending availability available history historical live "
    "realtime data records listings catalog directory files archive feed headlines reviews "
    "search searches".split()
)
_CALC_WORDS = frozenset(
    "calculate calculates calculator calculation compute computes computation convert converts "
    "conversion converter sum math mathematical arithmetic rate percentage percent loan mortgage "
    "interest average mean median derivative integral factorial fibonacci gcd lcm divisor multiple "
    "probability density deviation variance square prime number numbers integer integers digit "
    "digits vector vectors matrix equation formula palindrome anagram anagrams parentheses subarray "
    "sorted longest shortest maximum minimum duplicate bmi tax area angle leap binary string "
    "statistics distance roi".split()
)
_FILLERS = frozenset(
    "this that the a an api apis endpoint is are was used use to which tool function service will "
    "can it helper method allows simple".split()
)


def _words(text: str) -> list[str]:
    """Lower-case words, splitting snake_case, dotted.names and camelCase (GetPowerBINews)."""
    out: list[str] = []
    for part in re.split(r"[^A-Za-z0-9]+", text):
        out += re.findall(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+", part)
    return [w.lower() for w in out]


def _lead_verb(words: list[str]) -> str | None:
    return next((w for w in words if w not in _FILLERS), None)


def _verb_family(verb: str | None) -> str | None:
    if verb in _SEARCH_VERBS and verb not in _AMBIGUOUS_DEFAULT:
        return SEARCH
    if verb in _CALC_VERBS:
        return CALCULATE
    if verb in _ACTION_VERBS:
        return OTHER
    return None


def label_tool(name: str, description: str = "") -> str:
    """Heuristic family of a tool: "search", "calculate" or "other" (rules in the module doc)."""
    name_words, desc_words = _words(name), _words(description.replace("binary search", "binary"))
    verbs = [v for v in (_lead_verb(desc_words), _lead_verb(name_words)) if v is not None]
    ambiguous = None
    for verb in verbs:
        family = _verb_family(verb)
        if family is not None:
            return family
        if verb in _AMBIGUOUS_DEFAULT:
            ambiguous = verb
            break
    words = [w for w in name_words + desc_words if w != ambiguous]
    n_search = sum(w in _SEARCH_WORDS for w in words)
    n_calc = sum(w in _CALC_WORDS for w in words)
    if n_calc != n_search:
        return CALCULATE if n_calc > n_search else SEARCH
    return _AMBIGUOUS_DEFAULT.get(ambiguous, OTHER) if ambiguous else OTHER


# ---------------------------------------------------------------- overrides and the family map


def normalise_family(value: Any) -> str | None:
    """ "search"/"SEARCH"/"SEARCH-FAMILY" -> "search"; None when not a family."""
    if not isinstance(value, str):
        return None
    key = value.strip().lower()
    for suffix in ("-family", "_family", " family"):
        key = key.removesuffix(suffix)
    return key if key in FAMILIES else None


def load_family_file(path: str | Path) -> dict[str, str]:
    """Read tool-name -> family overrides from ``.json`` (an object) or ``.csv`` (name,family).

    Raises ValueError naming the file and the key (JSON) or line (CSV) of any bad entry.
    """
    path = Path(path)
    allowed = ", ".join(FAMILIES)
    if path.suffix.lower() == ".json":
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err})") from None
        if not isinstance(raw, dict):
            got = type(raw).__name__
            raise ValueError(f"{path}: expected a JSON object {{tool name: family}}, got {got}")
        out = {}
        for name, value in raw.items():
            family = normalise_family(value)
            if family is None or not name.strip():
                raise ValueError(f"{path}: tool {name!r}: family {value!r} is not one of {allowed}")
            out[name] = family
        return out
    if path.suffix.lower() == ".csv":
        out, seen_at = {}, {}
        with path.open(newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            if reader.fieldnames is None or not {"name", "family"} <= set(reader.fieldnames):
                raise ValueError(f"{path}: the header must have columns name,family; got {reader.fieldnames}")
            for row in reader:
                line = reader.line_num
                name, value = (row.get("name") or "").strip(), row.get("family")
                family = normalise_family(value)
                if not name:
                    raise ValueError(f"{path}: line {line}: empty tool name")
                if family is None:
                    raise ValueError(
                        f"{path}: line {line}: tool {name!r}: family {value!r} is not one of {allowed}"
                    )
                if name in out and out[name] != family:
                    raise ValueError(
                        f"{path}: line {line}: tool {name!r} is {family!r} here"
                        f" but {out[name]!r} on line {seen_at[name]}"
                    )
                out[name], seen_at[name] = family, line
        return out
    raise ValueError(f"{path}: family overrides must be a .json or .csv file")


class ToolFamilies:
    """Family of a tool by name: overrides first (from a sidecar), else ``label_tool``."""

    def __init__(self, overrides: Mapping[str, str] | None = None, source: str | None = None) -> None:
        self.source = source
        self.overrides: dict[str, str] = {}
        for name, value in (overrides or {}).items():
            family = normalise_family(value)
            if family is None:
                where = f"{source}: " if source else ""
                allowed = ", ".join(FAMILIES)
                raise ValueError(f"{where}tool {name!r}: family {value!r} is not one of {allowed}")
            self.overrides[name] = family

    @classmethod
    def from_file(cls, path: str | Path | None) -> ToolFamilies:
        """Overrides from a sidecar JSON/CSV; ``None`` gives the heuristic alone."""
        if path is None:
            return cls()
        return cls(load_family_file(path), source=str(path))

    def family(self, name: str, description: str = "") -> str:
        """ "search" | "calculate" | "other" for one tool."""
        if name in self.overrides:
            return self.overrides[name]
        return label_tool(name, description)

    def of_tools(self, tools: Iterable[ToolSpec]) -> dict[str, str]:
        """Tool name -> family for the tools of a prompt (in prompt order)."""
        return {tool.name: self.family(tool.name, tool.description) for tool in tools}

    def __repr__(self) -> str:
        return f"ToolFamilies(overrides={len(self.overrides)}, source={self.source!r})"


def tool_descriptions(system_text: str) -> dict[str, str]:
    """Tool name -> description for the tools listed in a system prompt (empty when none)."""
    block = parse_tools_block(system_text)
    return {} if block is None else {tool.name: tool.description for tool in block.tools}


def weak_label(
    ground_truth: str,
    families: ToolFamilies,
    fmt: str = "xml",
    descriptions: Mapping[str, str] | None = None,
) -> str:
    """Weak router label of an example from its ground-truth tool calls.

    No call -> "ANSWER"; every call a search tool -> "SEARCH"; every call a calculate tool ->
    "CALCULATE"; anything else (both families, any "other" tool, or a call whose JSON cannot be
    read so its family is unknown) -> "MIXED". ``descriptions`` (tool name -> description, e.g.
    from ``tool_descriptions(system prompt)``) sharpens the heuristic for unlabelled names.
    ``fmt`` is "xml" (``rlla``) or "harmony" (``rlla_gpt``).
    """
    from src.rewards.tool_usage import tool_usage  # tool_usage needs nothing from here at import

    usage = tool_usage(ground_truth, families, fmt=fmt, descriptions=descriptions)
    if usage.n_calls == 0 and not usage.used_any_tool:
        return WeakLabel.ANSWER.value
    per = usage.calls_per_family
    if usage.n_calls > 0 and per.get(SEARCH, 0) == usage.n_calls:
        return WeakLabel.SEARCH.value
    if usage.n_calls > 0 and per.get(CALCULATE, 0) == usage.n_calls:
        return WeakLabel.CALCULATE.value
    return WeakLabel.MIXED.value
