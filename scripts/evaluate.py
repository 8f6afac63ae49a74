"""Score a trained run on an RLLA parquet split: reward parts, route mix, tool use, cost, and the
router's agreement with each row's weak label (from its ground truth).

    python scripts/evaluate.py --run outputs/router_grpo/<stamp> --parquet test.parquet --out rows.csv
    python scripts/evaluate.py --ckpt <run>/checkpoints/last.ckpt --parquet test.parquet --limit 32 \\
        --out rows.parquet --summary summary.json

The summary JSON (see ``src.analysis.evaluation_summary`` for its keys, plus checkpoint, parquet,
skipped rows and settings) is printed to stdout; logs go to stderr. ``--out`` writes one row per
prompt (.csv, .parquet or .jsonl).

API-Bank levels 1-3 with ToolRL's metric (per-level table to stdout and --out-dir):

    python scripts/evaluate.py --run <run> --api-bank ../shared/data/api_bank [--router off] [--engine vllm]
    python scripts/evaluate.py --model /path/to/hf/model --api-bank ../shared/data/api_bank --limit 20

The router alone on any RLLA parquet (no generation): per-label route shares (greedy and sampled),
route accuracy, per-label recall / precision, tool rate and the answer-vs-tool AUC; with --budget,
also routing under B with a p_route threshold calibrated on --calibrate (held-out prompts):
    python scripts/evaluate.py --run <run> --routing ../shared/data/rlla_4k/test.parquet
    python scripts/evaluate.py --run <run> --routing test.parquet --budget 0.3 --calibrate val.parquet
    python scripts/evaluate.py --run <run> --routing test.parquet --out routes.csv   # one row per prompt
How each run holds its budget (src.budget_report: Ê[cost] of the last 50 / 100 steps, the 25-step
windows, the settling step, λ's range and coefficient of variation, held-out routing; one JSON line a
run on stdout, then a markdown table):

    python scripts/evaluate.py --budget-report outputs/router_grpo/<stamp> outputs/router_grpo/<other>

Budget sweep frontier (route tables on held-out prompts, learned router vs baselines, per budget;
rows for the router's argmax routes and for its routes under the run's B, the threshold calibrated
on the same prompts, each beside the baselines at its tool rate: column ``routing``):

    python scripts/evaluate.py --sweep outputs/router_sweep/<stamp> --out-dir outputs/router_sweep/<stamp>
    python scripts/evaluate.py --sweep <run or sweep> --samples 8   # expected rewards: 8 samples each
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
    src.add_argument("--model", help="a plain HF model directory (API-Bank only; no router)")
    src.add_argument("--sweep", help="a budget sweep's directory: frontier table + figure per budget")
    src.add_argument(
        "--budget-report", nargs="+", metavar="RUN", help="run directories: how each holds its budget"
    )
    p.add_argument(
        "--parquet",
        help="RLLA-schema parquet to score (sweep: held-out prompts, default each run's val file)",
    )
    p.add_argument("--routing", help="RLLA-schema parquet: evaluate the router alone on its prompts")
    p.add_argument("--budget", type=float, help="--routing: also route under this tool budget B")
    p.add_argument(
        "--calibrate",
        help="--budget: parquet of held-out prompts the threshold is set on (default --routing)",
    )
    p.add_argument("--api-bank", help="API-Bank data directory (level-{1,2,3}-api_processed.json)")
    p.add_argument("--levels", default="1,2,3", help="API-Bank levels (default 1,2,3)")
    p.add_argument("--router", choices=["on", "off"], default="on", help="API-Bank with a run: route or not")
    p.add_argument("--engine", choices=["hf", "vllm"], default="hf", help="API-Bank generation engine")
    p.add_argument("--out-dir", help="API-Bank / sweep: where the tables (and the figure) go")
    p.add_argument("--limit", type=int, default=0, help="first N rows only (default 0 = all)")
    p.add_argument("--out", help=f"per-row results file ({', '.join(ROW_FORMATS)})")
    p.add_argument("--summary", help="also write the summary JSON here")
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument(
        "--samples",
        type=int,
        default=0,
        help="--sweep: each route's reward the mean of K sampled responses (at --temperature when > 0, "
        "else the run's sampling.temperature); default 0 = one greedy response",
    )
    p.add_argument("--max-new-tokens", type=int, help="default: the run's sampling.max_new_tokens")
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
    if args.samples < 0 or (args.samples and not args.sweep):
        p.error("--samples needs --sweep and a value >= 0")
    if args.model and not args.api_bank:
        p.error("--model works with --api-bank only (a plain model has no router)")
    if not (args.api_bank or args.sweep or args.budget_report or args.parquet or args.routing):
        p.error("give --parquet (or --routing, --api-bank, or --sweep)")
    if args.budget is not None and not (args.routing and 0.0 <= args.budget <= 1.0):
        p.error("--budget needs --routing and a value in [0, 1]")
    return args


def result_row(rec, res) -> dict:
    """One output row: route, probabilities, weak label, reward parts, tool use, cost."""
    parts, probs = res.reward, res.probs or [None, None, None]
    return {
        "uid": rec.uid,
        "data_source": rec.data_source,
        "route": res.route,
        "p_answer": probs[0],
        "p_search": probs[1],
        "p_calculate": probs[2],
        "weak_label": res.weak_label,
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


def evaluate_rows(policy, records, args) -> list[dict]:
    """One result row per record; routing, generation and scoring are the collector's own
    (``Policy.respond_batch`` with the rows' ground truths, reward settings from the run's config)."""
    import torch

    from src.jobs.inference import InferenceSettings

    settings = InferenceSettings(args.temperature, args.top_p, args.max_new_tokens, args.sample_route)
    generator = torch.Generator().manual_seed(args.seed)
    rows = []
    for start in range(0, len(records), args.batch_size):
        chunk = records[start : start + args.batch_size]
        results = policy.respond_batch(
            [r.messages for r in chunk],
            [r.data_source for r in chunk],
            routes=None if args.route is None else [args.route] * len(chunk),
            settings=settings,
            generator=generator,
            ground_truths=[r.ground_truth for r in chunk],
        )
        rows += [result_row(rec, res) for rec, res in zip(chunk, results)]
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


def main_api_bank(args: argparse.Namespace) -> int:
    """API-Bank levels with ToolRL's metric: per-level table printed and written to --out-dir."""
    from src.jobs.api_bank import (
        evaluate_api_bank,
        level_table,
        load_api_bank,
        make_model_generator,
        make_run_generator,
        markdown_table,
        write_level_table,
    )

    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    items = load_api_bank(args.api_bank, levels, args.limit)
    max_new = args.max_new_tokens or 256
    if args.model:
        generate = make_model_generator(args.model, args.engine, max_new, device=args.device or "cpu")
    else:
        generate = make_run_generator(
            args.run or args.ckpt, args.router == "on", args.engine, max_new, args.device, args.dtype
        )
    rows = evaluate_api_bank(items, generate, args.batch_size)
    table = level_table(rows)
    if args.out_dir:
        paths = write_level_table(table, rows, args.out_dir)
        log.info("wrote %s", {k: str(v) for k, v in paths.items()})
    print(markdown_table(table), flush=True)
    return 0


