"""The router as one unit: its head (prompt hidden states -> 3 logits), its loss and its entropy
schedule; and λ's windowed update (``lambda_window_step``) on the tensors that hold λ's state.

Testable without a LightningModule: give it the backbone's hidden states of the prompts and the
step's :class:`RouterRollout`. The module only runs the backbone, steps the optimizer and keeps
λ and its window as checkpointed buffers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from src.algorithms.dual_update import DualState
from src.algorithms.lagrange import window_lagrange_step
from src.config.schema import DualSettings
from src.algorithms.loss_module import advantage_fn
from src.algorithms.losses import router_loss
from src.algorithms.schedules import linear_decay
from src.config.schema import RouterHeadConfig
from src.rollout.batch import RouterRollout
from src.router.head import RouterHead


class RouterPolicy(RouterHead):
    """``RouterHead`` (same parameters, same checkpoint keys) plus the loss it is trained with.

    loss = router_loss(logits, action, A(r_router grouped by uid), c_H(step), c_sup, weak label),
    A from the advantage registry (``router.adv_estimator``), c_H the linear entropy schedule.
    """

    def __init__(
        self, hidden_size: int, cfg: RouterHeadConfig, adv_eps: float = 1e-6, vocab_size: int | None = None
    ):
        super().__init__(
            hidden_size,
            cfg.mlp_hidden,
            cfg.pooling,
            tail_tokens=cfg.tail_tokens,
            vocab_size=vocab_size,
            base_embeddings=cfg.input == "base_embeddings",
        )
        self.cfg, self.adv_eps = cfg, adv_eps

    def entropy_coef(self, step: int) -> float:
        c = self.cfg
        return linear_decay(step, c.entropy_coef, c.entropy_coef_final, c.entropy_decay_steps)

    def advantages(self, rollout: RouterRollout, uids: Sequence) -> torch.Tensor:
        """[N] advantages of r_router, rows grouped by uid."""
        fn = advantage_fn(self.cfg.adv_estimator, self.cfg.norm_adv_by_std, self.adv_eps, {}, "router")
        return fn(rollout.reward, uids)

    def loss(
        self, prompt_logits: torch.Tensor, rollout: RouterRollout, uids: Sequence, step: int
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """prompt_logits [P, 3] (one row per prompt) -> (scalar loss, parts pg / entropy / ce)."""
        device = prompt_logits.device
        logits = prompt_logits[rollout.prompt_index.to(device)]
        return router_loss(
            logits,
            rollout.action.to(device),
            self.advantages(rollout, uids).to(device),
            self.entropy_coef(step),
            self.cfg.sup_coef,
            rollout.target.to(device),
        )


def lambda_window_step(
    lam: torch.Tensor,
    window: torch.Tensor,
    controller: torch.Tensor,
    step_totals: torch.Tensor,
    dual: DualSettings,
) -> dict[str, float]:
    """Add one step's [cost sum, reward sum, count] (over every rank) to ``window`` [4] (its last
    entry counts steps); every ``dual.lambda_every_k`` steps move ``lam`` by the controller
    (``window_lagrange_step``), whose memory ``controller`` [5] holds (integral, cost average, P, D,
    updates so far: the average exists from the first update on), and empty the window. Updates the
    three tensors in place; returns the scalars to log."""
    window[:3] += step_totals.to(window)
    window[3] += 1
    if int(window[3]) % max(int(dual.lambda_every_k), 1):
        return {}
    integral, cost_avg, p, d, updates = (float(v) for v in controller)
    cost_avg = cost_avg if updates else float("nan")  # DualState's "no average yet"
    state = DualState(lam=float(lam), integral=integral, cost_avg=cost_avg, p=p, d=d)
    new, scalars = window_lagrange_step(state, window[:3], dual)
    lam.fill_(new.lam)
    memory = [new.integral, new.cost_avg, new.p, new.d, updates + 1]
    controller.copy_(torch.tensor(memory, dtype=controller.dtype))
    window[:3] = 0
    return scalars


def initial_controller(lambda_init: float) -> torch.Tensor:
    """The controller's memory before any update: integral = λ_init, no cost average (0 updates).

    No NaN in a buffer: checkpoints and weight comparisons stay plain numbers."""
    return torch.tensor([float(lambda_init), 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
