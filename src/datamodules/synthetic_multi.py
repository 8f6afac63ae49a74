"""Synthetic RLLA rows that need two tool calls in one turn (the curriculum's harder lesson).

Each row joins two single-call requests of the synthetic catalogue ("... Also, ..."); its ground
truth is one ``<tool_call>`` block with both calls, one JSON object per line, as in RLLA's
multi-call rows. Same arrow schema as ``synthetic.py``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd

from src.datamodules import synthetic as single
from src.datamodules.schema import RLLA_ARROW_SCHEMA

THINK = "The user asks for two things, so I will call {a} and {b} with the details from the request."


def _two_call_row(rng: random.Random, index: int, split: str, data_source: str) -> dict:
    names = rng.sample(sorted(single._REQUESTS), 2)
    asks, calls = [], []
    for name in names:
        text, params = single._REQUESTS[name](rng)
        asks.append(text)
        calls.append(json.dumps({"name": name, "parameters": params}))
    tools = [single.TOOLS[n] for n in names]
    extra = [t for t in single._TOOL_LIST if t.name not in names]
    if extra:
        tools.append(rng.choice(extra))
    rng.shuffle(tools)
    text = f"{asks[0]} Also, {asks[1][0].lower()}{asks[1][1:]}"
    think = THINK.format(a=names[0], b=names[1])
    ground_truth = f"<think> {think} </think>\n<tool_call>\n" + "\n".join(calls) + "\n</tool_call>"
    system, user = single.build_system_prompt(tools), single.build_user_turn(text)
    return {
        "data_source": data_source,
        "prompt": [{"content": system, "role": "system"}, {"content": user, "role": "user"}],
        "ability": "math",
        "reward_model": {"ground_truth": ground_truth, "style": "rule"},
        "extra_info": {"index": index, "input": user, "instruction": system, "output": ground_truth, "split": split},
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


def write_multi_call_rlla(out_dir: str | Path, n_train: int, n_test: int, seed: int = 0, start_index: int = 0):
    """``train.parquet`` / ``test.parquet`` of two-call rows; uids start at ``start_index``."""
    train = generate_multi_call_rows(n_train, seed, "train", start_index)
    test = generate_multi_call_rows(n_test, seed + 1, "test", start_index + n_train)
    out = Path(out_dir)
    return {
        "train": single.write_rlla_parquet(train, out / "train.parquet"),
        "test": single.write_rlla_parquet(test, out / "test.parquet"),
    }
