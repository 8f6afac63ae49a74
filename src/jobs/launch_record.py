"""Hydra's record of a launch (``<run_dir>/.hydra/{config,hydra,overrides}.yaml``), written once
the run has started, never before.

Hydra itself writes the record at every launch, before the job runs (``configs/train.yaml`` turns
that off: ``hydra.output_subdir: null``): a command refused on an existing run (a fresh run into
it, a resume whose checkpoint is corrupt or does not fit the model) overwrote the record of the run
it did not touch. Here the same three files are written by the launch that trains, at the fit's
start (after a resumed checkpoint was restored), each atomically; they hold the newest launch that
trained in the run (the checkpoints' manifest keeps its resume command).
"""

from __future__ import annotations

from pathlib import Path

import lightning.pytorch as pl
from lightning.fabric.utilities.rank_zero import rank_zero_only
from omegaconf import DictConfig, OmegaConf

from src.atomic_files import atomic_file

RECORD_DIR = ".hydra"


def save_launch_record(cfg: DictConfig, run_dir: str | Path) -> Path | None:
    """Write Hydra's three files for this launch under ``run_dir/.hydra`` (the layout Hydra's own
    ``output_subdir`` has). Only in a job Hydra launched (not a config composed in-process) and on
    global rank 0; returns the folder, or None when nothing was written."""
    from hydra.core.hydra_config import HydraConfig

    if rank_zero_only.rank != 0 or not HydraConfig.initialized():
        return None
    hydra_root = HydraConfig.instance().cfg  # {"hydra": ...}, as Hydra saves it
    if hydra_root.hydra.runtime.get("output_dir") is None:  # composed, not launched
        return None
    out = Path(run_dir) / RECORD_DIR
    files = {
        "config.yaml": OmegaConf.to_yaml(cfg),
        "hydra.yaml": OmegaConf.to_yaml(hydra_root),
        "overrides.yaml": OmegaConf.to_yaml(hydra_root.hydra.overrides.task),
    }
    for name, text in files.items():
        with atomic_file(out / name) as tmp:
            tmp.write_text(text, encoding="utf-8")
    return out


class LaunchRecord(pl.Callback):
    """Saves the launch record at the fit's start: a resume is accepted by then (the checkpoint
    restored), so a refused or failed command leaves the run's record as it was."""

    def __init__(self, cfg: DictConfig, run_dir: str | Path):
        self.cfg, self.run_dir = cfg, Path(run_dir)

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        save_launch_record(self.cfg, self.run_dir)
