"""Synthetic RLLA rows: short tool-use prompts whose right action is clear from the request.

Each row lists 2-3 tools (at most 5 parameters in all, to keep prompts short) from a fixed
catalogue (search-, calculate- and other-family) in the RLLA system-prompt layout, and asks for one of
    search      e.g. "weather in Oslo"        -> one call of a search tool, query copied from the request
    calculate   e.g. "convert 5 km to miles"  -> one call of a calculate tool, numbers copied
    answer      greeting / chit-chat / simple fact -> <response> only, no tool
in the configured proportions. With ``low_gain`` > 0 that share of the search and calculate rows
are *vague* requests ("How is the weather?", "Help me with a percentage."): the ground truth calls
the right tool, but its argument values are not in the request, so a model can get the tool and
its keys right and the values only by luck. A tool pays a lot on an exact request, a little on a
vague one and nothing on a no-tool request: the setting in which a budgeted router must choose.
Every row lists at least one search and one calculate tool, so routing to the wrong family (with
``prompt_mode: only_family``) leaves only wrong tools in view. Output parquet has exactly the schema of ToolRL's rlla_4k files
(see ``schema.RLLA_ARROW_SCHEMA``); the family of a row is recoverable from its ground truth
(``ground_truth_family``), so no extra columns are needed.

The prompt is a shortened version of ToolRL's RLLA system prompt (Apache-2.0): same sections in
the same order, fewer words, so it fits a tiny model's context.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from src.datamodules.schema import RLLA_ARROW_SCHEMA

__all__ = [
    "FAMILIES",
    "TOOLS",
    "ToolSpec",
    "build_system_prompt",
    "build_user_turn",
    "generate_rlla_rows",
    "ground_truth_family",
    "is_vague_request",
    "write_synthetic_rlla",
]

FAMILIES = ("search", "calculate", "other")
TASK_KINDS = ("search", "calculate", "answer")


# Bump when the generated text changes: cache keys (tiny tokenizer, cached data) include it.
GENERATOR_VERSION = 2


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
# every target tool must fit beside one tool of another family
_MIN_PARAM_BUDGET = max(len(t.parameters) for t in _TOOL_LIST) + 1

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


# ---------------------------------------------------------------- request templates
_CITIES = [
    "Paris",
    "Tokyo",
    "Oslo",
    "Cairo",
    "Lima",
    "Berlin",
    "Madrid",
    "Toronto",
    "Sydney",
    "Nairobi",
    "Seoul",
    "Dublin",
    "Chicago",
    "Mumbai",
    "Lisbon",
    "Prague",
    "Denver",
    "Vienna",
    "Bangkok",
    "Boston",
]
_TOPICS = [
    "electric cars",
    "the stock market",
    "space exploration",
    "climate policy",
    "the Olympics",
    "artificial intelligence",
    "housing prices",
    "renewable energy",
    "the World Cup",
    "vaccines",
    "cryptocurrency",
    "video games",
    "the film festival",
    "public transport",
    "solar panels",
]
_SYMBOLS = ["AAPL", "MSFT", "TSLA", "AMZN", "NVDA", "GOOG", "META", "IBM", "INTC", "NFLX", "ORCL", "SAP"]
_TITLES = [
    "Photosynthesis",
    "The Roman Empire",
    "Marie Curie",
    "Black holes",
    "The Great Wall",
    "Plate tectonics",
    "Jazz",
    "The printing press",
    "Volcanoes",
    "Ada Lovelace",
    "The Amazon River",
    "Quantum computing",
    "Ancient Egypt",
    "The Moon landing",
    "Honeybees",
]
_QUERIES = [
    "best hiking trails near {city}",
    "cheap flights to {city}",
    "vegan restaurants in {city}",
    "museums in {city}",
    "how to learn {lang}",
    "{lang} tutorial for beginners",
    "used bikes in {city}",
]
_LANGS = ["Python", "Spanish", "guitar", "chess", "Rust", "painting", "French", "SQL"]
_UNITS = [
    ("km", "miles"),
    ("miles", "km"),
    ("kg", "pounds"),
    ("pounds", "kg"),
    ("celsius", "fahrenheit"),
    ("meters", "feet"),
    ("liters", "gallons"),
    ("inches", "cm"),
]
_CURRENCIES = ["USD", "EUR", "GBP", "JPY", "CAD", "CHF", "AUD", "INR"]

_R = random.Random


def _num(rng: _R, lo: int, hi: int) -> int | float:
    """An integer, or a number with one decimal a quarter of the time (copied as-is into the call)."""
    if rng.random() < 0.25:
        return round(rng.uniform(lo, hi), 1)
    return rng.randint(lo, hi)


# phrasings per search tool; {q} is copied verbatim into the call's one parameter
_PHRASES = {
    "web_search": [
        "Search the web for {q}.",
        "Can you search online for {q}?",
        "Find web results about {q}.",
    ],
    "news_lookup": [
        "What is the latest news about {q}?",
        "Get me recent headlines on {q}.",
        "Any news on {q} today?",
    ],
    "weather_lookup": [
        "What's the weather in {q} right now?",
        "Is it raining in {q} today?",
        "Check the weather in {q}.",
    ],
    "stock_quote": [
        "What is the current stock price of {q}?",
        "Get me a quote for {q} shares.",
        "How is {q} trading now?",
    ],
    "wiki_lookup": [
        "Look up {q} on Wikipedia.",
        "Find the encyclopedia article on {q}.",
        "Get the wiki summary of {q}.",
    ],
}

_Request = Callable[[random.Random], tuple[str, dict[str, Any]]]


def _search_request(tool: str, param: str, pick: Callable[[_R], str]) -> _Request:
    """A search request maker: the query slot is copied verbatim into the call's one parameter."""

    def make(rng: _R) -> tuple[str, dict[str, Any]]:
        q = pick(rng)
        return rng.choice(_PHRASES[tool]).format(q=q), {param: q}

    return make


