"""make_env ids and the MLGym adapter (real MLGym only when the package and a container runtime exist)."""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

from src.envs import EpisodeEnv, LocalGameEnv, make_env
from src.envs.mlgym_adapter import MLGymAdapter, extract_mlgym_score

HAVE_MLGYM = all(importlib.util.find_spec(name) is not None for name in ("mlgym", "gymnasium"))
HAVE_DOCKER = shutil.which("docker") is not None


@pytest.mark.parametrize(
    ("env_id", "game"),
    [
        ("local/battle_of_sexes", "battle_of_sexes"),
        ("local/battleOfSexes", "battle_of_sexes"),
        ("local/prisoners_dilemma", "prisoners_dilemma"),
        ("local/prisonersDilemma", "prisoners_dilemma"),
    ],
)
def test_make_local_env(env_id, game):
    env = make_env(env_id, rounds=5, max_steps=4)
    assert isinstance(env, LocalGameEnv) and isinstance(env, EpisodeEnv)
    assert env.game.name == game and env.config.rounds == 5 and env.config.max_steps == 4


@pytest.mark.parametrize("env_id", ["battle_of_sexes", "gym/battle_of_sexes", "local/", ""])
def test_bad_ids(env_id):
    with pytest.raises(ValueError, match="must look like"):
        make_env(env_id)


def test_unknown_local_game_and_kwarg():
    with pytest.raises(KeyError, match="unknown game"):
        make_env("local/chess")
    with pytest.raises(TypeError, match="nonsense"):
        make_env("local/battle_of_sexes", nonsense=1)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([{"Score": 1.43}], 1.43),
        ([{"Score": 1.0}, {"Score": 1.5}], 1.5),
        ([{"accuracy": 0.7, "name": "x"}], 0.7),
        ({"Score": 2}, 2.0),
        (3, 3.0),
        ([], None),
        (None, None),
        ([{"note": "no numbers"}], None),
    ],
)
def test_extract_mlgym_score(raw, expected):
    assert extract_mlgym_score(raw) == expected


@pytest.mark.skipif(HAVE_MLGYM, reason="MLGym is installed; the missing-package error cannot be shown")
def test_adapter_without_mlgym_raises_clear_import_error():
    with pytest.raises(ImportError, match="needs the `mlgym` package"):
        MLGymAdapter("battleOfSexes")
    with pytest.raises(ImportError, match="mlgym"):
        make_env("mlgym/battleOfSexes")


@pytest.mark.slow
@pytest.mark.skipif(not (HAVE_MLGYM and HAVE_DOCKER), reason="needs mlgym, gymnasium and docker")
def test_real_mlgym_battle_of_sexes():  # pragma: no cover - needs containers
    home = os.getcwd()
    env = make_env("mlgym/battleOfSexes", max_steps=5)
    try:
        for seed in (0, 1):  # a second reset must work from the original directory
            obs, info = env.reset(seed)
            assert isinstance(obs, str) and "Battle" in env.task_prompt
            obs, reward, done, info = env.step("validate")
            assert not done
        obs, reward, done, info = env.step("submit")
        assert done and info["score"] == pytest.approx(1.02, abs=0.1) and reward == info["score"]
    finally:
        env.close()
    assert os.getcwd() == home
