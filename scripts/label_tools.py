"""Label every tool of an RLLA parquet with a family, and every example with a weak router label.

    python scripts/label_tools.py PARQUET [--out SIDECAR.json] [--labels-out LABELS.parquet|.csv]
                                 [--endpoint URL --model NAME] [--timeout S]

The sidecar (``{"tool name": "search" | "calculate" | "other"}``) covers every tool listed in
any row's system prompt; ``ToolFamilies.from_file`` reads it back. The labels file has one row
per example: ``uid`` (``extra_info.index``) and ``router_target_action`` (ANSWER / SEARCH /
CALCULATE / MIXED, see ``src.router.routes.weak_label``); rows are read as XML unless
``data_source`` is ``rlla_gpt`` (harmony).

With ``--endpoint`` (an OpenAI-compatible server: ``http://host:port``, ``.../v1`` or the full
``.../v1/chat/completions``) the served model is asked for each tool's family; any error,
timeout or unreadable answer falls back to the keyword heuristic, and after three failed
requests in a row the server is not asked again. A summary (counts of tools, families,
labels, fallbacks and malformed rows) is logged and printed as one JSON line.
"""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import pandas as pd

from src.formats.tools_block import parse_tools_block
from src.router.families import FAMILIES, ToolFamilies, label_tool
from src.router.routes import weak_label
from src.router.usage import tool_usage

log = logging.getLogger("label_tools")

MAX_CONSECUTIVE_FAILURES = 3
PROMPT = (
    "Sort this API tool into one family.\n"
    "search: looks up, retrieves or lists information from some source.\n"
    "calculate: computes, converts or checks something from the inputs it is given.\n"
    "other: performs an action or does anything else (create, send, book, generate...).\n\n"
    "Tool name: {name}\nDescription: {description}\n\n"
    "Reply with exactly one word: search, calculate or other."
)
_ANSWER_WORDS = {"search": "search", "calculate": "calculate", "calculation": "calculate", "other": "other"}


def chat_url(endpoint: str) -> str:
    """The chat-completions URL of an OpenAI-compatible server given its base or full URL."""
    url = endpoint.rstrip("/")
    if url.endswith("/chat/completions"):
        return url
    return url + ("/chat/completions" if url.endswith("/v1") else "/v1/chat/completions")


def parse_family_answer(text: Any) -> str | None:
    """The single family a model's answer names (reasoning in <think> ignored), else None."""
    if not isinstance(text, str):
        return None
    text = re.sub(r"<think>.*?</think>", " ", text, flags=re.DOTALL).lower()
    found = {_ANSWER_WORDS[w] for w in re.findall(r"[a-z]+", text) if w in _ANSWER_WORDS}
    return found.pop() if len(found) == 1 else None


