"""train(cfg): build data, model, callbacks and the Lightning Trainer from a composed Hydra config."""

from __future__ import annotations

import logging
import shlex
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.loggers import TensorBoardLogger
from omegaconf import DictConfig, OmegaConf

from src.callbacks.checkpointing import (
    AtomicCheckpointIO,
    ManifestCheckpoint,
    ManifestOnExceptionCheckpoint,
    ManifestWriter,
    latest_checkpoint,
)
from src.callbacks.progress import StepProgressBar
from src.models.config import AlgorithmConfig, OptimConfig, RouterHeadConfig
from src.models.loading import LoraSettings, load_causal_lm, load_tokenizer, resolve_model_path
from src.models.tiny import TinyModelSpec

log = logging.getLogger(__name__)


def _dataclass_from(cls, node) -> Any:
    """Build a dataclass from the config keys it knows (unknown keys are other components')."""
    data = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else dict(node or {})
    names = {f.name for f in fields(cls)}
    return cls(**{k: v for k, v in data.items() if k in names})


# ---------------------------------------------------------------------------- model
def model_dir(cfg: DictConfig) -> Path:
    """The model to start from: the configured path, or one of its cached warm starts
    (``model.warm_start``: sft = RLLA ground truths, rlvcr_sft = scripted RLVCR step-format episodes)."""
    base = resolve_model_path(cfg.model.path, cfg.cache_dir, _dataclass_from(TinyModelSpec, cfg.model.tiny))
    kind = cfg.model.get("warm_start")
    if kind == "sft":
        from src.sft import ensure_sft_warm_start

        return ensure_sft_warm_start(cfg, base)
    if kind == "rlvcr_sft":
        from src.sft import ensure_episode_warm_start

        return ensure_episode_warm_start(cfg, base)
    if kind is not None:
        raise ValueError(f"model.warm_start={kind!r}; expected null, 'sft' or 'rlvcr_sft'")
    return base


def build_actor(cfg: DictConfig, path: Path):
    lora = _dataclass_from(LoraSettings, cfg.model.lora)
    return load_causal_lm(path, cfg.model.dtype, lora, cfg.model.gradient_checkpointing)


# ---------------------------------------------------------------------------- data
def data_files(cfg: DictConfig) -> tuple[list[str], list[str]]:
    """Train/val parquet files; generates (synthetic) or converts (harmony) into the cache when asked."""
    from src.datamodules.prepare import prepare_data_files

    return prepare_data_files(cfg)


def build_datamodule(cfg: DictConfig, tokenizer):
    if cfg.data.kind == "seeds":  # multi-step episodes: records are env seeds, not prompts
        from src.datamodules.seeds import SeedDataModule

        return SeedDataModule(
            n_seeds=cfg.data.n_seeds,
            batch_size=cfg.data.batch_size,
            seed=cfg.data.get("seed", cfg.seed),
            shuffle=cfg.data.get("shuffle", True),
        )
    from src.datamodules.rlla_datamodule import RLLADataModule

    train_files, val_files = data_files(cfg)
    return RLLADataModule(
        train_files=train_files,
        val_files=val_files,
        tokenizer=tokenizer,
        max_prompt_length=cfg.data.max_prompt_length,
        batch_size=cfg.data.batch_size,
        val_batch_size=cfg.data.val_batch_size,
        shuffle=cfg.data.shuffle,
        seed=cfg.seed,
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
        source_dir=Path(__file__).resolve().parent,
    )
    callbacks = [
        StepProgressBar(),
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
        strategy=strategy_from(t.strategy),
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


def strategy_from(name: str):
    if name == "ddp":
        from lightning.pytorch.strategies import DDPStrategy

        # the router head is unused by the actor's backward (and vice versa)
        return DDPStrategy(find_unused_parameters=True, process_group_backend=None)
    return name


def train(cfg: DictConfig) -> tuple[dict[str, float], dict[str, Any]]:
    """Run the configured job. Returns (final logged metrics, {trainer, module, datamodule})."""
    pl.seed_everything(cfg.seed, workers=True)
    torch.set_float32_matmul_precision("high")
    if cfg.task == "sft":
        from src.sft import run_sft

        return run_sft(cfg)
    path = model_dir(cfg)
    tokenizer = load_tokenizer(path)
    if cfg.data.get("format") == "harmony":
        from src.models.tokens import harmony_token_ids

        log.info("harmony token ids: %s", harmony_token_ids(tokenizer))
    datamodule = build_datamodule(cfg, tokenizer)
    module = build_module(cfg, path)
    callbacks = build_rl_callbacks(cfg, tokenizer, path)
    trainer = build_trainer(cfg, callbacks)
    ckpt = None
    if cfg.resume:
        ckpt = latest_checkpoint(Path(cfg.run_dir) / "checkpoints")
        if ckpt is None:
            raise FileNotFoundError(f"resume=true but no checkpoint in {cfg.run_dir}/checkpoints")
        log.info("resuming from %s", ckpt)
    trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)
    metrics = {k: float(v) for k, v in trainer.logged_metrics.items()}
    return metrics, {"trainer": trainer, "module": module, "datamodule": datamodule}


def build_module(cfg: DictConfig, path: Path):
    from src.models.module import ToolRouterModule

    algorithm = _dataclass_from(AlgorithmConfig, cfg.algorithm)
    optim = _dataclass_from(OptimConfig, cfg.algorithm.optim)
    router = _dataclass_from(RouterHeadConfig, cfg.router)
    return ToolRouterModule(
        build_actor(cfg, path),
        algorithm,
        optim,
        router,
        reference_factory=lambda: load_causal_lm(path, cfg.model.dtype),
        seed=cfg.seed,
    )


def build_rl_callbacks(cfg: DictConfig, tokenizer, path: Path) -> list[pl.Callback]:
    from src.callbacks.lagrange_callback import LagrangeCallback
    from src.callbacks.rollout_logger import RolloutLogger
    from src.rollout.factory import eval_sampling_from
    from src.rollout.rollout_callback import RolloutCallback

    eval_sampling = None if cfg.env.enable else eval_sampling_from(cfg)
    callbacks: list[pl.Callback] = [
        RolloutCallback(
            build_collector_factory(cfg, tokenizer, path), seed=cfg.seed, eval_sampling=eval_sampling
        ),
        RolloutLogger(Path(cfg.run_dir) / "rollouts"),
    ]
    if cfg.router.enable:
        callbacks.append(
            LagrangeCallback(
                cfg.router.budget, cfg.router.lambda_lr, cfg.router.lambda_every_k, cfg.router.lambda_max
            )
        )
    return callbacks
