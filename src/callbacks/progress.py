"""Progress: a TQDM bar over global steps (not batches of an epoch), so its ETA is for the run, whose
postfix tells the router story (λ, Ê[cost] against B, the route mix, reward); and a log line every
N steps for jobs whose bar nobody watches (the SFT warm start: step, loss, ETA)."""

from __future__ import annotations

import logging
import math
import sys
import time
from collections.abc import Mapping

import lightning.pytorch as pl
from lightning.pytorch.callbacks import TQDMProgressBar
from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

log = logging.getLogger(__name__)


def _value(metrics: Mapping, key: str) -> float | None:
    v = metrics.get(key)
    if v is None:
        return None
    v = float(v)
    return None if math.isnan(v) else v


def router_postfix(metrics: Mapping, budget: float | None) -> dict[str, str]:
    """The bar's postfix from logged scalars: reward, λ, cost vs B, route mix (a/s/c fractions).

    Keys that were not logged are left out, so plain GRPO runs show reward and KL only.
    """
    out: dict[str, str] = {}
    reward = _value(metrics, "train/reward_task_mean")
    if reward is not None:
        out["reward"] = f"{reward:.2f}"
    lam = _value(metrics, "train/lambda")
    if lam is not None and _value(metrics, "train/route_frac_answer") is not None:
        out["λ"] = f"{lam:.2f}"
        cost = _value(metrics, "train/cost_mean")
        if cost is not None:
            out["cost"] = f"{cost:.2f}/B{budget:.2f}" if budget is not None else f"{cost:.2f}"
        mix = [_value(metrics, f"train/route_frac_{r}") for r in ("answer", "search", "calculate")]
        out["a/s/c"] = "/".join(f"{m:.2f}" for m in mix if m is not None)
        acc = [_value(metrics, f"train/route_acc_{k}") for k in ("answer", "family")]
        if all(a is not None for a in acc):
            out["acc a/f"] = "/".join(f"{a:.2f}" for a in acc)
    else:
        kl = _value(metrics, "train/kl")
        if kl is not None:
            out["kl"] = f"{kl:.3g}"
    return out


class StepProgressBar(TQDMProgressBar):
    """One bar for the whole run when ``max_steps`` is set: kept across epochs, and on resume it
    starts at the restored step so the rate (and ETA) counts only the steps run now.

    ``budget``: the router's B, shown beside Ê[cost] (None: no router).
    """

    def __init__(self, *args, budget: float | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self._run_bar_open = False
        self.budget = budget
        self._redraw_every = 1

    def init_validation_tqdm(self):
        """The validation's own bar only on a terminal: in a log file it adds lines, not news."""
        if sys.stdout.isatty():
            return super().init_validation_tqdm()
        return Tqdm(disable=True)

    def on_train_epoch_start(self, trainer, *_) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            return super().on_train_epoch_start(trainer)
        self._open_run_bar(trainer)

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        # a run resumed mid-epoch gets no on_train_epoch_start from Lightning
        if trainer.max_steps and trainer.max_steps > 0:
            self._open_run_bar(trainer)

    def _open_run_bar(self, trainer) -> None:
        if self._run_bar_open:
            return
        super().on_train_epoch_start(trainer)
        bar = self.train_progress_bar
        bar.reset(total=trainer.max_steps)
        bar.initial = bar.n = trainer.global_step
        bar.set_description("step")
        bar.refresh()
        self._run_bar_open = True
        # Written to a file (``make train > log``), every redraw is a new piece of the log: redraw
        # about 20 times a run there, every step on a terminal.
        self._redraw_every = 1 if sys.stdout.isatty() else max(1, trainer.max_steps // 20)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            return super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        step = trainer.global_step
        if step % self._redraw_every and step < trainer.max_steps:
            return
        self.train_progress_bar.n = step
        postfix = router_postfix(trainer.callback_metrics, self.budget)
        self.train_progress_bar.set_postfix(postfix or self.get_metrics(trainer, pl_module), refresh=False)
        self.train_progress_bar.refresh()

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        if not (trainer.max_steps and trainer.max_steps > 0):
            super().on_train_epoch_end(trainer, pl_module)


def eta_seconds(done: int, total: int, elapsed: float) -> float:
    """Remaining seconds at the mean rate so far (inf before the first step)."""
    if done <= 0:
        return math.inf
    return max(total - done, 0) * elapsed / done


class StepLogProgress(pl.Callback):
    """Logs ``<label> step i/N  loss x  elapsed  ETA`` every ``every`` global steps and at the end.

    ``loss_key``: the logged scalar to show (e.g. ``train/sft_loss``).
    """

    def __init__(self, label: str, loss_key: str, every: int = 25):
        self.label, self.loss_key, self.every = label, loss_key, max(int(every), 1)
        self._t0 = 0.0
        self._start_step = 0

    def on_train_start(self, trainer, pl_module) -> None:
        self._t0, self._start_step = time.perf_counter(), trainer.global_step
        log.info("%s: %d steps", self.label, trainer.max_steps)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step, total = trainer.global_step, trainer.max_steps
        if step % self.every and step != total:
            return
        elapsed = time.perf_counter() - self._t0
        loss = _value(trainer.callback_metrics, self.loss_key)
        eta = eta_seconds(step - self._start_step, total - self._start_step, elapsed)
        log.info(
            "%s step %d/%d  loss %s  %.0fs elapsed  ETA %.0fs",
            self.label,
            step,
            total,
            "n/a" if loss is None else f"{loss:.4f}",
            elapsed,
            eta,
        )
