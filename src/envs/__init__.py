"""Multi-step text environments: the ``EpisodeEnv`` protocol, local MLGym-style games, real MLGym.

``make_env(env_id, **kwargs)`` builds an ``EpisodeEnv`` from an id:

* ``local/<game>``: ``LocalGameEnv`` for ``battle_of_sexes`` or ``prisoners_dilemma`` (MLGym's
  spellings ``battleOfSexes`` / ``prisonersDilemma`` work too); kwargs are ``LocalGameConfig`` fields.
* ``mlgym/<task>``: ``MLGymAdapter`` for the real MLGym task; kwargs go to its constructor.
"""

from __future__ import annotations

from typing import Any

from src.envs.base import EpisodeEnv
from src.envs.local_game import LocalGameConfig, LocalGameEnv

__all__ = ["EpisodeEnv", "LocalGameConfig", "LocalGameEnv", "make_env"]

_PREFIXES = ("local", "mlgym")


def make_env(env_id: str, **kwargs: Any) -> EpisodeEnv:
    """Build the environment named ``env_id`` (``<backend>/<task>``); bad ids raise ValueError/KeyError."""
    backend, sep, task = env_id.partition("/")
    if not sep or not task or backend not in _PREFIXES:
        raise ValueError(f"env id {env_id!r} must look like 'local/<game>' or 'mlgym/<task>'")
    if backend == "local":
        return LocalGameEnv(LocalGameConfig(game=task, **kwargs))
    from src.envs.mlgym_adapter import MLGymAdapter  # lazy: MLGym is optional

    return MLGymAdapter(task, **kwargs)