def main_sweep(args: argparse.Namespace) -> int:
    """Frontier of a budget sweep: sweep_frontier.csv, route tables and frontier.png in --out-dir."""
    import pandas as pd

    from src.analysis import png_bytes
    from src.frontier import frontier_points, plot_frontier
    from src.jobs.api_bank import markdown_table
    from src.jobs.route_eval import ResponseDraws, find_sweep_runs, sweep_route_tables

    out = Path(args.out_dir or args.sweep)
    out.mkdir(parents=True, exist_ok=True)
    points = []
    for item in sweep_route_tables(
        find_sweep_runs(args.sweep),
        args.parquet,
        args.limit,
        args.device,
        args.max_new_tokens,
        ResponseDraws(args.samples, args.temperature if args.temperature > 0 else None, args.seed),
    ):
        for budget in (None, item["budget"]):  # the argmax routes, then the routes under B
            frontier = frontier_points(item["table"], budget=budget)
            frontier.insert(0, "budget", item["budget"])
            frontier["lambda"], frontier["run"] = item["lambda"], item["run"]
            points.append(frontier)
        item["table"].to_csv(out / f"route_table_B{item['budget']:g}.csv", index=False)
    table = pd.concat(points, ignore_index=True).sort_values(["budget", "routing", "policy"])
    table.to_csv(out / "sweep_frontier.csv", index=False)
    (out / "frontier.png").write_bytes(png_bytes(plot_frontier(table)))
    cols = [
        "budget",
        "routing",
        "policy",
        "reward",
        "reward_lo",
        "reward_hi",
        "cost",
        "learned_tool_rate",
        "gain_share",
        "readable_share",
    ]
    print(markdown_table(table[cols].round(3)), flush=True)
    return 0


