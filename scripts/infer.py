"""Route and answer prompts with a trained run: router action + probabilities, the route's prompt,
the response and the tools it called.

    python scripts/infer.py --run outputs/router_grpo/<stamp> --prompt "What is 12% of 250?"
    python scripts/infer.py --ckpt <run>/checkpoints/last.ckpt --parquet data.parquet --limit 3
    python scripts/infer.py --run <run> --prompt "Hi" --system "$(cat system.txt)" --route answer --json

Under a tool budget B (``--budget 0.3 --calibrate held_out.parquet``) a prompt goes to its better
tool family only when that family's probability p_route reaches a threshold set on the held-out
prompts so that a share B of them use a tool; the realised tool rate is printed beside B at the end
(``--route-only`` skips generation):
    python scripts/infer.py --run <run> --parquet test.parquet --limit 0 --budget 0.3 --calibrate test.parquet

``--prompt`` is wrapped as an RLLA user turn ("**Dialogue Records History**\\n<user> ... </user>");
without ``--system`` the system message is the synthetic RLLA prompt listing ``--tools``
(converted to harmony for ``--data-source rlla_gpt``). ``--json`` prints one JSON object per prompt.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

DEFAULT_TOOLS = "weather_lookup,calculator,web_search"
RULE = "-" * 72


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run directory (uses checkpoints/manifest.yaml's latest checkpoint)")
    src.add_argument("--ckpt", help="one checkpoint file (a manifest.yaml must sit beside it)")
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--prompt", help="user request text")
    what.add_argument("--parquet", help="RLLA-schema parquet: answer its rows' prompts")
    p.add_argument(
        "--system", help="system message for --prompt (default: synthetic RLLA prompt with --tools)"
    )
    p.add_argument(
        "--tools",
        default=DEFAULT_TOOLS,
        help=f"synthetic tools listed by the default system prompt (default {DEFAULT_TOOLS})",
    )
    p.add_argument("--limit", type=int, default=5, help="rows of --parquet to answer (default 5; 0 = all)")
    p.add_argument(
        "--data-source",
        choices=["rlla", "rlla_gpt"],
        help="reward/format of the prompt (default: rlla for --prompt, each row's for --parquet)",
    )
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--max-new-tokens", type=int, help="default: the run's sampling.max_new_tokens")
    p.add_argument(
        "--route", choices=["answer", "search", "calculate"], help="force a route instead of the router's"
    )
    p.add_argument("--sample-route", action="store_true", help="sample the route instead of the argmax")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", help="cpu, cuda, ... (default: cuda when available)")
    p.add_argument("--dtype", help="override model.dtype (e.g. float32 for a bf16 run on CPU)")
    p.add_argument("--json", action="store_true", help="print one JSON object per prompt instead of text")
    p.add_argument("--budget", type=float, help="route under this tool budget B (needs --calibrate)")
    p.add_argument("--calibrate", help="--budget: parquet of held-out prompts the threshold is set on")
    p.add_argument("--route-only", action="store_true", help="decide routes only; no generation")
    args = p.parse_args(argv)
    if args.budget is not None and (not args.calibrate or not 0.0 <= args.budget <= 1.0 or args.route):
        p.error("--budget needs --calibrate, a value in [0, 1] and no --route")
    return args


def budget_route_fn(policy, args):
    """None, or a function messages -> (route name, probs) that keeps the calibrated budget."""
    if args.budget is None:
        return None
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.routing_report import budget_threshold, records_probs
    from src.router.routing_eval import ROUTES, budget_routes

    held_out, _ = read_rlla_parquet(args.calibrate)
    if not held_out:
        raise SystemExit(f"--calibrate {args.calibrate}: no usable rows")
    calibration = budget_threshold(records_probs(policy, held_out), args.budget)
    logging.getLogger("infer").warning("budget calibration on %s: %s", args.calibrate, calibration)

    def route(messages):
        probs = policy.route_probs([messages])
        return ROUTES[int(budget_routes(probs, calibration["threshold"])[0])], probs[0].tolist()

    return route


def default_system(tool_names: str, data_source: str) -> str:
    from src.datamodules.synthetic import TOOLS, build_system_prompt

    names = [n.strip() for n in tool_names.split(",") if n.strip()]
    unknown = [n for n in names if n not in TOOLS]
    if unknown or not names:
        raise SystemExit(f"--tools: unknown {unknown or 'empty list'}; choose from {sorted(TOOLS)}")
    text = build_system_prompt([TOOLS[n] for n in names])
    if data_source == "rlla_gpt":
        from src.datamodules.gpt_oss import convert_system_prompt

        text = convert_system_prompt(text)
    return text


def prompts_from(args) -> list[tuple[str, list[dict], str]]:
    """(label, messages, data_source) per prompt to answer."""
    if args.prompt is not None:
        from src.datamodules.synthetic import build_user_turn

        ds = args.data_source or "rlla"
        system = args.system if args.system is not None else default_system(args.tools, ds)
        return [
            (
                "prompt",
                [
                    {"role": "system", "content": system},
                    {"role": "user", "content": build_user_turn(args.prompt)},
                ],
                ds,
            )
        ]
    from src.datamodules.schema import read_rlla_parquet

    records, skipped = read_rlla_parquet(args.parquet)
    if skipped:
        logging.getLogger("infer").warning(
            "%s: skipped %d malformed rows %s", args.parquet, sum(skipped.values()), dict(skipped)
        )
    if args.limit:
        records = records[: args.limit]
    return [(f"uid {r.uid}", r.messages, args.data_source or r.data_source) for r in records]


def render(label: str, result) -> str:
    probs = (
        "n/a (no router head)"
        if result.probs is None
        else "  ".join(f"{n}={p:.3f}" for n, p in zip(("answer", "search", "calculate"), result.probs))
    )
    calls = [
        f"  {c.name}({json.dumps(c.parameters)})" if c.name else f"  <unreadable> {c.raw}"
        for c in result.tool_calls
    ] or ["  (none)"]
    return "\n".join(
        [
            RULE,
            f"[{label}] route: {result.route or 'none'}   probs: {probs}",
            f"cost: {result.cost:g}   tokens: {result.response_length}",
            "--- route-specific system prompt ---",
            result.messages[0]["content"],
            "--- user ---",
            result.messages[-1]["content"],
            "--- response ---",
            result.response,
            "--- tools called ---",
            *calls,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(
        level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s"
    )
    args = parse_args(argv)
    import torch

    from src.jobs.inference import InferenceSettings, load_router_policy

    torch.manual_seed(args.seed)
    prompts = prompts_from(args)
    policy = load_router_policy(
        args.run or args.ckpt, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens
    )
    settings = InferenceSettings(
        temperature=args.temperature, top_p=args.top_p, sample_route=args.sample_route
    )
    generator = torch.Generator().manual_seed(args.seed)
    budgeted = budget_route_fn(policy, args)
    routed_tool = called_tool = 0
    for label, messages, ds in prompts:
        route, probs = budgeted(messages) if budgeted else (args.route, None)
        if args.route_only:
            route, probs = (
                (route, probs) if budgeted else policy.route(messages, args.sample_route, generator)
            )
            routed_tool += route != "answer"
            print(json.dumps({"id": label, "route": route, "probs": probs}), flush=True)
            continue
        result = policy.respond(
            messages,
            ds,
            route=route,
            settings=settings,
            generator=generator,
        )
        routed_tool += (result.route or "answer") != "answer"
        called_tool += result.cost > 0
        if args.json:
            print(json.dumps({"id": label, "data_source": ds, **result.to_dict()}), flush=True)
        else:
            print(render(label, result), flush=True)
    print(json.dumps(tool_rate_summary(args, len(prompts), routed_tool, called_tool)), flush=True)
    return 0


def tool_rate_summary(args, n: int, routed_tool: int, called_tool: int) -> dict:
    """The realised tool rate (routed to a tool; responses that called one) beside the budget."""
    out = {"prompts": n, "budget": args.budget, "tool_route_rate": routed_tool / n if n else None}
    if not args.route_only:
        out["tool_call_rate"] = called_tool / n if n else None
    return out


if __name__ == "__main__":
    sys.exit(main())
