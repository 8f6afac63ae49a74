"""The router alone on every held-out prompt at each validation: ``val/routing_*`` scalars and a
per-prompt table in the run directory.

``trainer.limit_val_batches`` bounds the generated validation rollouts (their ``val/...`` reward and
route scalars); the router's own reading costs one forward per prompt and no generation, so it
covers the whole validation split: at 4 batches of 8 prompts only ~8 held-out requests are
tool-routed, and one of them moved a family accuracy by 0.125. It routes with the head's Polyak
average (``router.ema_decay``), as the validation rollouts, ``scripts/evaluate.py`` and
``scripts/infer.py`` do.

With a calibration split (``data.calib_files``, or synthetic ``data.synthetic.n_calib``) it also
routes the held-out prompts under ``router.budget`` with the p_route threshold calibrated on the
calibration prompts (``val/routing_budgeted/*``: the realised ``tool_rate`` on prompts the threshold
never saw, the threshold, the routing metrics), as ``scripts/infer.py --budget`` routes.

Table: ``<rollouts>/val/routes_XXXXXXXX.parquet`` (XXXXXXXX the step TensorBoard logs the validation
at: ``src.callbacks.run_logs.logger_step``), one row per prompt:
uid, weak label, the three route probabilities and the argmax route; written atomically by rank 0.
Every rank reads the whole split, so a sharded actor's forward runs on all of them alike.
"""

from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import lightning.pytorch as pl
import pandas as pd
import torch

from src.atomic_files import atomic_file
from src.callbacks.run_logs import logger_step
from src.rollout.single_turn import ROUTE_NAMES, router_logits
from src.router.families import ToolFamilies
from src.router.routes import record_context
from src.router.routing_eval import (
    budget_routes,
    budgeted_scalars,
    calibrate_tool_threshold,
    routing_scalars,
)


class HeldOutRoutingLogger(pl.Callback):
    """``families``: the job's tool families (weak labels, as the collector reads them);
    ``pad_id``: the tokenizer's pad id; ``micro_batch``: prompts per router forward; ``budget``: B
    of the budgeted routing (read only with a calibration split)."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        families: ToolFamilies,
        pad_id: int,
        micro_batch: int,
        budget: float | None = None,
    ):
        self.out_dir = Path(out_dir)
        self.families, self.pad_id, self.micro_batch = families, int(pad_id), int(micro_batch)
        self.budget = budget

    def on_validation_epoch_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        records = held_out_records(trainer)
        read = partial(router_logits, partial(pl_module.router_logits, averaged=True))
        logits = read([r["prompt_ids"] for r in records], self.pad_id, self.micro_batch)
        labels = [str(record_context(r, self.families, with_label=True).weak_label) for r in records]
        scalars, threshold = routing_scalars(logits, labels, "val"), None
        calib = getattr(trainer.datamodule, "calib_dataset", None)
        if calib is not None and len(calib) and self.budget is not None:
            calib_logits = read([r["prompt_ids"] for r in calib.records], self.pad_id, self.micro_batch)
            threshold = calibrate_tool_threshold(torch.softmax(calib_logits.double(), -1), self.budget)
            scalars.update(budgeted_scalars(logits, labels, threshold, "val"))
        # the same values on every rank (each read the whole split): nothing to reduce
        pl_module.log_dict(scalars, on_step=False, on_epoch=True, logger=True)
        if trainer.is_global_zero:
            path = self.out_dir / f"routes_{logger_step(trainer):08d}.parquet"
            write_routes(path, records, labels, logits, threshold)


def held_out_records(trainer) -> list[dict]:
    """Every record of the datamodule's validation split (not this rank's share, not the batches
    ``limit_val_batches`` lets through)."""
    dm = trainer.datamodule
    dataset = None if dm is None else dm.val_dataset
    if dataset is None or len(dataset) == 0:
        raise ValueError(
            "HeldOutRoutingLogger needs the datamodule's validation split (val_dataset): validation "
            "ran without one"
        )
    return list(dataset.records)


def write_routes(
    path: Path, records: list[dict], labels: list[str], logits: torch.Tensor, threshold: float | None = None
) -> None:
    """One row per prompt (uid, weak_label, p_<route> for each route, route = the argmax; with a
    calibrated ``threshold`` also ``route_budgeted``, the route under the budget), atomically."""
    probs = torch.softmax(logits.double(), dim=-1)
    frame = pd.DataFrame({"uid": [r["uid"] for r in records], "weak_label": labels})
    for i, name in enumerate(ROUTE_NAMES):
        frame[f"p_{name}"] = probs[:, i].numpy()
    frame["route"] = [ROUTE_NAMES[int(i)] for i in probs.argmax(dim=-1)]
    if threshold is not None:
        frame["route_budgeted"] = [ROUTE_NAMES[int(i)] for i in budget_routes(probs, threshold)]
    with atomic_file(path) as tmp:  # a validation run again after a resume rewrites its step's table
        frame.to_parquet(tmp, index=False)
