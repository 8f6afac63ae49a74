"""Schemas of the job's fixed-shape groups: model, algorithm (+optim), rollout, router, reward, trainer, sft.

Each is the structured config of its group in ``configs/<group>/*.yaml``: a key a schema does not
declare, or a value of the wrong type, fails when the config is composed, naming the key.
"""

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from src.config.dynamic_sampling import DynamicSamplingConfig
from src.config.schema import AlgorithmConfig, DualSettings, OptimConfig, RouterHeadConfig


# ---------------------------------------------------------------------------- model
@dataclass
class TinySpecConfig:
    """The embedded default's shape (mirrors ``src.models.tiny.TinyModelSpec``)."""

    vocab_size: int = 4096
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    seed: int = 0
    corpus_rows: int = 2000


@dataclass
class LoraConfig:
    """Mirrors ``src.models.loading.LoraSettings``."""

    enable: bool = False
    r: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: List[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"])


@dataclass
class ModelConfig:
    path: str = "tiny"  # "tiny" (the embedded default) or a local Hugging Face model directory
    dtype: str = "float32"
    gradient_checkpointing: bool = False
    warm_start: Optional[str] = None  # null | sft | rlvcr_sft
    tiny: TinySpecConfig = field(default_factory=TinySpecConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)


# ---------------------------------------------------------------------------- algorithm
@dataclass
class AlgorithmGroupConfig(AlgorithmConfig):
    """The ``algorithm`` group: the loss settings (RLVCR's included) and their optimizer."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)


# ---------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    """``engine`` names one of ``engines``; each engine node is built with Hydra ``instantiate``
    (its ``_target_`` plus the module, tokenizer, model path and ``micro_batch_size``)."""

    engine: str = "hf"
    micro_batch_size: int = 64  # prompts x samples per generate call (HF engine)
    engines: Dict[str, Any] = field(default_factory=dict)
    workers: int = 0  # > 0: that many Ray rollout workers feed the replay buffer asynchronously
    weight_sync_every: int = 1  # steps between weight pushes to the workers
    ray_address: Optional[str] = None  # join a running Ray cluster; None starts a local one


# ---------------------------------------------------------------------------- router
@dataclass
class RouterConfig(RouterHeadConfig, DualSettings):
    """The ``router`` group: the head (``RouterHeadConfig``), route sampling, cost and the budget's λ
    (``DualSettings``: the module takes this config as its λ settings, nothing copied)."""

    sample: bool = True
    prompt_mode: str = "emphasis"  # emphasis | only_family
    actor_reward: str = "task"  # task | router
    cost: str = "any_tool"  # any_tool | per_family | per_call
    cost_weights: Dict[str, float] = field(default_factory=dict)
    families_sidecar: Optional[str] = None


# ---------------------------------------------------------------------------- reward
@dataclass
class RewardGroupConfig:
    """ToolRL reward variants (mirrors ``src.rewards.types.RewardConfig``; all off = the default reward)."""

    with_length: bool = False
    schedule_length: bool = False
    correct_max1: bool = False
    max1_step30_max3: bool = False
    schedule_reward: bool = False
    refined: bool = False
    coarse: bool = False
    intermediate: bool = False


# ---------------------------------------------------------------------------- trainer / sft
@dataclass
class TrainerConfig:
    max_steps: int = 20
    save_freq: int = 10  # checkpoint every N global steps (and on exception / Ctrl-C)
    accelerator: str = "cpu"
    devices: int = 1
    num_nodes: int = 1
    strategy: str = "auto"  # a key of ``strategies``, or a name Lightning knows (auto, ddp_spawn, ...)
    # name -> a node built with Hydra ``instantiate`` (``_target_`` plus grad_clip and world);
    # ddp | fsdp | deepspeed_stage_2 | deepspeed_stage_3 in configs/train.yaml (src/jobs/strategies.py)
    strategies: Dict[str, Any] = field(default_factory=dict)
    precision: str = "32-true"
    log_every_n_steps: int = 1
    val_check_interval: Optional[int] = None  # validate every N steps (with limit_val_batches > 0)
    limit_val_batches: int = 0
    # CPU threads per process (torch.set_num_threads at start). 1: bit-reproducible runs and exact
    # resume (at 2+ threads two runs of one command differ in the last bits); null: torch's default
    threads: Optional[int] = 1


@dataclass
class SftConfig:
    """Supervised fine-tuning (``experiment=sft`` and the cached warm starts)."""

    max_steps: int = 300
    batch_size: int = 16
    lr: float = 2.0e-3
    max_length: int = 768
    route_augment: bool = False
    lr_decay: bool = False
    log_every: int = 25  # log "SFT step i/N loss ETA" every N steps
    # the seed of the SFT's data order (and scripted episodes); None: the run's ``seed``. A fixed
    # value shares one cached warm start between runs, so ``seed=N`` then varies the RL only
    seed: Optional[int] = None
    episodes: int = 96  # rlvcr_sft: scripted episodes recorded
    episode_workers: int = 2
