"""Multi-step text environments: the ``EpisodeEnv`` protocol, local MLGym-style games, real MLGym."""

from src.envs.base import EpisodeEnv
from src.envs.local_game import LocalGameConfig, LocalGameEnv
from src.envs.registry import make_env

__all__ = ["EpisodeEnv", "LocalGameConfig", "LocalGameEnv", "make_env"]
