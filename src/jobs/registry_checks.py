"""The config's names checked against the registries that define them (``validate_job`` adds these).

``src/config`` keeps no list of its own of what a registry knows: a researcher's own advantage,
policy loss, KL estimator, aggregation mode, λ controller or strategy, once registered, passes.
"""

from __future__ import annotations

from omegaconf import DictConfig

from src.algorithms.advantages import ADVANTAGES
from src.algorithms.aggregation import LOSS_AGG
from src.algorithms.dual_update import DUAL_UPDATES
from src.algorithms.loss_module import OLD_LOG_PROB_SOURCES
from src.algorithms.losses import KL_ESTIMATORS
from src.algorithms.policy_losses import POLICY_LOSSES
from src.algorithms.rlvcr_steps import QUALIFY_MODES
from src.config.checks import one_of
from src.jobs.strategies import strategy_names


def registry_problems(cfg: DictConfig) -> list[str]:
    a = cfg.algorithm
    problems = one_of("algorithm.adv_estimator", a.adv_estimator, ADVANTAGES.names())
    problems += one_of("algorithm.policy_loss", a.policy_loss, POLICY_LOSSES.names())
    problems += one_of("algorithm.kl_estimator", a.kl_estimator, KL_ESTIMATORS.names())
    problems += one_of("algorithm.loss_agg_mode", a.loss_agg_mode, LOSS_AGG.names())
    problems += one_of("algorithm.old_log_prob_source", a.old_log_prob_source, OLD_LOG_PROB_SOURCES)
    if a.adv_estimator == "rlvcr":
        problems += one_of("algorithm.rlvcr_qualify", a.rlvcr_qualify, QUALIFY_MODES)
    if cfg.router.enable:
        problems += one_of("router.lambda_update", cfg.router.lambda_update, DUAL_UPDATES)
    if cfg.env.enable:
        from src.rollout.episodes.factory import STEP_FORMATS

        problems += one_of("env.step_format", cfg.env.step_format, STEP_FORMATS)
    strategy = cfg.trainer.strategy
    if isinstance(strategy, str):  # a node with its own ``_target_`` is the researcher's
        problems += one_of("trainer.strategy", strategy, strategy_names(cfg))
    return problems