def _web_query(rng: _R) -> str:
    return rng.choice(_QUERIES).format(city=rng.choice(_CITIES), lang=rng.choice(_LANGS))


def _calc_expression(rng: _R) -> tuple[str, dict[str, Any]]:
    n_terms = rng.choice([2, 2, 3])
    expr = str(rng.randint(2, 999))
    for _ in range(n_terms - 1):
        expr += rng.choice(["+", "-", "*", "/"]) + str(rng.randint(2, 99))
    text = rng.choice(["What is {e}?", "Calculate {e}.", "Compute {e} for me."])
    return text.format(e=expr), {"expression": expr}


def _calc_units(rng: _R) -> tuple[str, dict[str, Any]]:
    v = _num(rng, 1, 500)
    src, dst = rng.choice(_UNITS)
    text = rng.choice(["Convert {v} {a} to {b}.", "How many {b} is {v} {a}?", "What is {v} {a} in {b}?"])
    return text.format(v=str(v), a=src, b=dst), {"value": v, "from": src, "to": dst}


def _calc_currency(rng: _R) -> tuple[str, dict[str, Any]]:
    amount = _num(rng, 5, 5000)
    src, dst = rng.sample(_CURRENCIES, 2)
    text = rng.choice(["Convert {x} {a} to {b}.", "How much is {x} {a} in {b}?", "Change {x} {a} into {b}."])
    return text.format(x=str(amount), a=src, b=dst), {"amount": amount, "from": src, "to": dst}


def _calc_percent(rng: _R) -> tuple[str, dict[str, Any]]:
    p, n = rng.randint(1, 99), _num(rng, 10, 10000)
    text = rng.choice(["What is {p}% of {n}?", "Calculate {p} percent of {n}.", "Find {p}% of {n}."])
    return text.format(p=p, n=str(n)), {"percent": p, "number": n}


def _calc_loan(rng: _R) -> tuple[str, dict[str, Any]]:
    principal = rng.randrange(1000, 500001, 500)
    rate = round(rng.uniform(1, 12), 1)
    years = rng.randint(1, 30)
    text = rng.choice(
        [
            "What is the monthly payment on a {x} loan at {r}% for {y} years?",
            "Compute the monthly payment for borrowing {x} at {r}% over {y} years.",
        ]
    )
    return text.format(x=principal, r=rate, y=years), {"principal": principal, "rate": rate, "years": years}


# tool name -> request maker; each returns (user text, call parameters copied from the text)
_REQUESTS: dict[str, _Request] = {
    "web_search": _search_request("web_search", "query", _web_query),
    "news_lookup": _search_request("news_lookup", "topic", lambda rng: rng.choice(_TOPICS)),
    "weather_lookup": _search_request("weather_lookup", "city", lambda rng: rng.choice(_CITIES)),
    "stock_quote": _search_request("stock_quote", "symbol", lambda rng: rng.choice(_SYMBOLS)),
    "wiki_lookup": _search_request("wiki_lookup", "title", lambda rng: rng.choice(_TITLES)),
    "calculator": _calc_expression,
    "unit_converter": _calc_units,
    "currency_converter": _calc_currency,
    "percentage": _calc_percent,
    "loan_payment": _calc_loan,
}

