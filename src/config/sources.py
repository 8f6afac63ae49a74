"""Schemas of the swappable sources: the ``data`` group (RLLA files, synthetic, env seeds) and the
``env`` group (off, local games, MLGym). Each option's yaml names its schema in its defaults list
and carries the ``_target_`` that Hydra ``instantiate`` builds it with."""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional


# ---------------------------------------------------------------------------- data
@dataclass
class SyntheticSpec:
    n_train: int = 512
    n_test: int = 64
    seed: int = 0
    p_search: float = 0.35
    p_calculate: float = 0.35
    p_answer: float = 0.30
    low_gain: float = 0.0  # share of tool rows whose request is vague (the call's values are guesses)


@dataclass
class RllaDataConfig:
    """RLLA-schema parquet: ``kind: files`` (the listed files) or ``synthetic`` (generated into the cache).
    ``train_files`` / ``val_files``: a list of paths (a single string is one file)."""

    _target_: str = "src.datamodules.prepare.rlla_datamodule"
    kind: str = "files"
    train_files: Any = field(default_factory=list)
    val_files: Any = field(default_factory=list)
    format: str = "xml"  # xml | harmony
    max_prompt_length: int = 2048
    shuffle: bool = True
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)


@dataclass
class SeedsDataConfig:
    """Environment seeds for multi-step episodes: each record is one GRPO group."""

    _target_: str = "src.datamodules.prepare.seeds_datamodule"
    kind: str = "seeds"
    n_seeds: int = 256
    seed: Optional[int] = None  # null = the job's seed
    shuffle: bool = True


# ---------------------------------------------------------------------------- env
@dataclass
class EnvOffConfig:
    enable: bool = False


@dataclass
class EpisodeEnvConfig:
    """The episode keys every environment shares; ``_target_`` builds one environment (per episode)
    from ``env_id`` and the environment's own keys. ``temperatures``: null (= sampling.temperature),
    a number, or a list cycled over the group."""

    enable: bool = True
    id: str = "local/battle_of_sexes"
    _target_: str = "src.envs.registry.make_env"
    token_budget: int = 1024
    turn_cap: int = 128
    temperatures: Any = None
    baseline: Optional[float] = None
    env_workers: int = 1
    step_format: str = "plain"  # plain | rlvcr
    templates: Dict[str, str] = field(default_factory=dict)


@dataclass
class LocalGameEnvConfig(EpisodeEnvConfig):
    """Docker-free MLGym-style games (``src.envs.local_game.LocalGameConfig`` fields)."""

    rounds: int = 10
    simulations: int = 1000
    max_steps: int = 16
    command_timeout_s: float = 10.0
    eval_timeout_s: float = 60.0
    max_output_chars: int = 600
    memory_mb: int = 4096
    file_size_mb: int = 64
    max_processes: int = 64
    workspace_mb: int = 256  # cap on an episode workspace's total bytes (reaching it: episode failed)
    workspace_root: Optional[str] = None
    confinement: str = "auto"  # auto | bwrap | unshare: the tool that confines agent commands


@dataclass
class MLGymEnvConfig(EpisodeEnvConfig):
    """The real MLGym task (``MLGymAdapter`` keyword arguments)."""

    task_config_path: Optional[str] = None
    max_steps: int = 50
    container_type: str = "docker"
    metric: str = "Score"
    env_args: Optional[Dict[str, Any]] = None
    make_kwargs: Optional[Dict[str, Any]] = None
