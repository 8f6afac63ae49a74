"""Replay the router's learning on a run's frozen actor, over many seeds, in seconds per seed.

    python scripts/replay_router.py --run outputs/router_grpo/<stamp> --seeds 0-9 --steps 500
    python scripts/replay_router.py --run <run> --seeds 0-4 router.lambda_update=gradient router.lr=3e-3
    python scripts/replay_router.py --run <run> --seeds 0-9 router.pooling=sif router.sif_a=0.03

The first call writes ``<run>/replay/{train,test}.pt`` (each prompt's router input and greedy
reward / cost under every route: a few minutes on CPU); later calls reuse them. Overrides are the
run's ``router.*`` keys (``src.config.schema.RouterConfig``). One line per seed: the last 50 steps'
mean cost and λ range, training accuracies, and the final head's greedy accuracies and tool rate on
the held-out split (its Polyak average with ``router.ema_decay``, as a run evaluates it), then
whether the issue-19 targets hold (|cost − B| <= 0.05, held-out answer accuracy and family
accuracy >= 0.9). ``--frontier`` adds each head's share of the best allocation's gain under
the budget (``src.frontier``) on the test prompts, with a line for the run's own head and one for
a linear probe fitted on every training prompt's three rewards. ``--inputs-from warm_start`` (or
an HF model dir) replays on the router inputs of another backbone, the rewards unchanged: whether the representation or the
router's own learning decides its held-out accuracy. Overrides of ``router.pooling``,
``tail_tokens``, ``sif_a``, ``hidden_layer`` or ``input`` re-pool the inputs from the run's final backbone
(``router.input=base_embeddings router.hidden_layer=0``: from the base model's embedding table)
(``router.pooling=sif``: SIF statistics fitted on the training prompts as a run fits them), so one
table compares poolings. What it leaves out
(``src.jobs.router_replay``): the actor learning, and sampled responses. A setting it favours still
needs real runs.
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


def meets_targets(result: dict[str, float], prefix: str, budget: float) -> bool:
    """Issue 19's targets on a ``replay`` result: |cost − B| <= 0.05 and the ``prefix`` (``test``:
    greedy, ``test_budgeted``: under the budget) answer and family accuracies >= 0.9 (NaN fails)."""
    accs = (result[f"{prefix}_acc_answer"], result[f"{prefix}_acc_family"])
    return abs(result["cost_last50"] - budget) <= 0.05 and all(a >= 0.9 for a in accs)


def split_records(cfg, split: str, limit: int) -> list:
    """The first ``limit`` (0: all) records of the run's ``train`` or ``test`` split."""
    from src.datamodules.schema import read_rlla_parquet
    from src.jobs.build import data_files

    records = read_rlla_parquet(data_files(cfg)[0 if split == "train" else 1][0])[0]
    return records[:limit] if limit else records


def tables(run: Path, limit: int):
    """(train, test) replay tables of ``run``, built once and cached in ``run/replay``."""
    import torch

    from src.atomic_files import atomic_file
    from src.jobs.inference import load_router_policy
    from src.jobs.router_replay import ReplayTable, replay_table

    out, policy = {}, None  # the policy is loaded only when a table is missing
    for split in ("train", "test"):
        path = run / "replay" / f"{split}{f'-{limit}' if limit else ''}.pt"
        if not path.is_file():
            policy = policy or load_router_policy(run, device="cpu")
            table = replay_table(policy, split_records(policy.config, split, limit))
            path.parent.mkdir(parents=True, exist_ok=True)
            with atomic_file(path) as tmp:
                torch.save(vars(table), tmp)
        out[split] = ReplayTable(**torch.load(path))
    return out["train"], out["test"]


def with_policy_inputs(policy, records: dict, train, test):
    """``(train, test)`` with their router inputs replaced by what ``policy``'s head reads for
    ``records`` (``{"train": [...], "test": [...]}``); rewards, costs and labels unchanged."""
    from src.jobs.router_replay import ReplayTable, router_inputs

    return tuple(
        ReplayTable(router_inputs(policy, records[split]), table.reward, table.cost, table.label)
        for split, table in (("train", train), ("test", test))
    )


