"""The config groups that mirror a frozen domain dataclass keep its fields and defaults.

Hydra needs mutable schema dataclasses, so ``RewardGroupConfig`` and ``TinySpecConfig`` restate
``RewardConfig`` and ``TinyModelSpec``; a field added to one side only would be silently defaulted.
"""

from __future__ import annotations

from dataclasses import MISSING, fields

import pytest

from src.config.groups import RewardGroupConfig, TinySpecConfig
from src.models.tiny import TinyModelSpec
from src.rewards.types import RewardConfig


def defaults(cls) -> dict:
    return {f.name: (f.default if f.default is not MISSING else f.default_factory()) for f in fields(cls)}


@pytest.mark.parametrize(
    ("schema", "domain"), [(RewardGroupConfig, RewardConfig), (TinySpecConfig, TinyModelSpec)]
)
def test_schema_mirrors_the_domain_dataclass(schema, domain):
    assert defaults(schema) == defaults(domain)
