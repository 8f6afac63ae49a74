"""The root job config (seed 003's ``RLJobConfig``) and its registration with Hydra's ConfigStore.

``configs/train.yaml`` lists ``job_schema`` first in its defaults, so every group yaml, experiment
file and command-line override is merged onto these typed nodes: an unknown key or a value of the
wrong type fails at composition, naming the key. ``data`` and ``env`` hold one of several schemas
(``src.config.sources``), picked by the option's own defaults list.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, Optional

from omegaconf import MISSING

from src.config.curriculum import CurriculumConfig, ReplayConfig
from src.config.groups import (
    AlgorithmGroupConfig,
    ModelConfig,
    RewardGroupConfig,
    RolloutConfig,
    RouterConfig,
    SftConfig,
    TrainerConfig,
)
from src.config.sampling import SamplingConfig
from src.config.sources import (
    EnvOffConfig,
    LocalGameEnvConfig,
    MLGymEnvConfig,
    RllaDataConfig,
    SeedsDataConfig,
)


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
    reward: RewardGroupConfig = field(default_factory=RewardGroupConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    sft: SftConfig = field(default_factory=SftConfig)
    replay: ReplayConfig = field(default_factory=ReplayConfig)
    curriculum: CurriculumConfig = field(default_factory=CurriculumConfig)
    # extra Lightning callbacks by name, each built from its ``_target_`` (e.g. fault injection in tests)
    callbacks: Dict[str, Any] = field(default_factory=dict)


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
