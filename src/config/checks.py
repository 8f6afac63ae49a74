"""Small checks the validator composes: each returns ``"<key>: <problem>"`` lines (empty = fine)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from typing import Any

from omegaconf import DictConfig, OmegaConf


def unknown_keys(node: Any, prefix: str = "") -> list[str]:
    """Keys a typed node's schema does not declare (``+key=`` overrides slip past composition)."""
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return []
    schema = OmegaConf.get_type(node)
    declared = {f.name for f in dataclasses.fields(schema)} if dataclasses.is_dataclass(schema) else None
    problems = []
    for key in node:
        full = f"{prefix}{key}"
        if declared is not None and key not in declared:
            problems.append(f"{full}: unknown key (not in {schema.__name__}: {sorted(declared)})")
            continue
        problems += unknown_keys(node._get_node(key), f"{full}.")
    return problems


def positive(values: dict[str, Any], strict: bool = True) -> list[str]:
    """Each ``key -> number`` must be > 0 (``strict``) or >= 0."""
    bad = []
    for key, v in values.items():
        if v is None or not isinstance(v, (int, float)) or math.isnan(v) or (v <= 0 if strict else v < 0):
            bad.append(f"{key}: must be {'> 0' if strict else '>= 0'}, got {v!r}")
    return bad


def in_range(key: str, v: Any, low: float, high: float, low_open: bool = False, high_open: bool = False):
    """``key``'s value in [low, high] (ends open when asked)."""
    ok = isinstance(v, (int, float)) and not math.isnan(v)
    ok = ok and (v > low if low_open else v >= low) and (v < high if high_open else v <= high)
    if ok:
        return []
    lo, hi = "(" if low_open else "[", ")" if high_open else "]"
    return [f"{key}: must be in {lo}{low}, {high}{hi}, got {v!r}"]


def one_of(key: str, v: Any, choices: Iterable[Any]) -> list[str]:
    choices = list(choices)
    return [] if v in choices else [f"{key}: {v!r} is not one of {choices}"]


def file_list(value: Any) -> list[str]:
    """A file-list value as a list of paths: a single string is ONE file, not its characters."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise TypeError(f"expected a list of paths or one path, got {type(value).__name__}: {value!r}")
