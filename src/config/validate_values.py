"""Value checks that need no knowledge of one component: every number finite (walking the whole
config, so a new float key is covered without being listed), the episode environment's limits and
confinement, the synthetic data's proportions, and the model directory's ``config.json``.

Each check returns ``"<key>: <problem>"`` lines; ``validate`` runs them before anything is written.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from src.config.checks import one_of, positive

# keys of the episode environments' own limits: each must be > 0 where the environment has it
ENV_POSITIVE = (
    "rounds",
    "simulations",
    "max_steps",
    "command_timeout_s",
    "eval_timeout_s",
    "max_output_chars",
    "memory_mb",
    "file_size_mb",
    "max_processes",
    "workspace_mb",
)
CONFINEMENTS = ("auto", "bwrap", "unshare")


def value_problems(cfg: DictConfig) -> list[str]:
    """Every problem found by the checks of this module."""
    return non_finite(cfg) + env_limits(cfg) + synthetic_proportions(cfg) + model_config(cfg) + threads(cfg)


def threads(cfg: DictConfig) -> list[str]:
    t = cfg.trainer.get("threads")
    return [] if t is None else positive({"trainer.threads": t})


def _schema_default(node: Any, key: Any) -> Any:
    """The default the node's structured schema gives ``key`` (None when untyped or no default)."""
    schema = OmegaConf.get_type(node) if isinstance(node, DictConfig) else None
    if not dataclasses.is_dataclass(schema):
        return None
    field = {f.name: f for f in dataclasses.fields(schema)}.get(str(key))
    return None if field is None or field.default is dataclasses.MISSING else field.default


def _leaves(node: Any, prefix: str):
    """(key, value, schema default) of every leaf under ``node``; unresolvable interpolations skipped."""
    keys = range(len(node)) if isinstance(node, ListConfig) else list(node.keys())
    for key in keys:
        full = f"{prefix}[{key}]" if isinstance(node, ListConfig) else f"{prefix}{'.' if prefix else ''}{key}"
        try:
            value = node[key]
        except Exception:  # noqa: BLE001 - e.g. ${hydra:...} outside a Hydra run: not a number
            continue
        if isinstance(value, (DictConfig, ListConfig)):
            yield from _leaves(value, full)
        else:
            yield full, value, _schema_default(node, key)


def non_finite(cfg: DictConfig) -> list[str]:
    """Every float anywhere in ``cfg`` must be finite (inf / nan pass most range checks silently).

    A key whose schema default is itself infinite (a threshold meaning "never") may be +-inf; nan
    never passes.
    """
    problems = []
    for key, value, default in _leaves(cfg, ""):
        if not isinstance(value, float) or math.isfinite(value):
            continue
        unbounded = isinstance(default, float) and math.isinf(default)
        if math.isnan(value) or not unbounded:
            problems.append(f"{key}: must be a finite number, got {value!r}")
    return problems


def env_limits(cfg: DictConfig) -> list[str]:
    """An enabled episode environment's limits are > 0 and its confinement is a known tool."""
    e = cfg.get("env")
    if e is None or not e.get("enable", False):
        return []
    present = {f"env.{k}": e[k] for k in ENV_POSITIVE if k in e and e[k] is not None}
    problems = positive(present)
    if "confinement" in e:
        problems += one_of("env.confinement", e.confinement, CONFINEMENTS)
    return problems


def synthetic_proportions(cfg: DictConfig) -> list[str]:
    d = cfg.get("data")
    if d is None or d.get("kind") != "synthetic":
        return []
    s = d.synthetic
    probs = {k: s[k] for k in ("p_search", "p_calculate", "p_answer")}
    numbers = [v for v in probs.values() if isinstance(v, (int, float)) and math.isfinite(v)]
    if len(numbers) == len(probs) and sum(numbers) <= 0:
        keys = ", ".join(f"data.synthetic.{k}" for k in probs)
        return [f"{keys}: all zero; at least one kind of row must have a positive proportion"]
    return []


def model_config(cfg: DictConfig) -> list[str]:
    """A model directory's ``config.json`` must be a JSON object (the problem names the file)."""
    path = cfg.model.path
    if path in (None, "", "tiny"):
        return []
    config = Path(str(path)).expanduser() / "config.json"
    if not config.is_file():
        return []  # the lengths check names a missing config.json
    try:
        parsed = json.loads(config.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return [f"model.path: {config} is not valid JSON ({err})"]
    if not isinstance(parsed, dict):
        return [f"model.path: {config} holds {type(parsed).__name__}, not a JSON object"]
    return []