def ask_family(url: str, model: str, name: str, description: str, timeout: float) -> str | None:
    """One chat request; the family answered, or None when the answer names no single family.

    Raises OSError / ValueError on transport or protocol errors (callers fall back).
    """
    body = {
        "model": model,
        "messages": [
            {"role": "user", "content": PROMPT.format(name=name, description=description or "(none)")}
        ],
        "temperature": 0,
        "max_tokens": 16,
    }
    request = urllib.request.Request(
        url,
        data=json.dumps(body).encode("utf-8"),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        payload = json.loads(response.read().decode("utf-8"))
    try:
        content = payload["choices"][0]["message"]["content"]
    except (KeyError, IndexError, TypeError):
        raise ValueError(f"not a chat-completions answer: {str(payload)[:200]}") from None
    return parse_family_answer(content)


def label_all(
    tools: dict[str, str], endpoint: str | None, model: str | None, timeout: float, stats: Counter
) -> dict[str, str]:
    """Tool name -> family, from the served model where it answers, else the heuristic."""
    url = chat_url(endpoint) if endpoint else None
    failures = 0
    out = {}
    for name, description in tools.items():
        family = None
        if url is not None and failures < MAX_CONSECUTIVE_FAILURES:
            try:
                family = ask_family(url, model, name, description, timeout)
                failures = 0
                stats["llm_unparseable" if family is None else "llm_answered"] += 1
            except (OSError, ValueError) as err:  # URLError, HTTPError and timeouts are OSErrors
                failures += 1
                stats["llm_errors"] += 1
                log.warning("tool %r: endpoint failed (%s); using the heuristic", name, err)
                if failures == MAX_CONSECUTIVE_FAILURES:
                    log.warning("%d failed requests in a row; not asking %s again", failures, url)
        elif url is not None:
            stats["llm_skipped"] += 1
        if family is None:
            family = label_tool(name, description)
            stats["heuristic"] += 1
        out[name] = family
    return out


def _system_text(prompt: Any) -> str | None:
    for message in prompt if prompt is not None else []:
        if not isinstance(message, dict) or message.get("role") != "system":
            continue
        if isinstance(message.get("content"), str):
            return message["content"]
    return None


def collect(df: pd.DataFrame, source: Path, stats: Counter) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Tool name -> first description seen, and per-row (uid, fmt, ground truth, descriptions)."""
    for column in ("prompt", "reward_model"):
        if column not in df.columns:
            raise ValueError(f"{source}: missing column {column!r}; columns are {list(df.columns)}")
    tools: dict[str, str] = {}
    rows = []
    for i, row in enumerate(df.to_dict("records")):
        system = _system_text(row.get("prompt"))
        if system is None:
            stats["rows_without_system_prompt"] += 1
            log.warning("%s: row %d has no system message", source, i)
        block = parse_tools_block(system) if system else None
        descriptions = {t.name: t.description for t in block.tools} if block else {}
        for name, description in descriptions.items():
            if name in tools and tools[name] != description:
                stats["tools_with_differing_descriptions"] += 1
            tools.setdefault(name, description)
        extra = row.get("extra_info") if isinstance(row.get("extra_info"), dict) else {}
        uid = extra.get("index")
        if uid is None:
            stats["rows_without_uid"] += 1
            uid = i
        truth = row["reward_model"].get("ground_truth") if isinstance(row["reward_model"], dict) else None
        fmt = "harmony" if row.get("data_source") == "rlla_gpt" else "xml"
        rows.append({"uid": uid, "fmt": fmt, "truth": truth, "descriptions": descriptions, "row": i})
    return tools, rows


def weak_labels(
    rows: list[dict[str, Any]], families: ToolFamilies, source: Path, stats: Counter
) -> pd.DataFrame:
    """One weak label per row; bad ground truths are labelled MIXED and counted."""
    out = []
    for row in rows:
        truth = row["truth"]
        if not isinstance(truth, str):
            stats["rows_without_ground_truth"] += 1
            log.warning("%s: row %d has no ground-truth string; labelled MIXED", source, row["row"])
            label = "MIXED"
        else:
            usage = tool_usage(truth, families, fmt=row["fmt"], descriptions=row["descriptions"])
            if not usage.parse_ok:
                stats["ground_truths_with_unreadable_calls"] += 1
                log.warning(
                    "%s: row %d: unreadable tool calls in the ground truth; labelled MIXED",
                    source,
                    row["row"],
                )
            label = weak_label(truth, families, fmt=row["fmt"], descriptions=row["descriptions"])
        out.append({"uid": row["uid"], "router_target_action": label})
    return pd.DataFrame(out, columns=["uid", "router_target_action"])


def write_labels(labels: pd.DataFrame, path: Path) -> None:
    if path.suffix.lower() == ".parquet":
        labels.to_parquet(path, index=False)
    elif path.suffix.lower() == ".csv":
        labels.to_csv(path, index=False)
    else:
        raise ValueError(f"{path}: --labels-out must end in .parquet or .csv")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("parquet", type=Path, help="RLLA parquet (prompt, reward_model, extra_info)")
    parser.add_argument("--out", type=Path, default=None, help="sidecar JSON: tool name -> family")
    parser.add_argument("--labels-out", type=Path, default=None, help="per-example labels (.parquet or .csv)")
    parser.add_argument("--endpoint", default=None, help="OpenAI-compatible server URL (e.g. local vLLM)")
    parser.add_argument("--model", default=None, help="model name to ask at --endpoint")
    parser.add_argument("--timeout", type=float, default=20.0, help="seconds per request")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if args.endpoint and not args.model:
        parser.error("--endpoint needs --model")
    if args.labels_out is not None and args.labels_out.suffix.lower() not in (".parquet", ".csv"):
        parser.error(f"--labels-out must end in .parquet or .csv, got {args.labels_out}")
    if not args.parquet.is_file():
        parser.error(f"no such parquet file: {args.parquet}")

    stats: Counter = Counter()
    df = pd.read_parquet(args.parquet)
    tools, rows = collect(df, args.parquet, stats)
    sidecar = label_all(tools, args.endpoint, args.model, args.timeout, stats)
    families = ToolFamilies(sidecar, source="labelled tools")
    labels = weak_labels(rows, families, args.parquet, stats)

    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps(dict(sorted(sidecar.items())), indent=2, ensure_ascii=False)
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.labels_out is not None:
        args.labels_out.parent.mkdir(parents=True, exist_ok=True)
        write_labels(labels, args.labels_out)

    summary = {
        "rows": len(df),
        "tools": len(sidecar),
        "families": {f: sum(v == f for v in sidecar.values()) for f in FAMILIES},
        "labels": labels["router_target_action"].value_counts().to_dict(),
        **dict(sorted(stats.items())),
    }
    log.info("labelled %s", summary)
    sys.stdout.write(json.dumps(summary) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
