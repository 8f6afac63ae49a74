"""``validate_job(cfg)``: ``validate`` plus what only the component registries know.

``src/config`` is the bottom layer and imports no component, so the checks that ask a registry
live here, and the config keeps no list of its own of what a registry knows: a researcher's own
advantage, policy loss, KL estimator, aggregation mode, λ controller, router advantage, router
supervised term or strategy, once registered, passes. Every registered advantage estimator
compares a response with its group (the registry's ``fn(rewards, index)`` contract gives a group of
one advantage 0), and the budget must be reachable under the configured tool cost
(``src/router/usage.py:max_cost``).
"""

from __future__ import annotations

import math
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from src.algorithms.lagrange import DUAL_UPDATES, ROUTER_ADVANTAGES
from src.algorithms.loss_module import ADVANTAGES, OLD_LOG_PROB_SOURCES
from src.algorithms.losses import KL_ESTIMATORS, LOSS_AGG, POLICY_LOSSES, SUPERVISED_TERMS
from src.algorithms.rlvcr import QUALIFY_MODES
from src.config.validate import ConfigError, in_range, one_of, unknown_keys, validate
from src.jobs.strategies import strategy_names
from src.router.usage import max_cost


def component_problems(cfg: DictConfig) -> list[str]:
    problems = []
    a, n = cfg.algorithm, cfg.sampling.n_generations_per_prompt
    if a.adv_estimator in ADVANTAGES.names() and n < 2:
        problems.append(
            f"sampling.n_generations_per_prompt={n}: algorithm.adv_estimator={a.adv_estimator} "
            "compares responses within a group, which needs >= 2"
        )
    r = cfg.router
    if r.enable:
        try:
            top = max_cost(r.cost, dict(r.cost_weights))
        except ValueError as err:
            return [*problems, f"router.cost / router.cost_weights: {err}"]
        if top < math.inf and r.budget > top:  # the lower bound is src/config/validate.py's
            problems += in_range("router.budget", r.budget, 0.0, top)
    return problems


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
        problems += one_of("router.advantage", cfg.router.advantage, ROUTER_ADVANTAGES)
        problems += one_of("router.sup_term", cfg.router.sup_term, SUPERVISED_TERMS.names())
    if cfg.env.enable:
        from src.rollout.factory import STEP_FORMATS

        problems += one_of("env.step_format", cfg.env.step_format, STEP_FORMATS)
    strategy = cfg.trainer.strategy
    if isinstance(strategy, str):  # a node with its own ``_target_`` is the researcher's
        problems += one_of("trainer.strategy", strategy, strategy_names(cfg))
    return problems


def target_problems(node: Any, key: str = "") -> list[str]:
    """Every ``_target_`` of the config (a component's default or a researcher's own) must import:
    a typo is one line naming its key before anything is written, not an instantiation traceback
    from inside the job once the run directory exists. ``node``: the job config or a part of it."""
    # what ``instantiate`` itself resolves a target with (hydra.utils.get_object would also log it)
    from hydra._internal.utils import _locate

    if isinstance(node, (DictConfig, ListConfig)):
        node = OmegaConf.to_container(node, resolve=False)
    problems = []
    if isinstance(node, dict):
        target = node.get("_target_")
        if isinstance(target, str):
            try:
                _locate(target)
            except Exception as err:  # noqa: BLE001 - ImportError / AttributeError, said on one line
                cause = " ".join(str(err.__cause__ or err).split())
                problems.append(f"{key}._target_={target}: cannot be imported ({cause})")
        for child, value in node.items():
            problems += target_problems(value, f"{key}.{child}" if key else str(child))
    elif isinstance(node, list):
        for i, item in enumerate(node):
            problems += target_problems(item, f"{key}[{i}]")
    return problems


def validate_job(cfg: DictConfig) -> None:
    """Raise one ``ConfigError`` listing every problem of ``validate`` and of the components."""
    unknown = unknown_keys(cfg)
    if unknown:  # every other check assumes the schema's keys
        raise ConfigError(unknown)
    problems: list[str] = []
    try:
        validate(cfg)
    except ConfigError as err:
        problems = list(err.problems)
    problems += component_problems(cfg) + registry_problems(cfg) + target_problems(cfg)
    if problems:
        raise ConfigError(problems)
