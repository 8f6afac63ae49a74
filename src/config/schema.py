"""The settings dataclasses of the job config, each declared once: what the components take
(the loss and its optimizer, the router head and its λ, the reward variants, the tiny model's
shape, dynamic sampling) and the fixed-shape groups built from them (model, algorithm, rollout,
router, trainer, sft).

Each group is the structured config of its group in ``configs/<group>/*.yaml``: a key a schema does
not declare, or a value of the wrong type, fails when the config is composed, naming the key. The
components take these dataclasses themselves (``src.rewards`` the ``RewardConfig``,
``src.models.tiny`` the ``TinyModelSpec``): nothing is mirrored. They are mutable, as Hydra's
structured configs need (a frozen dataclass composes to a read-only node).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional


@dataclass
class RlvcrSettings:
    """The ``algorithm`` group's RLVCR keys (read when ``adv_estimator: rlvcr``; the augmenter,
    ``src.rollout.rlvcr.augment``, takes the algorithm config itself: nothing is copied).

    step_advantage_w, thinking_cost_alpha, cost_max, rlvcr_mode: the formula's w, alpha, cost_max
        and how a level's context is scored (``src.algorithms.rlvcr``).
    rlvcr_qualify: which episodes get the thinking advantage: ``threshold`` (reward >
        rlvcr_qualify_threshold), ``group_mean`` (reward >= its uid group's mean: the better half;
        a group of equal rewards qualifies whole), ``all``.
    rlvcr_format_penalty: subtracted from an episode's reward x its fraction of malformed steps
        (executed steps whose level/think format did not parse).
    rlvcr_think_*: sampling of the alternative thinking.
    rlvcr_score_max_rows: rows per teacher-forced forward (None = all rows in one forward).
    rlvcr_allow_unclosed_action: accept a step without ``</action>`` (engines that stop on it).
    rlvcr_score_malformed_steps: also score steps that break the format but carry an action, at
        their declared level when it parses, else 1 (the format penalty still applies to them).
    """

    step_advantage_w: float = 1.0
    thinking_cost_alpha: float = 0.1
    cost_max: float = 64.0
    rlvcr_mode: str = "neg_entropy"  # seed 002: minus the action entropy under each level
    rlvcr_qualify: str = "threshold"
    rlvcr_qualify_threshold: float = 0.0
    rlvcr_format_penalty: float = 0.0
    rlvcr_think_max_new_tokens: int = 64
    rlvcr_think_temperature: float = 1.0
    rlvcr_think_top_p: float = 1.0
    rlvcr_score_max_rows: int | None = None
    rlvcr_allow_unclosed_action: bool = True
    rlvcr_score_malformed_steps: bool = False


@dataclass
class AlgorithmConfig(RlvcrSettings):
    """One loss module (see ``src/algorithms/__init__.py``) plus the PPO loop around it (and the
    RLVCR augmenter's keys, ``RlvcrSettings``)."""

    adv_estimator: str = "grpo"  # registry name: grpo | dr_grpo | rloo | reinforce_pp | rlvcr | ...
    norm_adv_by_std: bool = True
    adv_eps: float = 1e-6
    # extra keyword params of the estimator (for a researcher's own; built-ins read the keys above)
    adv_params: dict[str, Any] = field(default_factory=dict)
    policy_loss: str = "ppo_clip"  # registry name: ppo_clip | gspo | ...
    clip_ratio_low: float = 0.2
    clip_ratio_high: float = 0.2
    clip_ratio_c: float | None = None  # dual-clip bound c > 1 for A < 0; null = off
    log_ratio_clamp: float = 20.0  # |log π - log π_old| clamp before exp
    policy_loss_params: dict[str, Any] = field(default_factory=dict)
    # token-mean | seq-mean-token-sum | seq-mean-token-mean | seq-mean-token-sum-norm
    loss_agg_mode: str = "token-mean"
    loss_agg_norm_len: int | None = None  # L of seq-mean-token-sum-norm; null = the response width
    # recompute: one no-grad pass (exact) when several PPO epochs/minibatches need old log-probs;
    # rollout: the engine's own sampling log-probs (rb.rollout_log_probs), no extra pass
    old_log_prob_source: str = "recompute"
    # truncated importance sampling of the policy loss by min(pi_train / pi_rollout, cap) against the
    # engine's sampling log-probs (src/algorithms/losses.py): token | sequence | null (off)
    rollout_is: str | None = None
    rollout_is_cap: float = 2.0
    # sampling temperature of rows without their own (RolloutBatch.temperatures); null = filled by
    # the builder from sampling.temperature
    temperature: float | None = None
    use_kl_loss: bool = True
    kl_coef: float = 0.001
    kl_estimator: str = "low_var_kl"  # k1 | k2 | k3 / low_var_kl
    entropy_coeff: float = 0.0
    ppo_epochs: int = 1
    ppo_mini_batch_size: int = 0  # sequences per optimizer step; 0 = the whole rollout batch
    micro_batch_size: int = 16  # sequences per forward/backward (gradient accumulation)
    # run each prompt once per micro-batch and share its KV cache among the group's responses
    # (src/models/shared_prefix.py); same log-probs and gradients as the plain forward
    shared_prompt_forward: bool = True
    grad_clip: float = 1.0


@dataclass
class OptimConfig:
    lr: float = 1e-5
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    warmup_steps: int = 0


@dataclass
class RouterHeadConfig:
    enable: bool = False
    # last | mean | tail (mean over the last tail_tokens prompt tokens) | sif (the tail's tokens
    # weighted by sif_a / (sif_a + p(token)), p their frequency in the training prompts' tails, and
    # the pooled vectors' common direction removed: src.router.head; fitted before the first step)
    pooling: str = "last"
    tail_tokens: int = 32
    sif_a: float = 0.03
    # sif: the weight of a token that never occurs in the training prompts' tails (1.0: plain SIF,
    # a / (a + 0)); 0.0 pools a prompt over the tokens the router was trained on
    sif_unseen_weight: float = 1.0
    # sif: what is unseen. "token": each such token. "word": every piece of a word that has one (a
    # new word's known pieces, e.g. the bare space mark a byte-level BPE leaves before new letters,
    # then weigh sif_unseen_weight too, not what they meant in training). Training pools the same
    sif_unseen_unit: str = "token"
    # which of the backbone's hidden states the head pools: -1 the last layer's; 0 the input
    # embeddings (a bag of the prompt's tokens, which a small model's upper layers may not beat on
    # prompts phrased unlike any training prompt); k the output of layer k
    hidden_layer: int = -1
    # what the head pools: "actor" the actor's hidden states at hidden_layer (they move with the
    # warm start and with every actor update); "base_embeddings" a frozen copy of the base model's
    # input embedding table (the model before any warm start): the same input for every run seed and
    # at every step (set hidden_layer 0, the layer it stands in for)
    input: str = "actor"
    mlp_hidden: int = 64
    # > 0: a Polyak (exponential moving) average of the head's MLP weights with this decay per step,
    # which validation, evaluate.py and infer.py route with; training samples from the live head.
    # λ moves the live head's answer/tool boundary step to step; the average reads through it
    ema_decay: float = 0.0
    detach_backbone: bool = True
    separate_optimizer: bool = True  # single-process runs; multi-process strategies train one optimizer
    lr: float = 1e-3
    entropy_coef: float = 0.01
    # a router sampled at high entropy keeps paying for exploration at the end of the run: the
    # coefficient falls linearly from entropy_coef to entropy_coef_final over entropy_decay_steps
    entropy_coef_final: float | None = None
    entropy_decay_steps: int = 0
    # > 0: a cross-entropy of the weak label beside the policy gradient, sup_term picks which
    # (src.algorithms.losses.SUPERVISED_TERMS): "route" over the three routes (a tool-labelled
    # prompt pulls toward a tool, against λ); "family" between the two tool families on
    # tool-labelled prompts (the family from the label, answer-or-tool from r_task − λ·cost)
    sup_coef: float = 0.0
    sup_term: str = "route"
    lambda_init: float = 0.0
    adv_estimator: str = "grpo"  # registry name of the router's group estimator (groups by uid)
    # what the estimator standardises (src.algorithms.lagrange.ROUTER_ADVANTAGES):
    # scalarized_reward: r_router = r_task − λ·cost, one estimate (the cost's effective weight then
    #   moves with each group's spreads: Girgis et al. 2026, "Constrained GRPO", Thm 4.1);
    # scalarized_advantage: Z_g(r_task) − λ·Z_g(cost), each term standardised within its group (a
    #   term that does not vary in a group adds 0), so λ alone sets the trade-off
    advantage: str = "scalarized_reward"
    # False: advantages r - mean_g (no std). Near the budget's equilibrium the copies' r_router are
    # almost equal, and dividing by their tiny std turns noise into full-size pushes.
    norm_adv_by_std: bool = True


@dataclass
class DualSettings:
    """λ's update (the ``router`` group's λ keys; ``RouterConfig`` is one): every ``lambda_every_k``
    steps, the controller ``lambda_update`` (``src.algorithms.lagrange.DUAL_UPDATES``:
    ``gradient`` = dual ascent with rate ``lambda_lr``; ``pid`` adds ``lambda_kp`` / ``lambda_kd``
    terms on an EMA of the cost with decay ``lambda_cost_ema``; Stooke et al. 2020) on the mean cost
    of the window against ``budget``; λ clipped at ``lambda_max`` (None: no cap)."""

    budget: float = 0.3  # B: allowed mean tool cost per rollout
    lambda_lr: float = 0.5  # dual learning rate (the PID controller's integral gain k_i)
    lambda_every_k: int = 1
    lambda_max: float | None = None
    lambda_update: str = "gradient"  # gradient | pid
    lambda_kp: float = 0.0
    lambda_kd: float = 0.0
    lambda_cost_ema: float = 0.0  # decay of the cost average the P and D terms read


# ---------------------------------------------------------------------------- reward
@dataclass
class RewardConfig:
    """ToolRL's reward variants as booleans (all off by default).

    with_length         WITHLENGTH: add the <think>/analysis word-count reward (0..1).
    schedule_length     SCHEDULELENGTH: the length target grows from 384 to 640 words over steps.
    correct_max1        CORRECTMAX1: correctness in [-1, 1] instead of [-3, 3].
    max1_step30_max3    MAX1STEP30MAX3: correctness range /3 before step 30; format range /2 from step 30.
    schedule_reward     SCHEDULEREWARD: ranges interpolate with the step (format from [-2, 2], correctness from [-2, 2]).
    refined             REFINEDREWARD: name/key lists must match exactly (no partial credit).
    coarse              COARSEREWARD: any difference from the ground-truth calls gets the minimum.
    intermediate        INTERMEDIATEREWARD: a call counts only when it matches a ground-truth call exactly.
    """

    with_length: bool = False
    schedule_length: bool = False
    correct_max1: bool = False
    max1_step30_max3: bool = False
    schedule_reward: bool = False
    refined: bool = False
    coarse: bool = False
    intermediate: bool = False


# ---------------------------------------------------------------------------- model
@dataclass
class TinyModelSpec:
    """Shape of the embedded default model (a Qwen2 config)."""

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
class LoraSettings:
    """The ``model.lora`` node: peft LoRA adapters on the actor (``src.models.loading.load_causal_lm``)."""

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
    tiny: TinyModelSpec = field(default_factory=TinyModelSpec)
    lora: LoraSettings = field(default_factory=LoraSettings)


# ---------------------------------------------------------------------------- algorithm
@dataclass
class DynamicSamplingConfig:
    """``algorithm.dynamic_sampling``: DAPO's dead-group filter and refill (``src.rollout.dynamic_refill``).

    A GRPO group whose rollouts all earn the same reward carries no advantage. With ``enable`` the
    step drops such groups and refills the batch from further seeded draws of training prompts, at
    most ``max_extra_batches`` extra collect calls of ``n_prompts`` prompts each (the bound on extra
    generation); the batch keeps ``n_prompts`` groups, padded with dead ones when the bound is hit.
    Off by default (measurements: docs/benchmarks.md).
    """

    enable: bool = False
    # which reward must vary for a group to be kept: the actor's, the router's r_router, or either
    on: str = "either"
    max_extra_batches: int = 2  # extra collect calls per step, each of n_prompts fresh prompts
    eps: float = 1e-6  # a group is dead when max - min of its rewards <= eps


@dataclass
class AlgorithmGroupConfig(AlgorithmConfig):
    """The ``algorithm`` group: the loss settings (RLVCR's included) and their optimizer.

    ``loss_module``: its ``_target_`` is called with this group's settings (the dataclass itself)
    and returns the loss module the LightningModule trains with (the default,
    ``src.algorithms.loss_module.build_loss_module``, picks the registries by name); a researcher's
    own is one override, nothing in ``src/`` edited."""

    optim: OptimConfig = field(default_factory=OptimConfig)
    dynamic_sampling: DynamicSamplingConfig = field(default_factory=DynamicSamplingConfig)
    loss_module: Dict[str, Any] = field(
        default_factory=lambda: {"_target_": "src.algorithms.loss_module.build_loss_module"}
    )


# ---------------------------------------------------------------------------- rollout
@dataclass
class RolloutConfig:
    """``engine`` names one of ``engines``; each engine node is built with Hydra ``instantiate``
    (its ``_target_`` plus the module, tokenizer, model path and ``micro_batch_size``).
    ``collector``: its ``_target_`` is called with the job's config, tokenizer, module and model
    path (the default: single-turn, or episodes when ``env.enable``; ``src.rollout.factory``)."""

    engine: str = "hf"
    micro_batch_size: int = 64  # prompts x samples per generate call (HF engine)
    engines: Dict[str, Any] = field(default_factory=dict)
    collector: Dict[str, Any] = field(
        default_factory=lambda: {"_target_": "src.rollout.factory.make_collector"}
    )
    # single-turn training rows: each row's route and tokens drawn from its own stream, keyed by the
    # step's seed, the prompt's uid and the copy, so any world size draws what one process draws
    # (false: one stream per rank and step in batch order, as before; episode / RLVCR collectors)
    keyed_draws: bool = True
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
    # CPU threads per process (torch.set_num_threads at start); null: torch's default (one per core).
    # A float's last bits depend on the count (reductions split by thread). The router job is
    # bit-reproducible and resumes exactly at 2 threads too, its SFT warm start is reproducible there
    # (measured; the other experiments only at 1). 1: every recorded run's bits, and no oversubscribed
    # cores when runs or tests share a machine (docs/benchmarks.md, "Threads")
    threads: Optional[int] = 1


@dataclass
class SftConfig:
    """Supervised fine-tuning (``experiment=sft`` and the cached warm starts)."""

    max_steps: int = 300
    batch_size: int = 16
    lr: float = 2.0e-3
    max_length: int = 768
    route_augment: bool = False
    # route_augment's misrouted targets: the routed family's first listed tool, or the one picked by
    # a hash of the request ("request_hash": no list position predicts the call; src.jobs.route_sft)
    misrouted_tool: str = "first"
    lr_decay: bool = False
    log_every: int = 25  # log "SFT step i/N loss ETA" every N steps
    # the seed of the SFT's data order (and scripted episodes); None: the run's ``seed``. A fixed
    # value shares one cached warm start between runs, so ``seed=N`` then varies the RL only
    seed: Optional[int] = None
    episodes: int = 96  # rlvcr_sft: scripted episodes recorded
    episode_workers: int = 2