def refit_sif(policy) -> None:
    """Refit the policy's SIF statistics on its current backbone over every training prompt of its
    run, as a run fits them before its first step (not only ``--limit``'s)."""
    from src.jobs.router_pooling import fit_sif_pooling

    ids = [policy.prompt_ids(r.messages) for r in split_records(policy.config, "train", 0)]
    fit_sif_pooling(policy.module, ids, policy.tokenizer)


def with_inputs_from(run: Path, source: str, train, test, limit: int):
    """``(train, test)`` with the router inputs the run's head reads from another model's backbone:
    ``warm_start`` (the run's own SFT warm start, before any RL step) or an HF model directory. The
    rewards stay the run's final actor's, so what differs is only the representation."""
    from src.jobs.inference import load_router_policy
    from src.jobs.sft import sft_warm_start_dir
    from src.jobs.warm_start import base_model_dir
    from src.models.loading import load_causal_lm

    policy = load_router_policy(run, device="cpu")
    cfg = policy.config
    if source == "warm_start":
        if cfg.model.get("warm_start") != "sft":
            raise SystemExit(
                f"--inputs-from warm_start: {run} has model.warm_start={cfg.model.get('warm_start')!r}, not 'sft'"
            )
        path = sft_warm_start_dir(cfg, base_model_dir(cfg))
    else:
        path = Path(source)
    if not (path / "config.json").is_file():
        raise SystemExit(
            f"--inputs-from {source}: no model at {path} (a warm start is built by the run's first job)"
        )
    policy.module.actor.load_state_dict(load_causal_lm(path, str(cfg.model.dtype)).state_dict())
    records = {split: split_records(cfg, split, limit) for split in ("train", "test")}
    if policy.module.router_cfg.pooling == "sif":  # the common direction is the new backbone's
        refit_sif(policy)
    log.info("router inputs from %s", path)
    return with_policy_inputs(policy, records, train, test)


def with_pooling(run: Path, router, train, test, limit: int):
    """``(train, test)`` with the router inputs re-pooled as ``router`` says (its ``pooling``,
    ``tail_tokens``, ``sif_a``, ``hidden_layer``) from the run's final backbone; SIF statistics
    fitted on the training prompts as a run fits them. Rewards unchanged."""
    from src.jobs.inference import load_router_policy
    from src.models.router_policy import RouterPolicy

    policy = load_router_policy(run, device="cpu")
    module, cfg = policy.module, policy.config
    vocab = module.actor.get_input_embeddings().num_embeddings
    old = module.router_head
    module.router_head = RouterPolicy(module.actor.config.hidden_size, router, vocab_size=vocab)
    if router.input == "base_embeddings":  # the run's frozen table, else the base model's, as a run takes it
        from src.jobs.router_pooling import base_input_embeddings
        from src.jobs.warm_start import base_model_dir

        has_table = hasattr(old, "base_embedding")
        table = old.base_embedding if has_table else base_input_embeddings(base_model_dir(cfg))
        module.router_head.set_base_embedding(table)
    module.router_cfg = router
    records = {split: split_records(cfg, split, limit) for split in ("train", "test")}
    if router.pooling == "sif":
        refit_sif(policy)
    log.info("router inputs re-pooled: pooling=%s tail_tokens=%s", router.pooling, router.tail_tokens)
    return with_policy_inputs(policy, records, train, test)


def budget_figures(frame, budget: float) -> dict:
    """``budget_gain_shares`` of a route frame under ``budget``, rounded: ``gain_share_budgeted``
    and ``readable_share_budgeted``."""
    from src.jobs.router_replay import budget_gain_shares

    return {f"{k}_budgeted": round(v, 3) for k, v in budget_gain_shares(frame, budget).items()}


