"""Route tables and the budget sweep: what a run's actor earns and spends under each route on
held-out prompts, the router's own choice beside it, and one frontier row per policy per budget.

A route table (``route_table``) has one row per prompt: uid, weak_label, learned_route, p_* (the
router's probabilities), request_class and named_tool (what ``src.frontier``'s ``readable``
allocation groups prompts by), and ``reward_<route>`` / ``cost_<route>`` / ``format_<route>`` for the
three routes: greedy decoding by default, so each entry is one deterministic response; with
``ResponseDraws(samples=K)``, the mean of K responses sampled at a temperature (the run's training
temperature in ``evaluate.py --sweep --samples K``), an estimate of the route's expected reward under the actor's
sampling: what the router is trained against, and a ``best`` allocation that knows expected values,
not which greedy call happened to succeed. ``src.frontier`` turns it into policy points;
``sweep_route_tables`` builds one per run of a budget sweep.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pandas as pd

log = logging.getLogger(__name__)

__all__ = ["ResponseDraws", "find_sweep_runs", "request_columns", "route_table", "sweep_route_tables"]

ROUTES = ("answer", "search", "calculate")


@dataclass(frozen=True)
class ResponseDraws:
    """How a route table draws each (prompt, route)'s responses: ``samples`` 0 is one greedy
    response; K >= 1 the mean over K responses sampled at ``temperature`` (None: the run's
    ``sampling.temperature``), torch seeded with ``seed`` once per table, so a table is
    reproducible at a fixed batch size and thread count."""

    samples: int = 0
    temperature: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.samples < 0 or (self.samples and self.temperature is not None and self.temperature <= 0):
            raise ValueError(
                f"samples must be >= 0 and sampling needs temperature > 0, got {self.samples}, {self.temperature}"
            )


def route_table(
    policy, records, batch_size: int = 16, reward_config=None, draws: ResponseDraws = ResponseDraws()
) -> pd.DataFrame:
    """One row per record (``RLLARecord``): the policy's reward, format score and cost under each
    route (``draws``: greedy, or the mean of K samples), the weak label, the router's argmax route,
    the request's class (exact / vague / answer, ``synthetic_text.request_class``) and the tool its
    ground truth calls first (``named_tool``)."""
    import torch

    from src.jobs.inference import InferenceSettings

    if draws.samples and draws.temperature is None:
        raise ValueError("sampled route tables need a temperature")
    settings = InferenceSettings(temperature=draws.temperature if draws.samples else 0.0)
    if draws.samples:
        torch.manual_seed(draws.seed)
    rows = []
    for start in range(0, len(records), batch_size):
        chunk = records[start : start + batch_size]
        probs = policy.route_probs([r.messages for r in chunk])
        part = [
            {
                "uid": r.uid,
                "weak_label": _weak_label(policy, r),
                "learned_route": ROUTES[int(p.argmax())],
                **request_columns(r),
                **{f"p_{name}": float(p[i]) for i, name in enumerate(ROUTES)},
            }
            for r, p in zip(chunk, probs)
        ]
        for route in ROUTES:
            values = _route_values(policy, chunk, route, settings, max(draws.samples, 1), reward_config)
            for row, (reward, fmt, cost) in zip(part, values):
                row[f"reward_{route}"], row[f"format_{route}"], row[f"cost_{route}"] = reward, fmt, cost
        rows += part
        log.info("route table: %d / %d prompts", len(rows), len(records))
    return pd.DataFrame(rows)


def _weak_label(policy, record) -> str | None:
    from src.formats.tools_block import tool_descriptions
    from src.rewards.dispatch import response_format
    from src.router.routes import weak_label

    fmt = response_format(record.data_source)
    return weak_label(record.ground_truth, policy.families, fmt, tool_descriptions(record.system))


def request_columns(record) -> dict:
    """The request's class and the tool its ground truth calls first ("" for none)."""
    from src.datamodules.synthetic_text import request_class
    from src.jobs.inference import parse_tool_calls
    from src.rewards.dispatch import response_format

    calls = parse_tool_calls(record.ground_truth, response_format(record.data_source))
    return {
        "request_class": request_class(record.user),
        "named_tool": next((c.name for c in calls if c.name), ""),
    }


def _route_values(policy, chunk, route: str, settings, repeats: int, reward_config) -> np.ndarray:
    """[len(chunk), 3]: mean (reward, format score, cost) of ``repeats`` responses per record under
    ``route``, from one generate call holding ``repeats`` copies of the chunk (copy k at rows
    k·n … k·n + n − 1)."""
    from src.rewards.dispatch import score

    n = len(chunk)
    results = policy.respond_batch(
        [r.messages for r in chunk] * repeats,
        [r.data_source for r in chunk] * repeats,
        routes=[route] * (n * repeats),
        settings=settings,
    )
    values = np.zeros((repeats, n, 3))
    for j, res in enumerate(results):
        rec = chunk[j % n]
        parts = score(rec.data_source, res.response, rec.ground_truth, step=0, config=reward_config)
        values[j // n, j % n] = (parts.total, parts.format, res.cost)
    return values.mean(axis=0)


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
    draws: ResponseDraws = ResponseDraws(),
) -> list[dict]:
    """For each run of a sweep: {"run", "budget", "lambda", "table"} (its route table on held-out
    prompts: ``parquet``, default each run's validation file; ``draws`` with no temperature samples
    at the run's ``sampling.temperature``)."""
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
        # each run's own temperature: rebinding ``draws`` would carry the first run's to the next
        run_draws = (
            draws
            if draws.temperature is not None
            else replace(draws, temperature=float(cfg.sampling.temperature))
        )
        table = route_table(policy, records, reward_config=reward_config, draws=run_draws)
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
