"""``validate_job(cfg)``: ``validate`` plus what only the component registries know.

``src/config`` is the bottom layer and imports no component, so the checks that ask a registry
live here: every registered advantage estimator compares a response with its group (the
registry's ``fn(rewards, index)`` contract gives a group of one advantage 0), and the budget must
be reachable under the configured tool cost (``src/router/cost.py:max_cost``).
"""

from __future__ import annotations

import math

from omegaconf import DictConfig

from src.algorithms.advantages import ADVANTAGES
from src.config.checks import in_range, unknown_keys
from src.config.errors import ConfigError
from src.config.validate import validate
from src.jobs.registry_checks import registry_problems
from src.router.cost import max_cost


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
        if top < math.inf:
            problems += in_range("router.budget", r.budget, 0.0, top)
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
    problems += component_problems(cfg) + registry_problems(cfg)
    if problems:
        raise ConfigError(problems)