def reference_lines(run: Path, train, test, records: list, budget: float, own_inputs: bool) -> list[dict]:
    """``--frontier``'s lines beside the seeds': the run's own head (its Polyak average) on the test
    table where the inputs are the run's, and the full-information linear probe (``probe_routes``)."""
    import torch

    from src.jobs.inference import load_router_policy
    from src.jobs.router_replay import probe_routes, route_frame

    lines = []
    if own_inputs:
        head = load_router_policy(run, device="cpu").module.router_head
        with torch.no_grad():
            probs = torch.softmax(head.pooled_logits(test.inputs, averaged=True).double(), -1)
        lines.append({"head": "run", **budget_figures(route_frame(test, probs, records), budget)})
    # the probe's routes as one-hot probabilities: under the budget exactly its ⌊B·N⌋ tool routes
    one_hot = torch.nn.functional.one_hot(probe_routes(train, test, budget), 3).double()
    lines.append({"head": "linear_probe", **budget_figures(route_frame(test, one_hot, records), budget)})
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", required=True, help="a router run directory (checkpoints/manifest.yaml)")
    p.add_argument("--seeds", default="0-4", help="'0-4' or '0,3,7'")
    p.add_argument("--steps", type=int, help="default: the run's trainer.max_steps")
    p.add_argument("--limit", type=int, default=0, help="first N prompts of each split (0: all)")
    p.add_argument(
        "--inputs-from",
        help="router inputs from another backbone: 'warm_start' (the run's SFT warm start) or an HF "
        "model dir; rewards stay the run's (does the representation or the RL decide held-out accuracy?)",
    )
    p.add_argument(
        "--frontier",
        action="store_true",
        help="add each head's share of the best allocation's gain under the budget on the test prompts, "
        "and lines for the run's own head and a full-information linear probe",
    )
    p.add_argument("overrides", nargs="*", help="router.<key>=<value>")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    import torch
    from omegaconf import OmegaConf

    from src.config.schema import RouterConfig
    from src.jobs.inference import resolve_run
    from src.jobs.router_replay import replay, route_frame

    torch.set_num_threads(1)  # a small head: threads only add noise
    run = Path(args.run)
    cfg = OmegaConf.create(resolve_run(run)[1]["config"])
    bad = [o for o in args.overrides if not o.startswith("router.")]
    if bad:
        p.error(f"only router.* overrides: {bad}")
    as_run = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RouterConfig), cfg.router))
    cfg.merge_with(OmegaConf.from_dotlist(args.overrides))
    router = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(RouterConfig), cfg.router))
    pooling_keys = ("pooling", "tail_tokens", "sif_a", "hidden_layer", "input")
    re_pool = any(getattr(router, k) != getattr(as_run, k) for k in pooling_keys)
    # every argument error before the tables are built (a replay of the run's prompts: minutes)
    if args.inputs_from and as_run.input == "base_embeddings":
        p.error("--inputs-from swaps the actor, but this run's router reads router.input=base_embeddings")
    if args.inputs_from and re_pool:
        p.error("--inputs-from with router.pooling / tail_tokens / sif_a / hidden_layer / input overrides")
    train, test = tables(run, args.limit)
    if args.inputs_from:
        train, test = with_inputs_from(run, args.inputs_from, train, test, args.limit)
    if re_pool:
        train, test = with_pooling(run, router, train, test, args.limit)
    shape = (int(cfg.sampling.n_prompts), int(cfg.sampling.n_generations_per_prompt))
    steps = args.steps or int(cfg.trainer.max_steps)
    records = split_records(cfg, "test", args.limit) if args.frontier else None
    if args.frontier:
        own_inputs = not (args.inputs_from or re_pool)  # the run's head reads these inputs
        for line in reference_lines(run, train, test, records, router.budget, own_inputs):
            sys.stdout.write(json.dumps(line) + "\n")
    for seed in seeds(args.seeds):
        r, probs = replay(train, test, router, seed, steps, shape)
        row = {"seed": seed, **{k: round(v, 3) for k, v in r.items()}}
        if args.frontier:
            row |= budget_figures(route_frame(test, probs, records), router.budget)
        row |= {
            "targets": meets_targets(r, "test", router.budget),
            "targets_budgeted": meets_targets(r, "test_budgeted", router.budget),
        }
        sys.stdout.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
