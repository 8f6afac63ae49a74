"""API-Bank levels 1-3 with ToolRL's metric, for any model: a plain HF model directory, or a
trained run with its router on or off; generation by the HF engine or vLLM.

Data: ``level-{1,2,3}-api_processed.json`` (ToolRL's processed API-Bank: ``system``, ``user``,
``answer``, ``other``). Each item is one chat prompt; the response's tool calls are scored by
``src.rewards.api_bank`` and the table has one row per level plus ``overall``.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from src.rewards.api_bank import api_bank_calls, api_bank_correct, expected_call

__all__ = [
    "ApiBankItem",
    "evaluate_api_bank",
    "level_table",
    "load_api_bank",
    "make_model_generator",
    "make_run_generator",
    "markdown_table",
    "write_level_table",
]

log = logging.getLogger(__name__)

LEVELS = (1, 2, 3)
# A batch of chat prompts -> (responses, routes or None per prompt)
Generator = Callable[[list[list[dict]]], tuple[list[str], list[str | None]]]


@dataclass(frozen=True)
class ApiBankItem:
    level: int
    index: int
    messages: list[dict]
    answer: Any


def _level_file(data_dir: Path, level: int) -> Path:
    return data_dir / f"level-{level}-api_processed.json"


def load_api_bank(data_dir: str | Path, levels: Sequence[int] = LEVELS, limit: int = 0) -> list[ApiBankItem]:
    """Items of the given levels (the first ``limit`` of each when > 0).

    Raises FileNotFoundError naming a missing level file, ValueError naming the file and row of
    an item without ``system`` / ``user`` / a readable ``answer``.
    """
    data_dir = Path(data_dir)
    items = []
    for level in levels:
        path = _level_file(data_dir, level)
        if not path.is_file():
            raise FileNotFoundError(f"API-Bank level {level}: {path} not found")
        try:
            rows = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, RecursionError) as err:  # UnicodeDecodeError is a ValueError
            raise ValueError(f"API-Bank level {level}: {path} is not readable JSON ({err})") from None
        if not isinstance(rows, list):
            raise ValueError(
                f"API-Bank level {level}: {path} holds {type(rows).__name__}, not a list of items"
            )
        for i, row in enumerate(rows[:limit] if limit > 0 else rows):
            try:
                expected_call(row["answer"])
                messages = [
                    {"role": "system", "content": str(row["system"])},
                    {"role": "user", "content": str(row["user"])},
                ]
            except (KeyError, ValueError, TypeError, IndexError) as err:
                raise ValueError(f"{path}, row {i}: {err}") from None
            items.append(ApiBankItem(level, i, messages, row["answer"]))
    return items


def evaluate_api_bank(
    items: Sequence[ApiBankItem], generate: Generator, batch_size: int = 16
) -> pd.DataFrame:
    """One row per item: level, index, route, correct, n_calls, response."""
    rows = []
    for start in range(0, len(items), batch_size):
        chunk = items[start : start + batch_size]
        responses, routes = generate([item.messages for item in chunk])
        for item, response, route in zip(chunk, responses, routes, strict=True):
            calls = api_bank_calls(response)
            rows.append(
                {
                    "level": item.level,
                    "index": item.index,
                    "route": route,
                    "correct": api_bank_correct(calls, item.answer),
                    "n_calls": len(calls),
                    "response": _storable(response),
                }
            )
        log.info("API-Bank: %d / %d scored", len(rows), len(items))
    return pd.DataFrame(rows)


def _storable(response: Any) -> str:
    """The response as text the table (arrow strings, UTF-8) can hold: lone surrogates escaped."""
    text = response if isinstance(response, str) else repr(response)
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def level_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per level and overall: correct, total, accuracy (%), and the route mix when routed."""
    groups = [(f"level {lv}", rows[rows["level"] == lv]) for lv in sorted(rows["level"].unique())]
    out = []
    for name, part in [*groups, ("overall", rows)]:
        record = {
            "level": name,
            "correct": int(part["correct"].sum()),
            "total": len(part),
            "accuracy": round(100.0 * part["correct"].mean(), 2) if len(part) else float("nan"),
        }
        routed = part["route"].dropna()
        for route in ("answer", "search", "calculate"):
            record[f"route_{route}"] = round(float((routed == route).mean()), 3) if len(routed) else None
        out.append(record)
    return pd.DataFrame(out)


def markdown_table(frame: pd.DataFrame) -> str:
    """A pipe table of ``frame`` (no index); floats with up to 3 decimals."""

    def cell(v: Any) -> str:
        return f"{v:.3f}".rstrip("0").rstrip(".") if isinstance(v, float) else str(v)

    head = "| " + " | ".join(map(str, frame.columns)) + " |"
    rule = "|" + "---|" * len(frame.columns)
    body = ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join([head, rule, *body])


