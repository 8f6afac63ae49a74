"""train(cfg): run the configured job (RL or SFT) from a composed, validated Hydra config."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.utilities.exceptions import SIGTERMException
from omegaconf import DictConfig, OmegaConf

from src.callbacks.checkpointing import Preempted, StopOnSignal
from src.jobs.build import (
    build_datamodule,
    build_module,
    build_rollout_pipeline,
    build_trainer,
)
from src.jobs.checks import validate_job
from src.jobs.launch_record import save_launch_record
from src.jobs.resume import (
    already_finished,
    check_callback_states,
    check_checkpoint_shapes,
    logs_cut_once_restored,
    prepare_run_dir,
)
from src.jobs.router_pooling import set_up_router_input
from src.jobs.warm_start import base_model_dir, model_dir
from src.models.loading import load_tokenizer

log = logging.getLogger(__name__)


class _DropLightningTip(logging.Filter):
    """Lightning's advertising tips ("💡 Tip: ... litlogger") say nothing about the run."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "💡 Tip" not in record.getMessage()


_DROP_LIGHTNING_TIP = _DropLightningTip()


def quiet_known_library_output() -> None:
    """Each library message that repeats without telling the user anything is silenced here, once,
    with the reason; everything else is left to show."""
    # The HF forward is called with ``past_key_values=``: its replacement keyword (``cache=``) does
    # not exist in the transformers releases the vLLM venv and the GPU image pin, and the warning
    # repeats on every generate / prefill.
    warnings.filterwarnings("ignore", message=r"`past_key_values` is deprecated", category=FutureWarning)
    # Our checkpoints hold the state after the step's optimizer step, by design (resume continues
    # from the step after): Lightning warns about this on every save under manual optimization.
    warnings.filterwarnings("ignore", message=r"Using ModelCheckpoint with manual optimization")
    # Lightning's own use of torch's pytree API (not ours).
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated")
    # The module's on_after_batch_transfer wraps the datamodule's record lists on purpose.
    warnings.filterwarnings("ignore", message=r"You have overridden `on_after_batch_transfer`")
    # Jobs without held-out data (e.g. the game episodes) define validation_step for the others.
    warnings.filterwarnings("ignore", message=r"You defined a `validation_step` but have no `val_dataloader`")
    # The datamodules restore their mid-epoch position themselves (their state_dict), so
    # Lightning's "dataloader is not resumable" warning does not apply.
    warnings.filterwarnings("ignore", message="You're resuming from a checkpoint that ended before the epoch")
    # A resume writes into its own checkpoint folder by design; a fresh run into an existing run
    # directory is refused before Lightning starts (preflight), so this never says more.
    warnings.filterwarnings("ignore", message=r"Checkpoint directory .* exists and is not empty")
    for name in ("lightning.pytorch.utilities.rank_zero", "lightning.fabric.utilities.rank_zero"):
        logging.getLogger(name).addFilter(_DROP_LIGHTNING_TIP)  # one instance: added once per logger
    # Lightning prints through a console handler of its own and through the root logger (which
    # Hydra gives a console and a train.log handler): every line twice. The root's stays.
    if logging.getLogger().handlers:
        lightning_log = logging.getLogger("lightning")
        for handler in list(lightning_log.handlers):
            lightning_log.removeHandler(handler)


def train(cfg: DictConfig, validated: bool = False) -> tuple[dict[str, float], dict[str, Any]]:
    """Run the configured job. Returns (final logged metrics, {trainer, module, datamodule}).

    Raises :class:`Preempted` (a ``SystemExit`` with code 128 + signal) when SIGINT / SIGTERM
    stopped the run after saving a checkpoint.

    ``cfg`` is validated first (``ConfigError`` naming every bad key), before anything is built.
    """
    if not validated:  # the entry point validates before Hydra creates the run directory
        validate_job(cfg)
    quiet_known_library_output()
    if cfg.trainer.threads is not None:  # before any work: reductions split by thread count
        torch.set_num_threads(int(cfg.trainer.threads))
    # Lightning would say this on stderr, which stays for errors (a user error is its one line)
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    log.info("Seed set to %d", cfg.seed)
    torch.set_float32_matmul_precision("high")
    if cfg.task == "sft":
        from src.jobs.sft import run_sft

        save_launch_record(cfg, cfg.run_dir)
        return run_sft(cfg)
    point = prepare_run_dir(cfg.run_dir, bool(cfg.resume))
    if already_finished(point, int(cfg.trainer.max_steps)):  # says so; nothing is changed
        return {}, {"finished": point}
    path = model_dir(cfg)
    tokenizer = load_tokenizer(path)
    if cfg.data.get("format") == "harmony":
        from src.models.tokens import harmony_token_ids

        log.info("harmony token ids: %s", harmony_token_ids(tokenizer))
    datamodule = build_datamodule(cfg, tokenizer)
    # read now, before the model is built: a data file none of whose rows can train (malformed,
    # all too long) ends the job with its one line before anything is written or loaded
    datamodule.setup("fit")
    pipeline = build_rollout_pipeline(cfg, tokenizer, path, datamodule)
    # Building a missing base model or warm start (model_dir above) draws from the global RNG; the
    # module's initial weights (the router head) must not depend on whether they were cached.
    pl.seed_everything(cfg.seed, workers=True, verbose=False)
    module = build_module(cfg, path, pipeline)
    ckpt = point.checkpoint if point else None
    if ckpt is not None:  # a model that does not fit the checkpoint: refused before the trainer exists
        check_checkpoint_shapes(point, module, OmegaConf.to_container(cfg, resolve=True))
    if ckpt is None and module.router_head is not None:  # a resumed run restores them from its checkpoint
        set_up_router_input(
            module, base_model_dir(cfg), datamodule, tokenizer, Path(cfg.cache_dir)
        )
    trainer = build_trainer(cfg, tokenizer, point)
    if ckpt is not None:
        check_callback_states(point, trainer)
        log.info("resuming from %s", ckpt)
    metrics = fit(trainer, module, datamodule, cfg.run_dir, point)
    return metrics, {"trainer": trainer, "module": module, "datamodule": datamodule}


def fit(trainer: pl.Trainer, module, datamodule, run_dir: str, point) -> dict[str, float]:
    """``trainer.fit`` (from ``point``'s checkpoint when resuming); the final logged metrics.
    Raises :class:`Preempted` when a signal stopped it before ``trainer.max_steps``."""
    ckpt = point.checkpoint if point else None
    try:
        with logs_cut_once_restored(trainer, run_dir, point):  # cut once the checkpoint loaded
            trainer.fit(module, datamodule=datamodule, ckpt_path=str(ckpt) if ckpt else None)
    except SIGTERMException as e:  # SIGTERM before our handler took over: Lightning exits with 0
        raise Preempted(15) from e
    stopper = next((cb for cb in trainer.callbacks if isinstance(cb, StopOnSignal)), None)
    finished = 0 < trainer.max_steps <= trainer.global_step  # a signal during the last step: done
    if stopper is not None and stopper.stopped_by is not None and not finished:
        raise Preempted(stopper.stopped_by)
    return {k: float(v) for k, v in trainer.logged_metrics.items()}
