"""Tool families (search / calculate / other): a keyword labeller and sidecar overrides.

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

import csv
import json
import logging
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from src.formats.tools_block import ToolSpec

log = logging.getLogger(__name__)

SEARCH, CALCULATE, OTHER = "search", "calculate", "other"
FAMILIES = (SEARCH, CALCULATE, OTHER)

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