# Vague requests: the right tool is clear, its argument values are not in the text (the ground
# truth's values come from the tool's request maker above, so a model can only guess them).
_VAGUE: dict[str, list[str]] = {
    "web_search": ["Search the web for something fun.", "Find me something interesting online."],
    "news_lookup": ["Any news today?", "What is in the news?"],
    "weather_lookup": ["How is the weather?", "Will it rain later?"],
    "stock_quote": ["How are my stocks doing?", "Check a share price for me."],
    "wiki_lookup": ["Look up a random article.", "Tell me about some topic from the encyclopedia."],
    "calculator": ["Do some arithmetic for me.", "Compute a sum for me."],
    "unit_converter": ["Convert a measurement for me.", "Help me convert some units."],
    "currency_converter": ["Convert some money for me.", "What is my cash worth abroad?"],
    "percentage": ["Help me with a percentage.", "Work out a percent for me."],
    "loan_payment": ["What would my loan payment be?", "Estimate a mortgage payment for me."],
}

# (user text, direct response) pairs that need no tool
_ANSWERS = [
    ("Hi there!", "Hello! How can I help you today?"),
    ("Good morning!", "Good morning! What can I do for you?"),
    ("Hello, how are you?", "I'm doing well, thank you! How can I help?"),
    ("Thanks for your help.", "You're welcome! Let me know if you need anything else."),
    ("Thank you, that's all.", "Glad I could help. Have a great day!"),
    ("What can you do?", "I can answer questions and use tools to look things up or calculate."),
    ("Who are you?", "I am a helpful assistant that can use tools when needed."),
    ("Tell me a joke.", "Why did the scarecrow win an award? Because he was outstanding in his field."),
    ("How many days are in a week?", "There are seven days in a week."),
    ("What color is the sky on a clear day?", "On a clear day the sky is blue."),
    ("What is the capital of France?", "The capital of France is Paris."),
    ("What is the capital of Japan?", "The capital of Japan is Tokyo."),
    ("How many legs does a spider have?", "A spider has eight legs."),
    ("Who wrote Romeo and Juliet?", "Romeo and Juliet was written by William Shakespeare."),
    ("What do bees make?", "Bees make honey."),
    ("Which planet do we live on?", "We live on Earth."),
    ("What is the opposite of hot?", "The opposite of hot is cold."),
    ("Can you recommend a good habit?", "Try a short walk every day; it is good for body and mind."),
    ("Goodbye!", "Goodbye! Have a nice day."),
    ("I'm bored.", "How about reading a book, going for a walk, or learning something new?"),
]

# Short reasoning keeps generations short (the tiny model samples every token on CPU).
_THINK = {
    "search": "A lookup: {tool}.",
    "calculate": "A calculation: {tool}.",
    "answer": "No tool needed.",
}


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


def _pick_tools(
    rng: _R, target: ToolSpec | None, min_tools: int, max_tools: int, max_params: int
) -> list[ToolSpec]:
    """min..max tools in random order, at most ``max_params`` parameters in all (prompt length).

    Every row lists a search and a calculate tool (the target, if any, being one of them), so the
    family must be read from the request, not from which tools happen to be listed, and a route
    that lists only one family's tools leaves a misrouted prompt with wrong tools only.
    """
    k = rng.randint(min_tools, max_tools)
    first = target or rng.choice([t for t in _TOOL_LIST if t.family in TASK_KINDS])
    other = "calculate" if first.family == "search" else "search"
    tools = [
        first,
        rng.choice([t for t in _TOOL_LIST if t.family == other and _n_params(first, t) <= max_params]),
    ]
    while len(tools) < k:
        used = {t.name for t in tools}
        fits = [t for t in _TOOL_LIST if t.name not in used and _n_params(*tools, t) <= max_params]
        if not fits:
            break
        tools.append(rng.choice(fits))
    rng.shuffle(tools)
    return tools


def _n_params(*tools: ToolSpec) -> int:
    return sum(len(t.parameters) for t in tools)


