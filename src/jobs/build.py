"""The job's builders, one module: from the validated config to the datamodule, the rollout pipeline
(prompt source: data or a curriculum's lessons; collector with its one engine; buffer: none, local
replay or Ray workers, and the worker's own module copy), the actor and the module, the logging
callbacks and the Lightning Trainer. Components with a ``_target_`` (datamodule, engine, collector,
loss module, environment, replay buffer, strategy, callbacks) come from Hydra ``instantiate``;
nothing here rewrites a setting: derived values are computed where they are used.
"""

from __future__ import annotations

import functools
import inspect
import logging
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from hydra.utils import get_object, instantiate
from omegaconf import DictConfig, OmegaConf

from src.callbacks.checkpointing import AtomicCheckpointIO, ManifestWriter
from src.callbacks.run_logs import RunTensorBoardLogger
from src.config.sampling import eval_sampling, merge_sampling, train_sampling
from src.config.schema import AlgorithmGroupConfig, RouterConfig
from src.config.validate import world_size
from src.datamodules.curriculum import (
    CurriculumDataModule,
    CurriculumState,
    LessonDependency,
    LessonPools,
    LessonRule,
    lesson_files,
    load_lesson,
)
from src.datamodules.position import RefillDraw
from src.jobs.strategies import build_strategy
from src.models.loading import LoraSettings, load_causal_lm
from src.rollout.batch import CollectRequest, RolloutBatch
from src.rollout.dynamic_refill import DynamicSampling
from src.rollout.pipeline import DataSource, NoBuffer, RolloutPipeline

log = logging.getLogger(__name__)


def dataclass_from(cls, node) -> Any:
    """``node`` (a typed or a plain config, e.g. a run manifest's) as a ``cls`` instance.

    Strict: a key ``cls`` does not declare, or a value of the wrong type, raises naming the key."""
    plain = OmegaConf.to_container(node, resolve=True) if OmegaConf.is_config(node) else dict(node)
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(cls), plain))


# ---------------------------------------------------------------------------- model
def build_actor(cfg: DictConfig, path: Path):
    lora = dataclass_from(LoraSettings, cfg.model.lora)
    return load_causal_lm(path, cfg.model.dtype, lora, cfg.model.gradient_checkpointing)


