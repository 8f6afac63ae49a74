"""Synthetic RLLA rows: short tool-use prompts whose right action must be read from the request.

Each row lists two search and two calculate tools (plus "other" tools when ``max_tools`` allows;
at most ``max_params`` parameters in all, to keep prompts short) from a fixed catalogue, in the
RLLA system-prompt layout, and asks for one of
    search / calculate, exact   e.g. "Is it raining in Oslo?" -> one call of the tool the request
                                names, its values copied from the text: a tool pays a lot
    search / calculate, vague   e.g. "Look something up for me." -> one call of a listed tool of that
                                family, values drawn at random (``low_gain`` of the tool rows): the
                                tool name and values can only be guessed, so a tool pays little
    answer                      greeting / chit-chat / small talk -> <response> only, no tool
in the configured proportions. Requests are composed from templates x entities x phrasings
(``synthetic_text``); the test split draws from templates no training row uses. Since every row
lists two tools per family, a family route (``prompt_mode: only_family``) never singles out the
ground-truth tool, and routing to the wrong family leaves only wrong tools in view. Output parquet
has exactly the schema of ToolRL's rlla_4k files (see ``schema.RLLA_ARROW_SCHEMA``); the family of
a row is recoverable from its ground truth (``ground_truth_family``), its request class from its
text (``synthetic_text.request_class``), so no extra columns are needed.

The prompt is a shortened version of ToolRL's RLLA system prompt (Apache-2.0): same sections in
the same order, fewer words, so it fits a tiny model's context.

Two-call rows (``generate_multi_call_rows``, the curriculum's harder lesson): each row joins two
single-call requests of the synthetic catalogue ("... Also, ..."); its ground truth is one
``<tool_call>`` block with both calls, one JSON object per line, as in RLLA's multi-call rows. Same
arrow schema as the single-call rows.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from src.datamodules.schema import RLLA_ARROW_SCHEMA
from src.datamodules.synthetic_text import make_request, request_class

__all__ = [
    "FAMILIES",
    "TOOLS",
    "SyntheticOptions",
    "ToolSpec",
    "build_system_prompt",
    "build_user_turn",
    "generate_rlla_rows",
    "ground_truth_family",
    "is_vague_request",
    "write_synthetic_rlla",
    "generate_multi_call_rows",
    "write_multi_call_rlla",
]

FAMILIES = ("search", "calculate", "other")
TASK_KINDS = ("search", "calculate", "answer")


# Bump when the generated text changes: cache keys (tiny tokenizer, cached data) include it.
GENERATOR_VERSION = 4


@dataclass(frozen=True)
class ToolSpec:
    """One tool: RLLA-style parameters ``{name: {"description", "type", "default"}}`` and its family."""

    name: str
    description: str
    parameters: dict[str, dict[str, str]]
    family: str


def _p(description: str, type_: str = "string", default: str = "") -> dict[str, str]:
    return {"description": description, "type": type_, "default": default}


_TOOL_LIST = [
    ToolSpec("web_search", "Search the web.", {"query": _p("Query")}, "search"),
    ToolSpec("news_lookup", "Latest news on a topic.", {"topic": _p("Topic")}, "search"),
    ToolSpec("weather_lookup", "Current weather in a city.", {"city": _p("City")}, "search"),
    ToolSpec("stock_quote", "Latest stock price.", {"symbol": _p("Ticker")}, "search"),
    ToolSpec("wiki_lookup", "Encyclopedia article summary.", {"title": _p("Title")}, "search"),
    ToolSpec("calculator", "Evaluate arithmetic.", {"expression": _p("Expression")}, "calculate"),
    ToolSpec(
        "unit_converter",
        "Convert between units.",
        {"value": _p("Amount", "float"), "from": _p("Unit"), "to": _p("Unit")},
        "calculate",
    ),
    ToolSpec(
        "currency_converter",
        "Convert between currencies.",
        {"amount": _p("Amount", "float"), "from": _p("Code"), "to": _p("Code")},
        "calculate",
    ),
    ToolSpec(
        "percentage",
        "Percent of a number.",
        {"percent": _p("Percent", "float"), "number": _p("Number", "float")},
        "calculate",
    ),
    ToolSpec(
        "loan_payment",
        "Monthly loan payment.",
        {"principal": _p("Amount", "float"), "rate": _p("Rate %", "float"), "years": _p("Years", "int")},
        "calculate",
    ),
    ToolSpec("send_email", "Send an email.", {"to": _p("Recipient"), "body": _p("Message")}, "other"),
    ToolSpec("set_reminder", "Set a reminder.", {"text": _p("Text"), "time": _p("When")}, "other"),
    ToolSpec("play_music", "Play a song.", {"song": _p("Title")}, "other"),
    ToolSpec("create_note", "Save a note.", {"text": _p("Text")}, "other"),
]
TOOLS: dict[str, ToolSpec] = {t.name: t for t in _TOOL_LIST}
_FAMILY_TOOLS = {f: [t for t in _TOOL_LIST if t.family == f] for f in FAMILIES}
_PER_FAMILY = 2  # tools of each task family listed in every row
# the largest tool beside three 1-parameter tools (every family has one)
_MIN_PARAM_BUDGET = max(len(t.parameters) for t in _TOOL_LIST) + 2 * _PER_FAMILY - 1

# ---------------------------------------------------------------- prompt layout (RLLA sections)
INTRO = "You are a helpful assistant that can call tools to solve user tasks."
TOOLS_HEADER = "**Available Tools**\nYou can use these tools:"
STEPS = (
    "**Steps for Each Turn**\n"
    "1. **Think:** analyze the goal.\n"
    "2. **Decide on Tool Usage:** call a tool if needed.\n"
    "3. **Respond Appropriately:** else answer directly."
)
OUTPUT_FORMAT = (
    "**Output Format**\n"
    "```plaintext\n"
    "<think> reasoning </think>\n"
    "<tool_call>\n"
    '{"name": "Tool name", "parameters": {"Parameter name": "value"}}\n'
    "</tool_call>\n"
    "<response> answer </response>\n"
    "```"
)
NOTES = (
    "**Important Notes**\n"
    "1. Always think first, then give a tool call or a response.\n"
    "2. One JSON tool call per line."
)


def build_system_prompt(tools: Sequence[ToolSpec]) -> str:
    """The RLLA-layout system message listing ``tools`` (numbered Name/Description/Parameters)."""
    items = [
        f"{i}. Name: {t.name}\nDescription: {t.description}\nParameters: {json.dumps(t.parameters)}"
        for i, t in enumerate(tools, start=1)
    ]
    return "\n\n".join([INTRO, TOOLS_HEADER + "\n" + "\n".join(items), STEPS, OUTPUT_FORMAT, NOTES])


def build_user_turn(text: str) -> str:
    """The RLLA user message: a one-turn dialogue history."""
    return f"**Dialogue Records History**\n<user> {text} </user>"


def _tool_ground_truth(think: str, name: str, parameters: dict[str, Any]) -> str:
    call = json.dumps({"name": name, "parameters": parameters})
    return f"<think> {think} </think>\n<tool_call>\n{call}\n</tool_call>"


def _answer_ground_truth(think: str, response: str) -> str:
    return f"<think> {think} </think>\n<response> {response} </response>"


def _exact_maker(tool: str):
    def make(rng: _R) -> tuple[str, dict[str, Any]]:
        text, params, _ = make_request(rng, "exact", tool, "train")
        return text, params

    return make


# tool name -> exact-request maker (training templates), for the two-call rows below
_REQUESTS = {t.name: _exact_maker(t.name) for t in _TOOL_LIST if t.family in ("search", "calculate")}

# Short reasoning keeps generations short (the tiny model samples every token on CPU).
_THINK = {
    "search": "A lookup: {tool}.",
    "calculate": "A calculation: {tool}.",
    "answer": "No tool needed.",
}


_R = random.Random


def _family_counts(n: int, p: Sequence[float]) -> list[int]:
    """Split n into len(p) integer counts proportional to p (largest remainder, ties by order)."""
    if any(x < 0 for x in p) or sum(p) <= 0:
        raise ValueError(f"proportions must be >= 0 with a positive sum, got {list(p)}")
    quotas = [n * x / sum(p) for x in p]
    counts = [int(q) for q in quotas]
    by_remainder = sorted(range(len(p)), key=lambda i: (-(quotas[i] - counts[i]), i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


def _fits(tools: Sequence[ToolSpec], reserve: int, max_params: int) -> bool:
    return _n_params(*tools) + reserve <= max_params


def _pick_tools(
    rng: _R, target: ToolSpec | None, min_tools: int, max_tools: int, max_params: int
) -> list[ToolSpec]:
    """Two search and two calculate tools (the target, if any, among them), then "other" tools up
    to ``min_tools..max_tools`` while at most ``max_params`` parameters are listed in all.

    Every row lists two tools of each family, so a family route (``only_family``) never singles
    out the ground-truth tool and the family must be read from the request, not from the list.
    """
    k = rng.randint(min_tools, max_tools)
    tools = [target] if target is not None else []
    for family in ("search", "calculate"):
        while sum(t.family == family for t in tools) < _PER_FAMILY:
            # leave room for one 1-parameter tool per slot still to fill
            left = 2 * _PER_FAMILY - len(tools) - 1
            fits = [
                t for t in _FAMILY_TOOLS[family] if t not in tools and _fits([*tools, t], left, max_params)
            ]
            tools.append(rng.choice(fits))
    others = [t for t in _FAMILY_TOOLS["other"] if _fits([*tools, t], 0, max_params)]
    while len(tools) < k and others:
        tools.append(others.pop(rng.randrange(len(others))))
        others = [t for t in others if _fits([*tools, t], 0, max_params)]
    rng.shuffle(tools)
    return tools


def _n_params(*tools: ToolSpec) -> int:
    return sum(len(t.parameters) for t in tools)


@dataclass(frozen=True)
class _RowSpec:
    """What one row asks: ``kind`` (search | calculate | answer) and whether the request is vague."""

    kind: str
    vague: bool
    split: str
    min_tools: int
    max_tools: int
    max_params: int


def _make_row(rng: _R, spec: _RowSpec, index: int, data_source: str) -> tuple[dict, str]:
    """One RLLA row and its request's template id."""
    if spec.kind == "answer":
        tools = _pick_tools(rng, None, spec.min_tools, spec.max_tools, spec.max_params)
        text, response, template = make_request(rng, "answer", "answer", spec.split)
        ground_truth = _answer_ground_truth(_THINK["answer"], response)
    else:
        target = rng.choice(_FAMILY_TOOLS[spec.kind])
        tools = _pick_tools(rng, target, spec.min_tools, spec.max_tools, spec.max_params)
        if spec.vague:
            text, params, template = make_request(rng, "vague", spec.kind, spec.split, tool=target.name)
        else:
            text, params, template = make_request(rng, "exact", target.name, spec.split)
        ground_truth = _tool_ground_truth(_THINK[spec.kind].format(tool=target.name), target.name, params)
    system, user = build_system_prompt(tools), build_user_turn(text)
    row = {
        "data_source": data_source,
        "prompt": [{"content": system, "role": "system"}, {"content": user, "role": "user"}],
        "ability": "math",  # ToolRL's files carry "math" for every row
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {
            "index": index,
            "input": user,
            "instruction": system,
            "output": ground_truth,
            "split": spec.split,
        },
    }
    return row, template


