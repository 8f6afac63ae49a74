"""Lesson dependencies: unknown ids and cycles are refused, naming them."""

from __future__ import annotations

import pytest

from src.config.validate import ConfigError, validate_lessons


def test_a_dag_passes():
    validate_lessons(
        {
            "easy": {"dependencies": []},
            "medium": {"dependencies": [{"dependency_id": "easy", "reward_threshold": 0.5}]},
            "hard": {"dependencies": ["easy", "medium"]},
        }
    )
    validate_lessons({})


def test_unknown_ids_are_named():
    with pytest.raises(ConfigError) as err:
        validate_lessons({"a": {"dependencies": ["ghost"]}, "b": {"dependencies": ["a", "phantom"]}})
    text = "\n".join(err.value.problems)
    assert "curriculum.lessons.a.dependencies" in text and "'ghost'" in text and "'phantom'" in text


@pytest.mark.parametrize(
    "lessons, cycle",
    [
        ({"a": {"dependencies": ["a"]}}, "a -> a"),
        ({"a": {"dependencies": ["b"]}, "b": {"dependencies": ["a"]}}, "a -> b -> a"),
        (
            {
                "x": {},
                "a": {"dependencies": ["c"]},
                "b": {"dependencies": ["a"]},
                "c": {"dependencies": ["b", "x"]},
            },
            "a -> c -> b -> a",
        ),
    ],
)
def test_cycles_are_named(lessons, cycle):
    with pytest.raises(ConfigError, match="dependency cycle") as err:
        validate_lessons(lessons)
    assert cycle in err.value.problems[0]
