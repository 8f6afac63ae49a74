"""Builders: data, actor, module, rollout callbacks and the Lightning Trainer from the validated config."""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
from hydra.utils import instantiate
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from src.callbacks.checkpointing import (
    AtomicCheckpointIO,
    ManifestCheckpoint,
    ManifestOnExceptionCheckpoint,
    ManifestWriter,
)
from src.callbacks.progress import StepProgressBar
from src.config.groups import AlgorithmGroupConfig, RouterConfig
from src.config.sampling import eval_sampling
from src.config.validate import world_size
from src.jobs.strategies import build_strategy, single_optimizer
from src.models.loading import LoraSettings, load_causal_lm

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
        from src.jobs.curriculum import build_curriculum_datamodule

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
def build_collector_factory(cfg: DictConfig, tokenizer, model_path: Path):
    from src.rollout.factory import make_collector

    return lambda module: make_collector(cfg, tokenizer, module, model_path)


# ---------------------------------------------------------------------------- trainer
def resume_command(cfg: DictConfig) -> str:
    overrides = [a for a in sys.argv[1:] if not a.startswith(("run_dir=", "resume="))]
    return shlex.join(["python", "scripts/train.py", *overrides, f"run_dir={cfg.run_dir}", "resume=true"])


def build_trainer(cfg: DictConfig, extra_callbacks: list[pl.Callback]) -> pl.Trainer:
    run_dir = Path(cfg.run_dir)
    ckpt_dir = run_dir / "checkpoints"
    manifest = ManifestWriter(
        ckpt_dir,
        OmegaConf.to_container(cfg, resolve=True),
        resume_command(cfg),
        source_dir=Path(__file__).resolve().parents[1],
    )
    callbacks = [
        StepProgressBar(budget=float(cfg.router.budget) if cfg.router.get("enable") else None),
        *extra_callbacks,
        ManifestCheckpoint(
            manifest,
            dirpath=ckpt_dir,
            filename="step_{step:08d}",
            every_n_train_steps=cfg.trainer.save_freq,
            save_last=True,
            save_top_k=-1,
            auto_insert_metric_name=False,
        ),
        ManifestOnExceptionCheckpoint(manifest, dirpath=ckpt_dir),
    ]
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
        logger=TensorBoardLogger(save_dir=str(run_dir), name="tensorboard", version=""),
        plugins=[AtomicCheckpointIO()] if not str(t.strategy).startswith(("deepspeed", "fsdp")) else None,
        default_root_dir=str(run_dir),
        enable_model_summary=False,
        max_epochs=-1,
    )


def build_module(cfg: DictConfig, path: Path):
    from src.models.module import ToolRouterModule

    algorithm = dataclass_from(AlgorithmGroupConfig, cfg.algorithm)
    router = dataclass_from(RouterConfig, cfg.router)
    if single_optimizer(cfg.trainer.strategy):  # the router head: a group of the one optimizer
        router = replace(router, separate_optimizer=False)
    if algorithm.temperature is None:  # log-probs are scored at the sampling temperature
        algorithm = replace(algorithm, temperature=float(cfg.sampling.temperature))
    if cfg.replay.capacity > 0:  # off-policy samples: the ratio is taken against their behaviour log-probs
        algorithm = replace(algorithm, old_log_prob_source="rollout")
    return ToolRouterModule(
        build_actor(cfg, path),
        algorithm,
        algorithm.optim,
        router,
        reference_factory=lambda: load_causal_lm(path, cfg.model.dtype),
        seed=cfg.seed,
        dual=router if router.enable else None,  # RouterConfig is the λ's DualSettings
    )