@dataclass(frozen=True)
class SyntheticOptions:
    """What the generator draws, beside the row count and seed.

    p_search / p_calculate / p_answer: family proportions (exact counts by largest remainder).
    data_source: every row's ``data_source``. min_tools / max_tools / max_params: the tools listed
    per row and the cap on their parameters in all. low_gain: the share of each tool family's rows
    that are vague requests.
    """

    p_search: float = 0.35
    p_calculate: float = 0.35
    p_answer: float = 0.3
    data_source: str = "rlla"
    min_tools: int = 4
    max_tools: int = 4
    max_params: int = 8
    low_gain: float = 0.0


def _check_args(n: int, o: SyntheticOptions) -> None:
    if not 0.0 <= o.low_gain <= 1.0:
        raise ValueError(f"low_gain must be in [0, 1], got {o.low_gain}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    lo = 2 * _PER_FAMILY
    if not lo <= o.min_tools <= o.max_tools <= len(_TOOL_LIST):
        raise ValueError(
            f"need {lo} <= min_tools <= max_tools <= {len(_TOOL_LIST)}, got {o.min_tools}, {o.max_tools}"
        )
    if o.max_params < _MIN_PARAM_BUDGET:
        raise ValueError(f"max_params must be >= {_MIN_PARAM_BUDGET} (two tools of each family)")


def generate_rows_with_templates(
    n: int,
    seed: int,
    options: SyntheticOptions = SyntheticOptions(),
    split: str = "train",
    start_index: int = 0,
) -> tuple[pd.DataFrame, list[str]]:
    """``generate_rlla_rows`` plus each row's request template id (in row order)."""
    o = options
    _check_args(n, o)
    rng = random.Random(seed)
    counts = _family_counts(n, (o.p_search, o.p_calculate, o.p_answer))
    kinds = []
    for kind, count in zip(TASK_KINDS, counts):
        n_vague = 0 if kind == "answer" else _family_counts(count, (1.0 - o.low_gain, o.low_gain))[1]
        kinds += [(kind, i < n_vague) for i in range(count)]
    rng.shuffle(kinds)
    template_split = "test" if split in ("test", "calib") else "train"
    made = [
        _make_row(
            rng,
            _RowSpec(kind, vague, template_split, o.min_tools, o.max_tools, o.max_params),
            start_index + i,
            o.data_source,
        )
        for i, (kind, vague) in enumerate(kinds)
    ]
    for row, _ in made:
        row["extra_info"]["split"] = split
    df = pd.DataFrame([row for row, _ in made], columns=list(RLLA_ARROW_SCHEMA.names))
    return df, [template for _, template in made]


def generate_rlla_rows(
    n: int, seed: int, *, split: str = "train", start_index: int = 0, **options: Any
) -> pd.DataFrame:
    """``n`` synthetic RLLA rows, deterministic in ``seed``.

    ``options``: ``SyntheticOptions`` fields (family proportions, ``low_gain``, listed tools).
    ``split`` ("test" draws from the held-out templates, anything else from the training ones),
    ``start_index`` (first ``extra_info.index``).
    """
    return generate_rows_with_templates(n, seed, SyntheticOptions(**options), split, start_index)[0]


def write_rlla_parquet(df: pd.DataFrame, path: str | Path) -> Path:
    """Write ``df`` with exactly ToolRL's arrow schema (atomically: temp name + rename)."""
    from src.atomic_files import atomic_file

    path = Path(path)
    with atomic_file(path) as tmp:
        pq.write_table(pa.Table.from_pandas(df, schema=RLLA_ARROW_SCHEMA, preserve_index=False), tmp)
    return path


def write_synthetic_rlla(
    out_dir: str | Path,
    n_train: int,
    n_test: int,
    seed: int = 0,
    options: SyntheticOptions = SyntheticOptions(),
    n_calib: int = 0,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` (and with ``n_calib`` > 0 ``calib.parquet``) under
    ``out_dir``; returns {split: path}.

    The test split uses its own random stream (seed + 1), the held-out request templates (so no
    test request appears in training) and indices after the train split's, so uids are unique
    over the files. The calibration split (``calibration_rows``) comes after the test split's.
    """
    train = generate_rows_with_templates(n_train, seed, options, "train", 0)[0]
    test = generate_rows_with_templates(n_test, seed + 1, options, "test", n_train)[0]
    out = Path(out_dir)
    files = {
        "train": write_rlla_parquet(train, out / "train.parquet"),
        "test": write_rlla_parquet(test, out / "test.parquet"),
    }
    if n_calib > 0:
        taken = set(prompt_texts(train)) | set(prompt_texts(test))
        calib = calibration_rows(n_calib, seed + 2, options, n_train + n_test, taken)
        files["calib"] = write_rlla_parquet(calib, out / "calib.parquet")
    return files


def calibration_rows(
    n: int, seed: int, options: SyntheticOptions, start_index: int, taken: set[str]
) -> pd.DataFrame:
    """``n`` prompts from the held-out (test) templates, on their own random stream, none of whose
    prompt texts (system + user turn) is in ``taken`` (the train and test splits'): a budget's
    threshold set on them has seen no prompt it is scored on. Drawn from 3n candidates in order;
    uids continue from ``start_index``.

    Not disjoint by user turn alone: a vague request has ~90 phrasings per family in the held-out
    templates, so two 2,048-prompt samples share most of them, and dropping the shared ones leaves
    almost no vague request (34 of 2,048 instead of 614) and a threshold calibrated on another mix
    (realised held-out tool rate 0.386 at B = 0.3, seed 0)."""
    candidates = generate_rows_with_templates(3 * n, seed, options, "calib", start_index)[0]
    fresh = [text not in taken for text in prompt_texts(candidates)]
    rows = candidates[fresh].head(n).reset_index(drop=True)
    if len(rows) < n:
        raise ValueError(f"only {len(rows)} of {n} calibration prompts have texts apart from train and test")
    return rows


def user_texts(frame: pd.DataFrame) -> list[str]:
    """Each row's user turn (the request the router reads)."""
    return [next(m["content"] for m in messages if m["role"] == "user") for messages in frame["prompt"]]


def prompt_texts(frame: pd.DataFrame) -> list[str]:
    """Each row's whole prompt text (every message's role and content, in order)."""
    return ["\x1e".join(f"{m['role']}\x1f{m['content']}" for m in messages) for messages in frame["prompt"]]


def is_vague_request(user_turn: str) -> bool:
    """Whether a user message (``build_user_turn`` text) is one of the vague, low-gain requests."""
    return request_class(user_turn) == "vague"


def ground_truth_family(ground_truth: str) -> str:
    """ "answer" (no tool call), a tool family of the catalogue, "mixed", or "unknown" (tool not listed)."""
    if "<tool_call>" not in ground_truth:
        return "answer"
    block = ground_truth.split("<tool_call>")[1].split("</tool_call>")[0].strip()
    families = set()
    for line in block.splitlines():
        name = json.loads(line).get("name")
        families.add(TOOLS[name].family if name in TOOLS else "unknown")
    return families.pop() if len(families) == 1 else "mixed"


# ---------------------------------------------------------------------------- two-call rows
MULTI_THINK = "The user asks for two things, so I will call {a} and {b} with the details from the request."


def _two_call_row(rng: random.Random, index: int, split: str, data_source: str) -> dict:
    names = rng.sample(sorted(_REQUESTS), 2)
    asks, calls = [], []
    for name in names:
        text, params = _REQUESTS[name](rng)
        asks.append(text)
        calls.append(json.dumps({"name": name, "parameters": params}))
    tools = [TOOLS[n] for n in names]
    extra = [t for t in _TOOL_LIST if t.name not in names]
    if extra:
        tools.append(rng.choice(extra))
    rng.shuffle(tools)
    text = f"{asks[0]} Also, {asks[1][0].lower()}{asks[1][1:]}"
    think = MULTI_THINK.format(a=names[0], b=names[1])
    ground_truth = f"<think> {think} </think>\n<tool_call>\n" + "\n".join(calls) + "\n</tool_call>"
    system, user = build_system_prompt(tools), build_user_turn(text)
    return {
        "data_source": data_source,
        "prompt": [{"content": system, "role": "system"}, {"content": user, "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {
            "index": index,
            "input": user,
            "instruction": system,
            "output": ground_truth,
            "split": split,
        },
    }


def generate_multi_call_rows(
    n: int, seed: int, split: str = "train", start_index: int = 0, data_source: str = "rlla"
) -> pd.DataFrame:
    """``n`` two-call rows, deterministic in ``seed``; ``extra_info.index`` from ``start_index``."""
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    rng = random.Random(seed)
    rows = [_two_call_row(rng, start_index + i, split, data_source) for i in range(n)]
    return pd.DataFrame(rows, columns=list(RLLA_ARROW_SCHEMA.names))


def write_multi_call_rlla(
    out_dir: str | Path, n_train: int, n_test: int, seed: int = 0, start_index: int = 0
):
    """``train.parquet`` / ``test.parquet`` of two-call rows; uids start at ``start_index``."""
    train = generate_multi_call_rows(n_train, seed, "train", start_index)
    test = generate_multi_call_rows(n_test, seed + 1, "test", start_index + n_train)
    out = Path(out_dir)
    return {
        "train": write_rlla_parquet(train, out / "train.parquet"),
        "test": write_rlla_parquet(test, out / "test.parquet"),
    }
