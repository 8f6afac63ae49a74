"""The RL math, pure torch: advantages, policy losses, aggregation, KL, the λ update, RLVCR.

Registries pick math by name from the ``algorithm`` config:

* ``get_advantage_fn(name)`` -> ``fn(rewards: Tensor[N], index: Sequence[int], **params) -> Tensor[N]``
  (index = group id of each row; groups of one get advantage 0). Built in: ``grpo``, ``dr_grpo``,
  ``rloo``, ``reinforce_pp``.
* The second, per-step contract (``rlvcr``): ``fn(traj_rewards [E], traj_groups [E],
  steps: StepLevels (step_episode [S], level_scores [S, 4], level_costs [S, 4], orig_level [S],
  qualifies [S]), params: RlvcrParams) -> RlvcrAdvantages`` (per-step and per-trajectory advantages), computed on the rollout side (``rollout/rlvcr/augment.py``) with ``rlvcr.py`` (qualify, format penalty,
  scatter onto tokens); it reaches the module as ``RolloutBatch.token_advantages`` [N, T]
  (``models/module.py:ROLLOUT_SIDE_ESTIMATORS``) and composes with any policy loss.
* The Lagrangian reward and λ: ``lagrange.py`` (``lagrangian_reward``, the controllers
  ``DUAL_UPDATES``, λ's state ``LagrangeMultiplier`` and its update ``lambda_window_step``), and the
  router's advantages ``ROUTER_ADVANTAGES`` (``router.advantage``: ``scalarized_reward``,
  ``scalarized_advantage``).
* ``get_policy_loss_fn(name)`` -> ``fn(log_probs, old_log_probs, advantages, mask, **params)
  -> PolicyLossOutput(loss, clipped, ratio)``, all [B, T]. Built in: ``ppo_clip`` (dual clip,
  log-ratio clamp), ``gspo``.
* aggregation modes (``losses.py``): ``token-mean``, ``seq-mean-token-sum``,
  ``seq-mean-token-mean``, ``seq-mean-token-sum-norm``.

A *loss module* (``loss_module.LossModule``) is one estimator + one policy loss + one aggregation
mode + their params, built from ``configs/algorithm/<name>.yaml`` and selected with
``algorithm=<name>``; the LightningModule calls only its methods. Token advantages from the rollout
(RLVCR) replace the estimator's, and the router loss is added, whatever the loss module.

Adding one (literally one file and one yaml):

1. ``src/algorithms/my_adv.py``::

       from src.algorithms import register_advantage

       @register_advantage("my_adv")
       def my_adv(rewards, index, temperature: float = 1.0):
           \"\"\"rewards [N], index [N] -> [N].\"\"\"
           ...

   Every module of this package is imported when ``src.algorithms`` is, so the decorator runs
   without any other edit. A policy loss is the same with ``register_policy_loss``.
2. ``configs/algorithm/my_adv.yaml``::

       defaults: [grpo, _self_]
       adv_estimator: my_adv
       adv_params: {temperature: 0.5}   # params of your function (unknown ones fail at start-up)

   then ``python scripts/train.py experiment=grpo algorithm=my_adv``. The shared keys
   (``norm_adv_by_std`` -> ``norm_by_std``, ``adv_eps`` -> ``eps``, ``clip_ratio_low/high`` ->
   ``clip_low/high``, ``clip_ratio_c``, ``log_ratio_clamp``, and all four as one ``PPOClip`` named
   ``clip``) reach any function that takes them.
"""

from __future__ import annotations

import importlib
import pkgutil

from src.algorithms.loss_module import (
    ADVANTAGES,
    LossModule,
    build_loss_module,
    group_ids,
    register_advantage,
)
from src.algorithms.losses import (
    LOSS_AGG,
    POLICY_LOSSES,
    PolicyLossOutput,
    aggregate,
    normaliser,
    register_aggregation,
    register_policy_loss,
)

__all__ = [
    "LOSS_AGG",
    "LossModule",
    "PolicyLossOutput",
    "aggregate",
    "build_loss_module",
    "get_advantage_fn",
    "get_policy_loss_fn",
    "group_ids",
    "normaliser",
    "register_advantage",
    "register_aggregation",
    "register_policy_loss",
]

get_advantage_fn = ADVANTAGES.get
get_policy_loss_fn = POLICY_LOSSES.get

# Import every module of the package so a new file's @register_* decorators run.
for _info in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_info.name}")
