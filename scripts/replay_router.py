"""Replay the router's learning on a run's frozen actor, over many seeds, in seconds per seed.

    python scripts/replay_router.py --run outputs/router_grpo/<stamp> --seeds 0-9 --steps 500
    python scripts/replay_router.py --run <run> --seeds 0-4 router.lambda_update=gradient router.lr=3e-3

The first call writes ``<run>/replay/{train,test}.pt`` (each prompt's router input and greedy
reward / cost under every route: a few minutes on CPU); later calls reuse them. Overrides are the
run's ``router.*`` keys (``src.config.groups.RouterConfig``). One line per seed: the last 50 steps'
mean cost and λ range, training accuracies, and the final head's greedy accuracies and tool rate on
the held-out split, then whether the issue-19 targets hold (|cost − B| <= 0.05, held-out answer
accuracy and family accuracy >= 0.9). What it leaves out (``src.jobs.router_replay``): the actor
learning, and sampled responses. A setting it favours still needs real runs.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

log = logging.getLogger("replay_router")


def seeds(text: str) -> list[int]:
    """'0-4' or '0,3,7' -> list of ints."""
    if "-" in text:
        lo, hi = text.split("-")
        return list(range(int(lo), int(hi) + 1))
    return [int(s) for s in text.split(",")]


def tables(run: Path, limit: int):
    """(train, test) replay tables of ``run``, built once and cached in ``run/replay``."""
    import torch

    from src.atomic_files import atomic_file
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files
    from src.jobs.inference import load_router_policy
    from src.jobs.router_replay import ReplayTable, replay_table

    out, policy = {}, None  # the policy is loaded only when a table is missing
    for split in ("train", "test"):
        path = run / "replay" / f"{split}{f'-{limit}' if limit else ''}.pt"
        if not path.is_file():
            policy = policy or load_router_policy(run, device="cpu")
            files = data_files(policy.config)[0 if split == "train" else 1]
            records = read_rlla_parquet(files[0])[0]
            table = replay_table(policy, records[:limit] if limit else records)
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as tmp:
                torch.save(vars(table), tmp)
        out[split] = ReplayTable(**torch.load(path))
    return out["train"], out["test"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a router run directory (checkpoints/manifest.yaml)")
    p.add_argument("--seeds", default="0-4", help="'0-4' or '0,3,7'")
    p.add_argument("--steps", type=int, help="default: the run's trainer.max_steps")
    p.add_argument("--limit", type=int, default=0, help="first N prompts of each split (0: all)")
    p.add_argument("overrides", nargs="*", help="router.<key>=<value>")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    import torch
    from omegaconf import OmegaConf

    from src.config.groups import RouterConfig
    from src.jobs.inference import resolve_run
    from src.jobs.router_replay import replay

    torch.set_num_threads(1)  # a small head: threads only add noise
    run = Path(args.run)
    cfg = OmegaConf.create(resolve_run(run)[1]["config"])
    bad = [o for o in args.overrides if not o.startswith("router.")]
    if bad:
        p.error(f"only router.* overrides: {bad}")
    cfg.merge_with(OmegaConf.from_dotlist(args.overrides))
    router = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RouterConfig), cfg.router))
    train, test = tables(run, args.limit)
    shape = (int(cfg.sampling.n_prompts), int(cfg.sampling.n_generations_per_prompt))
    steps = args.steps or int(cfg.trainer.max_steps)
    for seed in seeds(args.seeds):
        r = replay(train, test, router, seed, steps, shape)
        accs = (r["test_acc_answer"], r["test_acc_family"])  # NaN (no tool route) fails
        ok = abs(r["cost_last50"] - router.budget) <= 0.05 and all(a >= 0.9 for a in accs)
        sys.stdout.write(
            json.dumps({"seed": seed, **{k: round(v, 3) for k, v in r.items()}, "targets": ok}) + "\n"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
