"""The root job config (seed 003's ``RLJobConfig``), the schemas of its swappable sources, of seed
003's lessons/curriculum and of the replay buffer (``TrainParams``), their registration with
Hydra's ConfigStore, and ``compose_job``.

``configs/train.yaml`` lists ``job_schema`` first in its defaults, so every group yaml, experiment
file and command-line override is merged onto these typed nodes: an unknown key or a value of the
wrong type fails at composition, naming the key. ``data`` and ``env`` hold one of several schemas,
picked by the option's own defaults list: the ``data`` group (RLLA files, synthetic, env seeds) and
the ``env`` group (off, local games, MLGym). Each option's yaml names its schema and carries the
``_target_`` that Hydra ``instantiate`` builds it with. ``compose_job`` composes the job config
outside ``scripts/train.py`` (tests, notebooks), the schemas registered first.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from omegaconf import MISSING, DictConfig, OmegaConf

from src.config.sampling import SamplingConfig, SamplingOverride
from src.config.schema import (
    AlgorithmGroupConfig,
    ModelConfig,
    RewardConfig,
    RolloutConfig,
    RouterConfig,
    SftConfig,
    TrainerConfig,
)

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


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
    # > 0: also a calibration split of that many prompts (the test split's held-out templates, prompt
    # texts disjoint from train and test): a budget's routing threshold is set on it, never on test
    n_calib: int = 0


@dataclass
class RllaDataConfig:
    """RLLA-schema parquet: ``kind: files`` (the listed files) or ``synthetic`` (generated into the cache).
    ``train_files`` / ``val_files``: a list of paths (a single string is one file)."""

    _target_: str = "src.datamodules.prepare.rlla_datamodule"
    kind: str = "files"
    train_files: Any = field(default_factory=list)
    val_files: Any = field(default_factory=list)
    calib_files: Any = field(default_factory=list)  # the budget threshold's prompts (synthetic: n_calib)
    format: str = "xml"  # xml | harmony
    max_prompt_length: int = 2048
    shuffle: bool = True
    synthetic: SyntheticSpec = field(default_factory=SyntheticSpec)


def file_list(value: Any) -> list[str]:
    """A file-list value as a list of paths: a single string is ONE file, not its characters."""
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if OmegaConf.is_list(value) or isinstance(value, (list, tuple)):
        return [str(v) for v in value]
    raise TypeError(f"expected a list of paths or one path, got {type(value).__name__}: {value!r}")


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
    _target_: str = "src.envs.make_env"
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


# ---------------------------------------------------------------------------- curriculum / replay
@dataclass
class LessonDependencyConfig:
    dependency_id: str = ""
    reward_threshold: float = 0.0  # the dependency's eval reward that unlocks this lesson


@dataclass
class LessonConfig:
    """A data source plus its progression rules.

    ``source``: ``synthetic`` (the single-call synthetic mix, ``p_*`` proportions),
    ``synthetic_multi`` (two-call rows) or ``files`` (any RLLA-schema parquet: ``train_files`` and
    ``eval_files``). Eval rewards are measured on the lesson's eval rows with the eval sampling.
    """

    source: str = "synthetic"
    train_files: List[str] = field(default_factory=list)
    eval_files: List[str] = field(default_factory=list)
    n_train: int = 256
    n_eval: int = 32
    seed: int = 0
    p_search: float = 0.35
    p_calculate: float = 0.35
    p_answer: float = 0.30
    dependencies: List[LessonDependencyConfig] = field(default_factory=list)
    start_threshold: float = float("-inf")
    stop_threshold: float = float("inf")
    plateau_window: int = 50
    plateau_threshold: float = 0.01
    weight: float = 1.0
    sampling: Optional[SamplingOverride] = None  # per-lesson override of the global sampling


@dataclass
class CurriculumConfig:
    enable: bool = False
    eval_frequency: int = 10  # steps between lesson evaluations (and at step 0)
    eval_prompts: int = 8  # eval prompts per lesson per evaluation
    min_share: float = 0.1  # floor of an active lesson's weight relative to its base weight
    lessons: Dict[str, LessonConfig] = field(default_factory=dict)


@dataclass
class ReplayConfig:
    """The replay buffer, built by Hydra ``instantiate`` from ``_target_`` with these keys (plus the
    tokenizer's pad id and the run's seed). capacity 0 = on-policy (no buffer). ``alpha``: recency
    bias of the draw, (1 + age)^-alpha."""

    _target_: str = "src.replay.buffer.ReplayBuffer"
    capacity: int = 0  # groups held
    alpha: float = 3.0
    max_samples_per_rollout: int = 1  # times a group may be trained on
    max_batch_latency: int = 0  # policy versions a group may lag the trainer


# ---------------------------------------------------------------------------- the job
@dataclass
class JobConfig:
    """Everything one run needs. ``task``: rl | sft. ``run_dir`` holds checkpoints and logs;
    ``resume: true`` continues from its latest checkpoint. ``cache_dir`` holds generated artefacts."""

    task: str = "rl"
    name: Optional[str] = None  # the experiment's name (run_dir uses it)
    seed: int = 0
    cache_dir: str = MISSING
    run_dir: str = MISSING
    resume: bool = False
    model: ModelConfig = field(default_factory=ModelConfig)
    data: Any = MISSING  # RllaDataConfig | SeedsDataConfig
    algorithm: AlgorithmGroupConfig = field(default_factory=AlgorithmGroupConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    router: RouterConfig = field(default_factory=RouterConfig)
    env: Any = MISSING  # EnvOffConfig | LocalGameEnvConfig | MLGymEnvConfig
    reward: RewardConfig = field(default_factory=RewardConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    # the RL fit's Lightning callbacks, each from its ``_target_``, in order (configs/train.yaml)
    callbacks: Dict[str, Any] = field(default_factory=dict)
    sft_callbacks: Dict[str, Any] = field(default_factory=dict)  # the SFT fit's, the same way


# (group, option name) -> schema; group options name theirs in their defaults lists
_GROUP_SCHEMAS = {
    ("data", "schema_rlla"): RllaDataConfig,
    ("data", "schema_seeds"): SeedsDataConfig,
    ("env", "schema_off"): EnvOffConfig,
    ("env", "schema_local"): LocalGameEnvConfig,
    ("env", "schema_mlgym"): MLGymEnvConfig,
}


def register_configs() -> None:
    """Store the root and the per-option schemas in Hydra's ConfigStore (idempotent)."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    cs.store(name="job_schema", node=JobConfig)
    for (group, name), node in _GROUP_SCHEMAS.items():
        cs.store(group=group, name=name, node=node)


def compose_job(overrides: Sequence[str] = (), config_dir: Path | str = CONFIG_DIR) -> DictConfig:
    """``configs/train.yaml`` with ``overrides``, typed by the schemas (unknown keys raise).

    ``hydra:`` interpolations (``runtime.cwd``) resolve because the config is composed with
    ``return_hydra_config``; Hydra's own node is dropped from the result."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # keeps its own copy of the hydra node
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.resolve(cfg)
    return cfg
