"""Resolve the configured data into parquet files: generate synthetic data or convert to harmony, cached."""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

log = logging.getLogger(__name__)


def _synthetic_files(cfg: DictConfig) -> tuple[list[str], list[str]]:
    from src.datamodules.synthetic import GENERATOR_VERSION, write_synthetic_rlla

    s = cfg.data.synthetic
    out = (
        Path(cfg.cache_dir)
        / "data"
        / (
            f"synthetic-v{GENERATOR_VERSION}-n{s.n_train}-{s.n_test}-s{s.seed}-p{s.p_search}-{s.p_calculate}-{s.p_answer}"
        )
    )
    train, test = out / "train.parquet", out / "test.parquet"
    if not (train.exists() and test.exists()):
        write_synthetic_rlla(
            out,
            n_train=s.n_train,
            n_test=s.n_test,
            seed=s.seed,
            p_search=s.p_search,
            p_calculate=s.p_calculate,
            p_answer=s.p_answer,
        )
    return [str(train)], [str(test)]


def _to_harmony(cfg: DictConfig, files: list[str]) -> list[str]:
    """Convert XML RLLA parquet files to harmony copies under the cache (once)."""
    import pandas as pd

    from src.datamodules.gpt_oss import convert_frame

    out = []
    for f in files:
        src = Path(f)
        target = (
            Path(cfg.cache_dir)
            / "data"
            / "harmony"
            / f"{src.parent.name}-{src.stem}-{int(src.stat().st_mtime)}.parquet"
        )
        if not target.exists():
            target.parent.mkdir(parents=True, exist_ok=True)
            df, stats = convert_frame(pd.read_parquet(src))
            log.info("converted %s to harmony: %s", src, stats)
            tmp = target.with_suffix(".tmp")
            df.to_parquet(tmp, index=False)
            tmp.replace(target)
        out.append(str(target))
    return out


def prepare_data_files(cfg: DictConfig) -> tuple[list[str], list[str]]:
    d = cfg.data
    if d.kind == "synthetic":
        train, val = _synthetic_files(cfg)
        train, val = (list(d.train_files) or train), (list(d.val_files) or val)
    elif d.kind == "files":
        train, val = list(d.train_files), list(d.val_files)
        missing = [f for f in train + val if not Path(f).exists()]
        if missing:
            raise FileNotFoundError(
                f"data files not found: {missing} (set data.train_files / data.val_files)"
            )
    else:
        raise ValueError(f"data.kind={d.kind!r}; expected 'synthetic' or 'files'")
    if d.get("format", "xml") == "harmony":
        train, val = _to_harmony(cfg, train), _to_harmony(cfg, val)
    return train, val
