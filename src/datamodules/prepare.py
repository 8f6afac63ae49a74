"""Build the configured datamodule (the ``_target_`` of the ``data`` group) and resolve its parquet
files: generate synthetic data or convert to harmony, cached under ``cache_dir``."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from src.atomic_files import atomic_file, discard_if_broken, parquet_intact
from src.config.job import file_list

log = logging.getLogger(__name__)


def _synthetic_files(synthetic: Mapping[str, Any], cache_dir: str) -> tuple[list[str], list[str]]:
    from src.datamodules.synthetic import SyntheticOptions, write_synthetic_rlla

    out = synthetic_dir(synthetic, cache_dir)
    s = dict(synthetic)
    n_calib = _n_calib(s.pop("n_calib", 0))
    files = [out / "train.parquet", out / "test.parquet"] + ([out / "calib.parquet"] if n_calib else [])
    intact = [discard_if_broken(f, parquet_intact) for f in files]
    if not all(intact):
        n_train, n_test, seed = s.pop("n_train"), s.pop("n_test"), s.pop("seed")
        write_synthetic_rlla(out, n_train, n_test, seed, SyntheticOptions(**s), n_calib=n_calib)
    return [str(files[0])], [str(files[1])]


def synthetic_dir(synthetic: Mapping[str, Any], cache_dir: str) -> Path:
    """Where the synthetic splits of these settings live in the cache (one directory per setting)."""
    from src.datamodules.synthetic import GENERATOR_VERSION

    s = dict(synthetic)
    name = (
        f"synthetic-v{GENERATOR_VERSION}-n{s['n_train']}-{s['n_test']}-s{s['seed']}"
        f"-p{s['p_search']}-{s['p_calculate']}-{s['p_answer']}"
    )
    low_gain, n_calib = float(s.get("low_gain", 0.0)), _n_calib(s.get("n_calib", 0))
    return (
        Path(cache_dir)
        / "data"
        / (name + (f"-g{low_gain}" if low_gain else "") + (f"-c{n_calib}" if n_calib else ""))
    )


def calibration_files(kind: str, calib_files: Any, synthetic: Mapping[str, Any], cache_dir: str) -> list[str]:
    """The prompts a budget's routing threshold is calibrated on: ``data.calib_files``, else (synthetic
    data with ``n_calib`` > 0) the generated ``calib.parquet`` (``resolve_files`` writes it); else none."""
    files = file_list(calib_files)
    if files or kind != "synthetic" or not _n_calib((synthetic or {}).get("n_calib", 0)):
        return files
    return [str(synthetic_dir(synthetic, cache_dir) / "calib.parquet")]


def _n_calib(value: Any) -> int:
    """``data.synthetic.n_calib`` as an int (absent from manifests written before it existed: 0)."""
    return int(value or 0)


def _to_harmony(files: list[str], cache_dir: str) -> list[str]:
    """Convert XML RLLA parquet files to harmony copies under the cache (once, written atomically)."""
    import pandas as pd
    import pyarrow as pa
    import pyarrow.parquet as pq

    from src.datamodules.gpt_oss import convert_frame

    out = []
    for f in files:
        src = Path(f)
        target = (
            Path(cache_dir)
            / "data"
            / "harmony"
            / f"{src.parent.name}-{src.stem}-{int(src.stat().st_mtime)}.parquet"
        )
        if not discard_if_broken(target, parquet_intact):
            df, stats = convert_frame(pd.read_parquet(src))
            log.info("converted %s to harmony: %s", src, stats)
            with atomic_file(target) as tmp:
                pq.write_table(pa.Table.from_pandas(df, preserve_index=False), tmp)
        out.append(str(target))
    return out


def resolve_files(
    kind: str, train_files: Any, val_files: Any, format: str, synthetic: Mapping[str, Any], cache_dir: str
) -> tuple[list[str], list[str]]:
    """Train/val parquet files; a single path string is one file. Missing files are named."""
    train, val = file_list(train_files), file_list(val_files)
    if kind == "synthetic":
        gen_train, gen_val = _synthetic_files(synthetic, cache_dir)
        train, val = (train or gen_train), (val or gen_val)
    elif kind == "files":
        missing = [f for f in train + val if not Path(f).exists()]
        if missing:
            raise FileNotFoundError(
                f"data files not found: {missing} (set data.train_files / data.val_files)"
            )
    else:
        raise ValueError(f"data.kind={kind!r}; expected 'synthetic' or 'files'")
    if format == "harmony":
        train, val = _to_harmony(train, cache_dir), _to_harmony(val, cache_dir)
    return train, val


def prepare_data_files(cfg) -> tuple[list[str], list[str]]:
    """``resolve_files`` for a whole job config (also a run manifest's plain config)."""
    d = cfg.data
    synthetic = d.get("synthetic") or {}
    return resolve_files(d.kind, d.train_files, d.val_files, d.get("format", "xml"), synthetic, cfg.cache_dir)


@dataclass(frozen=True)
class RllaData:
    """The ``data`` group's keys for RLLA-schema prompts (schema and defaults: ``RllaDataConfig``)."""

    kind: str
    train_files: Any
    val_files: Any
    format: str
    max_prompt_length: int
    shuffle: bool
    synthetic: Mapping[str, Any]
    calib_files: Any = ()


@dataclass(frozen=True)
class SeedsData:
    """The ``data`` group's keys for environment seeds (schema and defaults: ``SeedsDataConfig``)."""

    kind: str
    n_seeds: int
    seed: int | None
    shuffle: bool


def rlla_datamodule(
    *, tokenizer: Any, batch_size: int, val_batch_size: int, job_seed: int, cache_dir: str, **group: Any
):
    """RLLA-schema prompts (``data=rlla | rlla_gpt | synthetic``); ``batch_size`` prompts per rank.

    ``group``: the ``data`` group's keys (``RllaData``), as Hydra's ``_target_`` call passes them."""
    from src.datamodules.rlla_datamodule import LoaderSettings, RLLADataModule

    d = RllaData(**group)
    train, val = resolve_files(d.kind, d.train_files, d.val_files, d.format, d.synthetic, cache_dir)
    calib = calibration_files(d.kind, d.calib_files, d.synthetic, cache_dir)
    if d.format == "harmony":
        calib = _to_harmony(calib, cache_dir)
    loader = LoaderSettings(
        max_prompt_length=d.max_prompt_length,
        batch_size=batch_size,
        val_batch_size=val_batch_size,
        shuffle=d.shuffle,
        seed=job_seed,
    )
    return RLLADataModule(train, val, tokenizer, loader, calib_files=calib)


def seeds_datamodule(
    *, tokenizer: Any, batch_size: int, val_batch_size: int, job_seed: int, cache_dir: str, **group: Any
):
    """Environment seeds (``data=seeds``): ``batch_size`` seeds per rank; ``seed`` null = the job's.

    ``group``: the ``data`` group's keys (``SeedsData``), as Hydra's ``_target_`` call passes them."""
    from src.datamodules.rlla_datamodule import SeedDataModule

    del tokenizer, val_batch_size, cache_dir  # seeds are drawn, not read or tokenised
    d = SeedsData(**group)
    return SeedDataModule(
        n_seeds=d.n_seeds,
        batch_size=batch_size,
        seed=job_seed if d.seed is None else d.seed,
        shuffle=d.shuffle,
    )
