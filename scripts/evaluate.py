"""Score a trained run on an RLLA parquet split: reward parts, route mix, tool use, cost, and the
router's agreement with each row's weak label (from its ground truth).

    python scripts/evaluate.py --run outputs/router_grpo/<stamp> --parquet test.parquet --out rows.csv
    python scripts/evaluate.py --ckpt <run>/checkpoints/last.ckpt --parquet test.parquet --limit 32 \\
        --out rows.parquet --summary summary.json

The summary JSON (see ``src.analysis.evaluation_summary`` for its keys, plus checkpoint, parquet,
skipped rows and settings) is printed to stdout; logs go to stderr. ``--out`` writes one row per
prompt (.csv, .parquet or .jsonl).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("evaluate")
ROW_FORMATS = (".csv", ".parquet", ".jsonl")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run directory (uses checkpoints/manifest.yaml's latest checkpoint)")
    src.add_argument("--ckpt", help="one checkpoint file (a manifest.yaml must sit beside it)")
    p.add_argument("--parquet", required=True, help="RLLA-schema parquet to score")
    p.add_argument("--limit", type=int, default=0, help="first N rows only (default 0 = all)")
    p.add_argument("--out", help=f"per-row results file ({', '.join(ROW_FORMATS)})")
    p.add_argument("--summary", help="also write the summary JSON here")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, help="default: the run's rollout.max_new_tokens")
    p.add_argument("--route", choices=["answer", "search", "calculate"], help="force one route for every row")
    p.add_argument("--sample-route", action="store_true", help="sample routes instead of the argmax")
    p.add_argument("--batch-size", type=int, default=16, help="prompts per generate call")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--dtype", help="override model.dtype (e.g. float32 for a bf16 run on CPU)")
    args = p.parse_args(argv)
    if args.out and Path(args.out).suffix.lower() not in ROW_FORMATS:
        p.error(f"--out must end in one of {ROW_FORMATS}, got {args.out}")
    if args.batch_size <= 0 or args.limit < 0:
        p.error("--batch-size must be positive and --limit non-negative")
    return args


def evaluate_rows(policy, records, args, reward_config) -> list[dict]:
    """One result row per record: route, probabilities, reward parts, tool use, cost, weak label."""
    import torch

    from src.analysis import weak_labels_from_records
    from src.rewards.dispatch import score

    labels = weak_labels_from_records(records, policy.families)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for start in range(0, len(records), args.batch_size):
        chunk = records[start : start + args.batch_size]
        results = policy.respond_batch(
            [r.messages for r in chunk],
            [r.data_source for r in chunk],
            temperature=args.temperature,
            top_p=args.top_p,
            max_new_tokens=args.max_new_tokens,
            routes=None if args.route is None else [args.route] * len(chunk),
            sample_route=args.sample_route,
            generator=generator,
        )
        for rec, res in zip(chunk, results):
            parts = score(rec.data_source, res.response, rec.ground_truth, step=0, config=reward_config)
            probs = res.probs or [None, None, None]
            rows.append(
                {
                    "uid": rec.uid,
                    "data_source": rec.data_source,
                    "route": res.route,
                    "p_answer": probs[0],
                    "p_search": probs[1],
                    "p_calculate": probs[2],
                    "weak_label": labels.get(rec.uid),
                    "reward_task": parts.total,
                    "reward_format": parts.format,
                    "reward_correctness": parts.correctness,
                    "reward_length": parts.length,
                    "used_tool": res.usage.used_any_tool,
                    "used_search": res.usage.used_search,
                    "used_calculate": res.usage.used_calculate,
                    "n_tool_calls": res.usage.n_calls,
                    "cost": res.cost,
                    "tool_names": json.dumps([c.name for c in res.tool_calls]),
                    "response_length": res.response_length,
                    "response": res.response,
                }
            )
        log.info("scored %d / %d rows", len(rows), len(records))
    return rows


def write_rows(frame, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        frame.to_csv(path, index=False)
    elif suffix == ".parquet":
        frame.to_parquet(path, index=False)
    else:
        frame.to_json(path, orient="records", lines=True)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    import pandas as pd
    import torch
    from omegaconf import OmegaConf

    from src.analysis import evaluation_summary
    from src.datamodules.schema import read_rlla_parquet
    from src.inference import load_router_policy
    from src.rewards.types import RewardConfig

    torch.manual_seed(args.seed)
    records, skipped = read_rlla_parquet(args.parquet)
    if args.limit:
        records = records[: args.limit]
    if not records:
        raise SystemExit(f"{args.parquet}: no usable rows (skipped: {dict(skipped)})")
    policy = load_router_policy(
        args.run or args.ckpt, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens
    )
    reward_config = RewardConfig(**OmegaConf.to_container(policy.config.reward, resolve=True))
    t0 = time.perf_counter()
    frame = pd.DataFrame(evaluate_rows(policy, records, args, reward_config))
    summary = {
        "checkpoint": str(policy.checkpoint),
        "global_step": policy.global_step,
        "parquet": str(args.parquet),
        "skipped_rows": dict(skipped),
        "temperature": args.temperature,
        "forced_route": args.route,
        **evaluation_summary(frame),
        "seconds": round(time.perf_counter() - t0, 2),
    }
    if args.out:
        write_rows(frame, Path(args.out))
        summary["rows_file"] = str(args.out)
    text = json.dumps(summary, indent=2)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(text + "\n")
    print(text, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
