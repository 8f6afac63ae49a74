"""Route and answer prompts with a trained run: router action + probabilities, the route's prompt,
the response and the tools it called.

    python scripts/infer.py --run outputs/router_grpo/<stamp> --prompt "What is 12% of 250?"
    python scripts/infer.py --ckpt <run>/checkpoints/last.ckpt --parquet data.parquet --limit 3
    python scripts/infer.py --run <run> --prompt "Hi" --system "$(cat system.txt)" --route answer --json

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
    return p.parse_args(argv)


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

    from src.jobs.inference import load_router_policy

    torch.manual_seed(args.seed)
    prompts = prompts_from(args)
    policy = load_router_policy(
        args.run or args.ckpt, device=args.device, dtype=args.dtype, max_new_tokens=args.max_new_tokens
    )
    generator = torch.Generator().manual_seed(args.seed)
    for label, messages, ds in prompts:
        result = policy.respond(
            messages,
            ds,
            temperature=args.temperature,
            top_p=args.top_p,
            route=args.route,
            sample_route=args.sample_route,
            generator=generator,
        )
        if args.json:
            print(json.dumps({"id": label, "data_source": ds, **result.to_dict()}), flush=True)
        else:
            print(render(label, result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
