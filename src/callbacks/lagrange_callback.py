"""λ update: every K steps, the configured controller (``src.algorithms.dual_update``: plain dual
ascent or PID) moves λ from the mean cost seen since the last update."""

from __future__ import annotations

import logging
from typing import Any

import lightning.pytorch as pl
import torch

from src.algorithms.dual_update import DualGains, DualState, dual_step, init_dual_state
from src.callbacks.rollout_logger import step_rollout

log = logging.getLogger(__name__)


class LagrangeCallback(pl.Callback):
    """Owns the dual update; λ itself is the module's ``lagrange_lambda`` buffer (checkpointed).

    The sums of cost and r_task since the last update, and the step count, are callback state
    and are saved in / restored from checkpoints, so a resumed run updates λ exactly as an
    uninterrupted one.
    """

    def __init__(
        self,
        budget: float,
        lr: float,
        every_k_steps: int = 1,
        lambda_max: float | None = None,
        update: str = "gradient",
        gains: DualGains | None = None,
    ):
        self.budget, self.lr, self.every = float(budget), float(lr), max(int(every_k_steps), 1)
        self.update = update
        self.gains = gains or DualGains(ki=self.lr, lambda_max=lambda_max)
        self.dual: DualState | None = None  # the controller's memory; starts from the module's λ
        self.cost_sum = self.reward_sum = 0.0
        self.count = 0
        self.steps = 0

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        rb = step_rollout(outputs)
        if rb is None or rb.router is None:
            return
        self.cost_sum += float(rb.router.cost.sum())
        self.reward_sum += float(rb.rewards.sum()) if rb.rewards.numel() else 0.0
        self.count += int(rb.router.cost.numel())
        self.steps += 1
        if self.steps % self.every:
            return
        # every rank sees its own share of the rollouts: λ must come from the global mean
        totals = trainer.strategy.reduce(
            torch.tensor(
                [self.cost_sum, self.reward_sum, float(self.count)],
                dtype=torch.float64,
                device=pl_module.device,
            ),
            reduce_op="sum",
        )
        self.cost_sum, self.reward_sum, self.count = float(totals[0]), float(totals[1]), int(totals[2])
        mean_cost = self.cost_sum / max(self.count, 1)
        if self.dual is None:
            self.dual = init_dual_state(float(pl_module.lagrange_lambda))
        self.dual = dual_step(self.update, self.dual, mean_cost, self.budget, self.gains)
        lam = self.dual.lam
        pl_module.lagrange_lambda.fill_(lam)
        pl_module.log_dict(
            {
                "train/lambda_next": lam,
                "train/lambda_p": self.dual.p,
                "train/lambda_i": self.dual.integral,
                "train/lambda_d": self.dual.d,
                "train/cost_window_mean": mean_cost,
                "train/reward_task_window_mean": self.reward_sum / max(self.count, 1),
            },
            on_step=True,
            logger=True,
        )
        self.cost_sum = self.reward_sum = 0.0
        self.count = 0

    def state_dict(self) -> dict[str, Any]:
        return {
            "cost_sum": self.cost_sum,
            "reward_sum": self.reward_sum,
            "count": self.count,
            "steps": self.steps,
            "dual": None if self.dual is None else self.dual.state_dict(),
        }

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.__dict__.update({k: state_dict[k] for k in ("cost_sum", "reward_sum", "count", "steps")})
        dual = state_dict["dual"]
        self.dual = None if dual is None else DualState.from_state_dict(dual)
