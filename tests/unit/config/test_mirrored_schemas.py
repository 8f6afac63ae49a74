"""Settings are declared once: the components take the config schema's own dataclasses.

``RewardConfig`` and ``TinyModelSpec`` live in ``src.config.schema`` (the ``reward`` and
``model.tiny`` nodes); the rewards and the tiny model import them instead of restating them.
"""

from __future__ import annotations

import typing

from src.config import schema
from src.config.job import JobConfig
from src.models import tiny
from src.rewards import gpt_oss, rlla


def test_components_take_the_schema_dataclasses():
    assert rlla.RewardConfig is gpt_oss.RewardConfig is schema.RewardConfig
    assert tiny.TinyModelSpec is schema.TinyModelSpec
    assert typing.get_type_hints(JobConfig)["reward"] is schema.RewardConfig
    assert typing.get_type_hints(schema.ModelConfig)["tiny"] is schema.TinyModelSpec