def _read_records(path: str, limit: int) -> list:
    from src.datamodules.schema import read_rlla_parquet

    records, skipped = read_rlla_parquet(path)
    if skipped:
        log.warning("%s: skipped %d malformed rows %s", path, sum(skipped.values()), dict(skipped))
    records = records[:limit] if limit else records
    if not records:
        raise SystemExit(f"{path}: no usable rows (skipped: {dict(skipped)})")
    return records


def routing_rows(records, labels: list[str], probs):
    """One row per prompt: uid, user turn, weak label, route probabilities, argmax route."""
    import pandas as pd

    from src.router.routes import Route

    p = probs.double()
    return pd.DataFrame(
        {
            "uid": [r.uid for r in records],
            "user": [r.user for r in records],
            "weak_label": labels,
            **{f"p_{route.name.lower()}": p[:, route.value].tolist() for route in Route},
            "greedy_route": [Route(int(i)).name.lower() for i in p.argmax(-1)],
        }
    )


def main_routing(args: argparse.Namespace) -> int:
    """The router alone on --routing's prompts: markdown tables to stdout, the JSON to --summary."""
    from src.jobs.inference import load_router_policy
    from src.jobs.routing_report import (
        budget_threshold,
        records_labels,
        records_probs,
        routing_report,
        shares_markdown,
    )

    policy = load_router_policy(args.run or args.ckpt, device=args.device, dtype=args.dtype)
    records = _read_records(args.routing, args.limit)
    probs, labels = records_probs(policy, records, args.batch_size), records_labels(policy, records)
    calibration = None
    if args.budget is not None:
        held_out = _read_records(args.calibrate, 0) if args.calibrate else records
        calibration = budget_threshold(records_probs(policy, held_out, args.batch_size), args.budget)
        calibration["calibrated_on"] = str(args.calibrate or args.routing)
    report = routing_report(probs, labels, None if calibration is None else calibration["threshold"])
    report = {"checkpoint": str(policy.checkpoint), "parquet": str(args.routing), **report}
    if calibration is not None:
        report["calibration"] = calibration
    tables = [shares_markdown(report["shares_greedy"], "label \\ route (greedy)")]
    tables.append(shares_markdown(report["shares_sampled"], "label \\ route (sampled)"))
    if calibration is not None:
        tables.append(shares_markdown(report["shares_budgeted"], f"label \\ route (B = {args.budget:g})"))
        realised = report["budgeted"]["tool_rate"]
        tables.append(f"budget B = {args.budget:g}: realised tool rate {realised:.3f} on these prompts")
    auc = report["auc_answer_vs_tool"]
    tables.append("answer-vs-tool AUC: " + ("n/a" if auc is None else f"{auc:.3f}"))
    text = json.dumps(report, indent=2)
    if args.summary:
        Path(args.summary).parent.mkdir(parents=True, exist_ok=True)
        Path(args.summary).write_text(text + "\n")
    if args.out:  # one row per prompt: which requests the router gets wrong, not only how many
        write_rows(routing_rows(records, labels, probs), Path(args.out))
    print("\n\n".join(tables), flush=True)
    # the last two only with --budget
    keys = ("greedy", "sampled", "auc_answer_vs_tool", "budgeted", "calibration")
    print(json.dumps({k: report[k] for k in keys if k in report}), flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    args = parse_args(argv)
    if args.api_bank:
        return main_api_bank(args)
    if args.sweep:
        return main_sweep(args)
    if args.budget_report:
        from src.budget_report import budget_report, markdown_table

        reports = [budget_report(run) for run in args.budget_report]
        print("\n".join(json.dumps(r) for r in reports) + "\n\n" + markdown_table(reports), flush=True)
        return 0
    if args.routing:
        return main_routing(args)
    import pandas as pd
    import torch

    from src.analysis import evaluation_summary
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.inference import load_router_policy

    torch.manual_seed(args.seed)
    records, skipped = read_rlla_parquet(args.parquet)
    if args.limit:
        records = records[: args.limit]
    if not records:
        raise SystemExit(f"{args.parquet}: no usable rows (skipped: {dict(skipped)})")
    policy = load_router_policy(
        args.run or args.ckpt, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens
    )
    t0 = time.perf_counter()
    frame = pd.DataFrame(evaluate_rows(policy, records, args))
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
