"""Random and perturbed responses for the reward parity and fuzz tests (RLLA XML and harmony)."""

from __future__ import annotations

import json
import random
from pathlib import Path

XML_FRAGMENTS = (
    "<think>", "</think>", "<tool_call>", "</tool_call>", "<response>", "</response>",
    "\n", "\n\n", " ", "\t", "x", "word ", "{", "}", "[", "]", '"', ":", ",",
    '{"name": "A", "parameters": {}}', '{"name": "A", "parameters": {"x": 1}}',
    '{"name": "B", "parameters": {"q": "hi", "n": [1, 2]}}', '{"name": 3}', "1", "null",
    "</think>\n<tool_call>\n", "\n</tool_call>\n<response>", "\n</tool_call>",
)  # fmt: skip
HARMONY_FRAGMENTS = (
    "<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|call|>", "<|return|>", "<|constrain|>",
    "assistant", "user", " to=functions.A", " to=functions.B ", " to=other", "to=", "functions.",
    "analysis", "commentary", "final", "bogus", " json", "json", " ", "\n", "x",
    '{"x": 1}', '{"q": "hi"}', "[1]", "{", "}", '"',
    "<|start|>assistant<|channel|>analysis<|message|>think<|end|>",
    '<|start|>assistant to=functions.A<|channel|>commentary json<|message|>{"x": 1}<|call|>',
    '<|start|>assistant<|channel|>commentary to=functions.B <|constrain|>json<|message|>{"q": "hi"}<|call|>',
    "<|start|>assistant<|channel|>final<|message|>done<|return|>",
)  # fmt: skip
TOOLS = (
    ("A", {"x": 1}),
    ("B", {"q": "hi", "n": [1, 2]}),
    ("Domain WHOIS Lookup API", {"domain_name": "a.com"}),
    ("GetNews", {"page": "1"}),
    ("Empty", {}),
)


def synthetic_ground_truths(rng: random.Random, n: int) -> list[str]:
    """RLLA-layout ground truths: think, then calls and/or a reply (sometimes neither)."""
    out = []
    for _ in range(n):
        calls = [
            json.dumps({"name": name, "parameters": params})
            for name, params in rng.sample(TOOLS, rng.randrange(0, 3))
        ]
        parts = [f"<think> {' '.join(['plan'] * rng.randrange(1, 6))} </think>"]
        if calls:
            parts.append("<tool_call>\n" + "\n".join(calls) + "\n</tool_call>")
        if not calls or rng.random() < 0.3:
            parts.append(f"<response> reply {rng.randrange(100)} </response>")
        out.append("\n".join(parts))
    return out


def real_xml_ground_truths(data_dir: Path) -> list[str]:
    """The 80 test rows' ground truths and the 400 SFT outputs of the shared RLLA data."""
    import pandas as pd

    gts = [
        rm["ground_truth"] for rm in pd.read_parquet(data_dir / "rlla_4k" / "test.parquet")["reward_model"]
    ]
    sft = data_dir / "rlla_4k_raw" / "rlla_sft.json"
    if sft.is_file():
        gts += [row["output"] for row in json.loads(sft.read_text(encoding="utf-8"))]
    return gts


def mutate(text: str, rng: random.Random, fragments: tuple[str, ...], pool: list[str]) -> str:
    """1-4 random edits: insert a fragment, delete/duplicate/move a slice, truncate, splice, pad."""
    for _ in range(rng.randrange(1, 5)):
        i, j = sorted(rng.randrange(len(text) + 1) for _ in range(2))
        kind = rng.randrange(9)
        if kind <= 2:
            text = text[:i] + rng.choice(fragments) + text[i:]
        elif kind == 3:
            text = text[:i] + text[j:]
        elif kind == 4:
            text = text[:j] + text[i:j] + text[j:]
        elif kind == 5:
            text = text[:i]
        elif kind == 6:
            other = rng.choice(pool)
            text = text[:i] + other[rng.randrange(len(other) + 1) :]
        elif kind == 7:
            text = rng.choice(["", " ", "\n", "\n\n", "\t "]) + text + rng.choice(["", " ", "\n", "\n \n"])
        else:
            text = text.replace(rng.choice(fragments), rng.choice(fragments), rng.randrange(1, 3))
    return text


def soup(rng: random.Random, fragments: tuple[str, ...], n: int) -> str:
    """``n`` random fragments: unbalanced, nested and repeated tags."""
    return "".join(rng.choice(fragments) for _ in range(n))
