"""``start_problems(cfg)``: what the entry point can find wrong on disk before Hydra creates or
writes anything in the run directory (``scripts/train.py`` ``preflight``), each problem one line
naming the key and the path and saying what to do.

``validate_job`` checks the config's values; these check the paths it names: the run and cache
directories (a file where a directory goes, a directory that cannot be written), the data files
(their parquet footers: readable, the RLLA columns, rows), and the run directory against
``resume`` (a fresh run into a finished one, a resume with no intact checkpoint). Problems only the
job can find (malformed rows, prompt lengths, a model that does not fit the checkpoint) are the
job's, with the same one line (``src.config.validate.UserError``).
"""

from __future__ import annotations

import os
from pathlib import Path

from omegaconf import DictConfig

from src.callbacks.run_logs import existing_run_artefacts
from src.config.job import file_list
from src.datamodules.schema import parquet_problem
from src.jobs.resume import ResumeError, intact_resume_point


def start_problems(cfg: DictConfig) -> list[str]:
    """Every problem of the paths ``cfg`` names (the run directory's only once it is a directory)."""
    problems = directory_problems("cache_dir", cfg.cache_dir, writable=False)
    run_dir = directory_problems("run_dir", cfg.run_dir, writable=True)
    problems += run_dir + data_file_problems(cfg)
    if not run_dir and cfg.task == "rl":  # an SFT job keeps its own resumable state (src.jobs.sft)
        problems += existing_run_problems(Path(cfg.run_dir), bool(cfg.resume))
    return problems


def directory_problems(key: str, path: str, writable: bool) -> list[str]:
    """A directory the job creates (with its parents) or writes in: neither it nor the nearest
    existing folder above it may be a file, and where the job writes, that folder must be writable
    (Hydra opens ``train.log`` there first, and fails with a traceback otherwise)."""
    target = Path(path)
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing == target and not target.is_dir():
        return [f"{key}={target}: is a file, not a directory; choose a directory path (it is created)"]
    if not existing.is_dir():
        return [
            f"{key}={target}: {existing} is a file, so the directory cannot be created; choose another {key}"
        ]
    if writable and not os.access(existing, os.W_OK | os.X_OK):
        # os.access answers for the mount too: a read-only file system refuses even root
        read_only = bool(os.statvfs(existing).f_flag & os.ST_RDONLY)
        why = "is on a read-only file system" if read_only else "is not writable (permission denied)"
        return [f"{key}={target}: {existing} {why}; choose a writable {key}"]
    return []


def data_file_problems(cfg: DictConfig) -> list[str]:
    """The data group's parquet files, from their footers (a missing file is ``validate``'s)."""
    d = cfg.data
    if d.get("kind") not in ("files", "synthetic"):
        return []
    problems = []
    for key in ("train_files", "val_files"):
        try:
            files = file_list(d[key])
        except TypeError:  # named by validate
            continue
        for i, f in enumerate(files):
            problem = parquet_problem(f) if Path(f).is_file() else None
            if problem:
                problems.append(
                    f"data.{key}[{i}]: {f}: {problem}; fix it, or point data.{key} at RLLA parquet files"
                )
    return problems


def existing_run_problems(run_dir: Path, resume: bool) -> list[str]:
    """A fresh run must not start in a run directory that holds a run; a resume needs an intact
    checkpoint there (read without warnings: logging is not configured yet)."""
    if not resume:
        found = existing_run_artefacts(run_dir)
        if not found:
            return []
        return [
            (
                f"run_dir={run_dir}: already holds a run ({found[0].name} and {len(found) - 1} more); "
                "continue it with resume=true, or choose a new run_dir"
            )
        ]
    try:
        intact_resume_point(run_dir / "checkpoints", warn=False)
    except ResumeError as err:
        return [f"run_dir={run_dir}: {err}"]
    return []