# ---------------------------------------------------------------------------- data
def data_files(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """Train/val parquet files; generates (synthetic) or converts (harmony) into the cache when asked."""
    from src.datamodules.prepare import prepare_data_files

    return prepare_data_files(cfg)


def build_datamodule(cfg: DictConfig, tokenizer):
    """The ``data`` group's ``_target_`` (``src.datamodules.prepare.*_datamodule``), instantiated.

    ``sampling.n_prompts`` (and the eval one) count prompts per step over all ranks; each rank
    loads its share."""
    if cfg.curriculum.enable:  # a curriculum's callback fills each step's prompts from its lessons
        from src.jobs.build import build_curriculum_datamodule

        return build_curriculum_datamodule(cfg, tokenizer)
    return build_data_group_datamodule(cfg, tokenizer)


def build_data_group_datamodule(cfg: DictConfig, tokenizer):
    """The ``data`` group's DataModule whatever the curriculum says (SFT warm starts read it)."""
    world = world_size(cfg)
    evals = eval_sampling(OmegaConf.to_object(cfg.sampling))
    return instantiate(
        cfg.data,
        tokenizer=tokenizer,
        batch_size=cfg.sampling.n_prompts // world,
        val_batch_size=max(evals.n_prompts // world, 1),
        job_seed=cfg.seed,
        cache_dir=cfg.cache_dir,
        _convert_="all",
    )


# ---------------------------------------------------------------------------- rollout
def build_collector(cfg: DictConfig, tokenizer, module, model_path: Path):
    """``rollout.collector``'s ``_target_`` on the job's config, tokenizer, module and model path."""
    return instantiate(cfg.rollout.collector, _partial_=True)(cfg, tokenizer, module, model_path)


def build_collector_factory(cfg: DictConfig, tokenizer, model_path: Path):
    return lambda module: build_collector(cfg, tokenizer, module, model_path)


# ---------------------------------------------------------------------------- trainer
def resume_command(cfg: DictConfig) -> str:
    overrides = [a for a in sys.argv[1:] if not a.startswith(("run_dir=", "resume="))]
    return shlex.join(["python", "scripts/train.py", *overrides, f"run_dir={cfg.run_dir}", "resume=true"])


def build_callbacks(
    cfg: DictConfig, runtime: dict[str, Callable[[], Any]], group: str = "callbacks"
) -> list[pl.Callback]:
    """``<group>.<name>``'s ``_target_`` for each enabled entry, in the config's order (``group``:
    ``callbacks``, the RL fit's, or ``sft_callbacks``).

    ``runtime``: what only the job has (``name`` -> a function giving it), passed by name to a
    constructor that takes it and whose node does not set it; ``enable`` is read here."""
    built = []
    for node in (cfg.get(group) or {}).values():
        if node is None or not node.get("enable", True):
            continue
        params = inspect.signature(get_object(node._target_)).parameters
        given = {k: make() for k, make in runtime.items() if k in params and k not in node}
        settings = {k: v for k, v in node.items() if k != "enable"}
        # given after instantiate: Hydra would merge a given DictConfig (cfg) into the node
        built.append(instantiate(OmegaConf.create(settings), _partial_=True)(**given))
    return built


def build_trainer(cfg: DictConfig, tokenizer, point) -> pl.Trainer:
    """The RL fit's Trainer with ``build_callbacks``; ``point``: the resume point, or None."""
    from src.rollout.factory import make_families

    run_dir = Path(cfg.run_dir)
    manifest = ManifestWriter(
        run_dir / "checkpoints",
        OmegaConf.to_container(cfg, resolve=True),
        resume_command(cfg),
        source_dir=Path(__file__).resolve().parents[1],
    )
    runtime = {
        "manifest": lambda: manifest,
        "families": lambda: make_families(cfg),
        "pad_id": lambda: tokenizer.pad_token_id,
        "replay": lambda: point.validation if point else None,
        "cfg": lambda: cfg,
    }
    callbacks = build_callbacks(cfg, runtime)
    t = cfg.trainer
    return pl.Trainer(
        max_steps=t.max_steps,
        accelerator=t.accelerator,
        devices=t.devices,
        num_nodes=t.num_nodes,
        strategy=build_strategy(t, float(cfg.algorithm.grad_clip), world_size(cfg)),
        # the datamodules shard their own seeded order over the ranks (any world size, same prompts)
        use_distributed_sampler=False,
        precision=t.precision,
        log_every_n_steps=t.log_every_n_steps,
        limit_val_batches=t.limit_val_batches,
        num_sanity_val_steps=0,
        callbacks=callbacks,
        val_check_interval=t.val_check_interval,
        check_val_every_n_epoch=None if t.val_check_interval else 1,
        logger=RunTensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""),
        plugins=[AtomicCheckpointIO()] if not str(t.strategy).startswith(("deepspeed", "fsdp")) else None,
        default_root_dir=str(run_dir),
        enable_model_summary=False,
        max_epochs=-1,
    )


def build_loss(cfg: DictConfig, algorithm: AlgorithmGroupConfig):
    """``algorithm.loss_module``'s ``_target_`` on the group's settings (``algorithm``, the dataclass).

    A config without the node (a run manifest written before it existed) gets the schema's default."""
    node = cfg.algorithm.loss_module if "loss_module" in cfg.algorithm else algorithm.loss_module
    return instantiate(node, _partial_=True)(algorithm)


def build_module(cfg: DictConfig, path: Path, pipeline=None):
    from src.models.module import ToolRouterModule

    algorithm = dataclass_from(AlgorithmGroupConfig, cfg.algorithm)
    router = dataclass_from(RouterConfig, cfg.router)
    return ToolRouterModule(
        build_actor(cfg, path),
        algorithm,
        router,
        reference_factory=lambda: load_causal_lm(path, cfg.model.dtype),
        seed=cfg.seed,
        pipeline=pipeline,
        loss_module=build_loss(cfg, algorithm),
    )


def build_rollout_pipeline(cfg: DictConfig, tokenizer, path: Path, datamodule=None) -> RolloutPipeline:
    """Data or curriculum prompts -> the job's collector -> no buffer, local replay or Ray workers.

    With Ray workers and no curriculum nothing is collected on the trainer, so no engine is built
    here; a curriculum's evaluations always use the trainer's own collector.
    """
    from src.rollout.factory import eval_sampling_from

    source = DataSource()
    if cfg.curriculum.enable:
        from src.jobs.build import build_curriculum_source

        source = build_curriculum_source(cfg, tokenizer, datamodule.pools)
    buffer = NoBuffer()
    if cfg.replay.capacity > 0:
        from src.jobs.build import build_replay_buffer

        buffer = build_replay_buffer(cfg, tokenizer, path)
    local = cfg.rollout.workers == 0 or cfg.curriculum.enable
    return RolloutPipeline(
        build_collector_factory(cfg, tokenizer, path) if local else None,
        source,
        buffer,
        None if cfg.env.enable else eval_sampling_from(cfg, tokenizer),
        seed=int(cfg.seed),
        dynamic=build_dynamic_sampling(cfg, tokenizer, datamodule),
        keyed_draws=bool(cfg.rollout.keyed_draws),
    )


def build_dynamic_sampling(cfg: DictConfig, tokenizer, datamodule) -> DynamicSampling | None:
    """``algorithm.dynamic_sampling`` with its refill draw over the datamodule's training set."""
    d = cfg.algorithm.dynamic_sampling
    if not d.enable:
        return None
    if datamodule is None:
        raise ValueError("algorithm.dynamic_sampling.enable: the refill draw needs the job's datamodule")
    draw = RefillDraw(datamodule, int(cfg.seed))
    return DynamicSampling(str(d.on), int(d.max_extra_batches), float(d.eps), draw, tokenizer.pad_token_id)


def lesson_rules(cfg: DictConfig) -> list[LessonRule]:
    c = cfg.curriculum
    return [
        LessonRule(
            lesson_id=str(lid),
            dependencies=tuple(
                LessonDependency(d.dependency_id, float(d.reward_threshold)) for d in lesson.dependencies
            ),
            start_threshold=float(lesson.start_threshold),
            stop_threshold=float(lesson.stop_threshold),
            plateau_window=int(lesson.plateau_window),
            plateau_threshold=float(lesson.plateau_threshold),
            weight=float(lesson.weight),
        )
        for lid, lesson in c.lessons.items()
    ]


def build_lesson_pools(cfg: DictConfig, tokenizer) -> LessonPools:
    lessons = {}
    for lid, lesson in cfg.curriculum.lessons.items():
        train, evals = lesson_files(lesson, str(lid), cfg.cache_dir)
        lessons[str(lid)] = load_lesson(train, evals, tokenizer, cfg.data.max_prompt_length)
    return LessonPools(lessons, cfg.seed)


def build_curriculum_datamodule(cfg: DictConfig, tokenizer) -> CurriculumDataModule:
    return CurriculumDataModule(build_lesson_pools(cfg, tokenizer))


def lesson_sampling(cfg: DictConfig, tokenizer):
    """Per lesson: (prompts per step, train and eval engine SamplingParams) — the global sampling
    with the lesson's override, and for eval the global eval override on top of that."""
    from src.rollout.factory import engine_sampling

    job = OmegaConf.to_object(cfg.sampling)
    prompts, train, evals = {}, {}, {}
    for lid, lesson in OmegaConf.to_object(cfg.curriculum).lessons.items():
        own = merge_sampling(train_sampling(job), lesson.sampling)
        prompts[lid] = own.n_prompts
        train[lid] = engine_sampling(own, tokenizer)
        evals[lid] = engine_sampling(merge_sampling(own, job.eval), tokenizer)
    return prompts, train, evals


def build_curriculum_source(cfg: DictConfig, tokenizer, pools: LessonPools):
    """The pipeline's prompt source for ``curriculum.enable``: lessons, their sampling and rules."""
    from src.rollout.curriculum_source import CurriculumSource, LessonSampling

    c = cfg.curriculum
    prompts, train, evals = lesson_sampling(cfg, tokenizer)
    sampling = LessonSampling(prompts, train, evals, int(c.eval_prompts), int(c.eval_frequency))
    state = CurriculumState.from_rules(lesson_rules(cfg), min_share=float(c.min_share))
    return CurriculumSource(state, pools, sampling, seed=int(cfg.seed))


def build_replay_buffer(cfg: DictConfig, tokenizer, model_path: Path):
    """``LocalReplay`` (workers 0) or ``WorkerReplay`` around the configured :class:`ReplayBuffer`."""
    from src.replay.buffer import LocalReplay, RolloutWorkerPool, WorkerReplay

    buffer = instantiate(cfg.replay, pad_id=int(tokenizer.pad_token_id), seed=int(cfg.seed))
    n_groups = int(cfg.sampling.n_prompts)
    if cfg.rollout.workers == 0:
        return LocalReplay(buffer, n_groups)
    policy = functools.partial(WorkerPolicy, OmegaConf.to_container(cfg, resolve=True), str(model_path))
    pool_factory = functools.partial(
        RolloutWorkerPool, int(cfg.rollout.workers), policy, address=cfg.rollout.ray_address
    )
    return WorkerReplay(buffer, n_groups, pool_factory, int(cfg.rollout.weight_sync_every))


class WorkerPolicy:
    """What a rollout worker runs: its own module copy and the job's collector around it."""

    def __init__(self, cfg_container: dict[str, Any], model_path: str):
        from src.config.job import JobConfig
        from src.models.loading import load_tokenizer

        cfg = OmegaConf.merge(OmegaConf.structured(JobConfig), cfg_container)  # typed again, as on the driver
        cfg.algorithm.use_kl_loss = False  # a worker only generates: no reference model
        self.module = build_module(cfg, Path(model_path)).eval()
        self.collector = build_collector(cfg, load_tokenizer(model_path), self.module, Path(model_path))

    def load_policy_state(self, state_dict) -> None:
        self.module.load_state_dict(state_dict)

    def collect(self, request: CollectRequest) -> RolloutBatch:
        return self.collector.collect(request)
