"""Route tables and the budget sweep: what a run's actor earns and spends under each route on
held-out prompts, the router's own choice beside it, and one frontier row per policy per budget.

A route table (``route_table``) has one row per prompt: uid, weak_label, learned_route, p_* (the
router's probabilities), and ``reward_<route>`` / ``cost_<route>`` / ``format_<route>`` for the
three routes (greedy decoding, so each entry is one deterministic response). ``src.frontier``
turns it into policy points; ``sweep_route_tables`` builds one per run of a budget sweep.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["find_sweep_runs", "route_table", "sweep_route_tables"]

ROUTES = ("answer", "search", "calculate")


def route_table(policy, records, batch_size: int = 16, reward_config=None) -> pd.DataFrame:
    """One row per record (``RLLARecord``): the policy's greedy reward and cost under each route,
    the weak label and the router's argmax route."""
    from src.formats.tools_block import tool_descriptions
    from src.rewards.dispatch import response_format, score
    from src.router.routes import weak_label

    labels = {
        r.uid: weak_label(
            r.ground_truth, policy.families, response_format(r.data_source), tool_descriptions(r.system)
        )
        for r in records
    }
    rows = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        messages, sources = [r.messages for r in chunk], [r.data_source for r in chunk]
        probs = policy.route_probs(messages)
        part = [
            {
                "uid": r.uid,
                "weak_label": labels.get(r.uid),
                "learned_route": ROUTES[int(p.argmax())],
                **{f"p_{name}": float(p[i]) for i, name in enumerate(ROUTES)},
            }
            for r, p in zip(chunk, probs)
        ]
        for route in ROUTES:
            results = policy.respond_batch(messages, sources, routes=[route] * len(chunk))
            for row, rec, res in zip(part, chunk, results):
                parts = score(rec.data_source, res.response, rec.ground_truth, step=0, config=reward_config)
                row[f"reward_{route}"] = parts.total
                row[f"format_{route}"] = parts.format
                row[f"cost_{route}"] = res.cost
        rows += part
        log.info("route table: %d / %d prompts", len(rows), len(records))
    return pd.DataFrame(rows)


def find_sweep_runs(sweep_dir: str | Path) -> list[Path]:
    """Run directories (with ``checkpoints/manifest.yaml``) under ``sweep_dir``, sorted."""
    found = sorted(p.parents[1] for p in Path(sweep_dir).rglob("checkpoints/manifest.yaml"))
    if not found:
        raise FileNotFoundError(f"no run with checkpoints/manifest.yaml under {sweep_dir}")
    return found


def sweep_route_tables(
    runs: list[Path],
    parquet: str | None = None,
    limit: int = 0,
    device: str | None = None,
    max_new_tokens: int | None = None,
) -> list[dict]:
    """For each run of a sweep: {"run", "budget", "lambda", "table"} (its route table on held-out
    prompts: ``parquet``, default each run's validation file)."""
    from omegaconf import OmegaConf

    from src.config.schema import RewardConfig
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy

    out = []
    for run in runs:
        policy = load_router_policy(run, device=device, max_new_tokens=max_new_tokens)
        cfg = policy.config
        records = read_rlla_parquet(parquet or data_files(cfg)[1][0])[0]
        records = records[:limit] if limit else records
        reward_config = RewardConfig(**OmegaConf.to_container(cfg.reward, resolve=True))
        table = route_table(policy, records, reward_config=reward_config)
        out.append(
            {
                "run": str(run),
                "budget": float(cfg.router.budget),
                "lambda": policy.extra.get("lambda"),
                "table": table,
            }
        )
        log.info("route table of %s (budget %s): %d prompts", run, cfg.router.budget, len(table))
    return out