def write_level_table(table: pd.DataFrame, rows: pd.DataFrame, out_dir: str | Path) -> dict[str, Path]:
    """Write ``api_bank_levels.csv``, ``api_bank_levels.md`` and ``api_bank_rows.jsonl`` atomically."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {
        "csv": out / "api_bank_levels.csv",
        "markdown": out / "api_bank_levels.md",
        "rows": out / "api_bank_rows.jsonl",
    }
    texts = {
        "csv": table.to_csv(index=False),
        "markdown": markdown_table(table) + "\n",
        "rows": rows.to_json(orient="records", lines=True),
    }
    for key, path in paths.items():
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{path.name}.")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(texts[key])
        os.replace(tmp, path)
    return paths


# ---------------------------------------------------------------------------- generators
def _engine(engine: str, model, model_dir: Path, tokenizer, batch_size: int, max_len: int):
    from src.rollout.engines.hf import HFGenerateEngine

    if engine == "hf":
        return HFGenerateEngine(model, tokenizer.pad_token_id, [tokenizer.eos_token_id], batch_size)
    if engine == "vllm":
        from src.rollout.engines.vllm_engine import VLLMEngine

        return VLLMEngine(str(model_dir), 0.4, "bfloat16", max_len, pad_token_id=tokenizer.pad_token_id)
    raise ValueError(f"engine={engine!r}; expected 'hf' or 'vllm'")


def _decode_all(tokenizer, completions) -> list[str]:
    drop = {tokenizer.pad_token_id, tokenizer.eos_token_id}
    return [tokenizer.decode([t for t in ids if t not in drop]) for ids in completions.token_lists()]


def make_model_generator(
    model_dir: str | Path,
    engine: str = "hf",
    max_new_tokens: int = 256,
    device: str = "cpu",
    dtype: str = "float32",
    batch_size: int = 16,
    max_len: int = 4096,
) -> Generator:
    """Greedy generation with a plain HF model directory (no router)."""
    from src.config.sampling import SamplingParams
    from src.datamodules.rlla_datamodule import prompt_token_ids
    from src.models.loading import load_causal_lm, load_tokenizer

    tokenizer = load_tokenizer(model_dir)
    model = None if engine == "vllm" else load_causal_lm(model_dir, dtype).to(device).eval()
    eng = _engine(engine, model, Path(model_dir), tokenizer, batch_size, max_len)
    sampling = SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=max_new_tokens)

    def generate(batch: list[list[dict]]) -> tuple[list[str], list[str | None]]:
        completions = eng.generate([prompt_token_ids(tokenizer, m) for m in batch], sampling)
        return _decode_all(tokenizer, completions), [None] * len(batch)

    return generate


def make_run_generator(
    run: str | Path,
    router: bool = True,
    engine: str = "hf",
    max_new_tokens: int = 256,
    device: str | None = None,
    dtype: str | None = None,
) -> Generator:
    """Greedy generation with a trained run. ``router``: the router's argmax route rewrites each
    prompt (as at inference); off: the original prompt. ``engine="vllm"`` exports the run's actor
    to a temporary HF directory and generates there (routing stays on the run's router head)."""
    from src.jobs.inference import load_router_policy

    policy = load_router_policy(run, device=device, dtype=dtype, max_new_tokens=max_new_tokens)
    if router and not policy.has_router:
        raise ValueError(f"{run}: router=on but the run has no router head (router.enable=false)")
    if engine == "hf":

        def generate_hf(batch: list[list[dict]]) -> tuple[list[str], list[str | None]]:
            if not router:
                return _plain(policy, batch, max_new_tokens)
            results = policy.respond_batch(batch, ["rlla"] * len(batch))
            return [r.response for r in results], [r.route for r in results]

        return generate_hf
    export = Path(tempfile.mkdtemp(prefix="toolrouter-actor-"))
    policy.module.actor.save_pretrained(export)
    policy.tokenizer.save_pretrained(export)
    plain = make_model_generator(export, "vllm", max_new_tokens)

    def generate_vllm(batch: list[list[dict]]) -> tuple[list[str], list[str | None]]:
        if not router:
            return plain(batch)
        routes = [policy.route(m)[0] for m in batch]
        responses, _ = plain([policy.routed_messages(m, r) for m, r in zip(batch, routes)])
        return responses, routes

    return generate_vllm


def _plain(policy, batch: list[list[dict]], max_new_tokens: int) -> tuple[list[str], list[str | None]]:
    """The run's actor on the original prompts (router off)."""
    from src.config.sampling import SamplingParams
    from src.rollout.engines.hf import HFGenerateEngine

    tok = policy.tokenizer
    eng = HFGenerateEngine(policy.module.actor, tok.pad_token_id, [tok.eos_token_id], policy.micro_batch_size)
    completions = eng.generate(
        [policy.prompt_ids(m) for m in batch],
        SamplingParams(n_generations_per_prompt=1, temperature=0.0, max_new_tokens=max_new_tokens),
    )
    return _decode_all(tok, completions), [None] * len(batch)