def _make_row(
    rng: _R,
    kind: str,
    index: int,
    split: str,
    data_source: str,
    min_tools: int,
    max_tools: int,
    max_params: int,
    vague: bool = False,
) -> dict:
    if kind == "answer":
        tools = _pick_tools(rng, None, min_tools, max_tools, max_params)
        text, response = rng.choice(_ANSWERS)
        ground_truth = _answer_ground_truth(_THINK["answer"], response)
    else:
        target = TOOLS[rng.choice([n for n, t in TOOLS.items() if t.family == kind and n in _REQUESTS])]
        tools = _pick_tools(rng, target, min_tools, max_tools, max_params)
        text, params = _REQUESTS[target.name](rng)
        if vague:
            text = rng.choice(_VAGUE[target.name])
        ground_truth = _tool_ground_truth(_THINK[kind].format(tool=target.name), target.name, params)
    system, user = build_system_prompt(tools), build_user_turn(text)
    return {
        "data_source": data_source,
        "prompt": [{"content": system, "role": "system"}, {"content": user, "role": "user"}],
        "ability": "math",  # ToolRL's files carry "math" for every row
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {
            "index": index,
            "input": user,
            "instruction": system,
            "output": ground_truth,
            "split": split,
        },
    }


def generate_rlla_rows(
    n: int,
    seed: int,
    p_search: float = 0.35,
    p_calculate: float = 0.35,
    p_answer: float = 0.3,
    split: str = "train",
    start_index: int = 0,
    data_source: str = "rlla",
    min_tools: int = 2,
    max_tools: int = 3,
    max_params: int = 5,
    low_gain: float = 0.0,
) -> pd.DataFrame:
    """``n`` synthetic RLLA rows, deterministic in ``seed``.

    Family counts are exactly proportional to (p_search, p_calculate, p_answer) (largest
    remainder), in shuffled order; ``low_gain`` of each tool family's rows are vague requests
    (see the module doc). ``extra_info.index`` runs ``start_index .. start_index+n-1``.
    """
    if not 0.0 <= low_gain <= 1.0:
        raise ValueError(f"low_gain must be in [0, 1], got {low_gain}")
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not 2 <= min_tools <= max_tools <= len(_TOOL_LIST):
        raise ValueError(
            f"need 2 <= min_tools <= max_tools <= {len(_TOOL_LIST)}, got {min_tools}, {max_tools}"
        )
    if max_params < _MIN_PARAM_BUDGET:
        raise ValueError(f"max_params must be >= {_MIN_PARAM_BUDGET} (largest tool + a 1-parameter tool)")
    rng = random.Random(seed)
    counts = _family_counts(n, (p_search, p_calculate, p_answer))
    kinds = []
    for kind, count in zip(TASK_KINDS, counts):
        n_vague = 0 if kind == "answer" else _family_counts(count, (1.0 - low_gain, low_gain))[1]
        kinds += [(kind, i < n_vague) for i in range(count)]
    rng.shuffle(kinds)
    rows = [
        _make_row(rng, kind, start_index + i, split, data_source, min_tools, max_tools, max_params, vague)
        for i, (kind, vague) in enumerate(kinds)
    ]
    return pd.DataFrame(rows, columns=list(RLLA_ARROW_SCHEMA.names))


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
    p_search: float = 0.35,
    p_calculate: float = 0.35,
    p_answer: float = 0.3,
    data_source: str = "rlla",
    min_tools: int = 2,
    max_tools: int = 3,
    max_params: int = 5,
    low_gain: float = 0.0,
) -> dict[str, Path]:
    """Write ``train.parquet`` and ``test.parquet`` under ``out_dir``; returns {"train": path, "test": path}.

    The test split uses its own random stream (seed + 1) and indices after the train split's,
    so uids are unique over both files.
    """
    common = dict(
        p_search=p_search,
        p_calculate=p_calculate,
        p_answer=p_answer,
        data_source=data_source,
        min_tools=min_tools,
        max_tools=max_tools,
        max_params=max_params,
        low_gain=low_gain,
    )
    train = generate_rlla_rows(n_train, seed, split="train", start_index=0, **common)
    test = generate_rlla_rows(n_test, seed + 1, split="test", start_index=n_train, **common)
    out = Path(out_dir)
    return {
        "train": write_rlla_parquet(train, out / "train.parquet"),
        "test": write_rlla_parquet(test, out / "test.parquet"),
    }


def is_vague_request(user_turn: str) -> bool:
    """Whether a user message (``build_user_turn`` text) is one of the vague, low-gain requests."""
    return any(f"<user> {text} </user>" in user_turn for texts in _VAGUE.values() for text in texts)


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
