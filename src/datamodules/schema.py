"""The RLLA parquet schema (ToolRL / verl layout): validation and row extraction.

A file is one row per prompt with columns
    data_source   str                       reward selector ("rlla", "rlla_gpt", ...)
    prompt        [{content, role}] * 2     [system, user] chat messages
    ability       str                       unused here ("math" in ToolRL's files)
    reward_model  {ground_truth, style}     the <think>/<tool_call>/<response> target
    extra_info    {index, input, instruction, output, split}; index is the GRPO group uid

A missing column (or a struct column without the field we need) is a hard error: every row would
be unusable. A malformed row is skipped, counted by reason and reported in one warning per file.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from src.config.validate import UserError
from src.rewards.dispatch import row_problem

__all__ = [
    "REQUIRED_COLUMNS",
    "RLLA_ARROW_SCHEMA",
    "DataError",
    "RLLARecord",
    "RowError",
    "SchemaError",
    "extract_records",
    "parquet_problem",
    "parse_rlla_row",
    "read_rlla_parquet",
    "validate_rlla_frame",
]

log = logging.getLogger(__name__)

# The exact arrow schema of ToolRL's rlla_4k parquet files (field order matters for equality).
RLLA_ARROW_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string()),
        pa.field("prompt", pa.list_(pa.struct([("content", pa.string()), ("role", pa.string())]))),
        pa.field("ability", pa.string()),
        pa.field("reward_model", pa.struct([("ground_truth", pa.string()), ("style", pa.string())])),
        pa.field(
            "extra_info",
            pa.struct(
                [
                    ("index", pa.int64()),
                    ("input", pa.string()),
                    ("instruction", pa.string()),
                    ("output", pa.string()),
                    ("split", pa.string()),
                ]
            ),
        ),
    ]
)

# Columns the loader reads; `ability` is carried by the files but never used, so not required.
REQUIRED_COLUMNS = ("data_source", "prompt", "reward_model", "extra_info")
# Struct fields the loader reads: without them no row of the file is usable.
REQUIRED_FIELDS = {"reward_model": ("ground_truth",), "extra_info": ("index",)}


class DataError(UserError, ValueError):
    """The data a job is pointed at cannot train it (unreadable, wrong schema, no usable row): the
    user's to fix, so the entry point prints the one line and exits 2."""


class SchemaError(DataError):
    """A file cannot be read as RLLA data (missing column or field)."""


class RowError(SchemaError):
    """One row is malformed; ``reason`` is a short key used for counting."""

    def __init__(self, message: str, reason: str):
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class RLLARecord:
    """One usable RLLA row (plain python types)."""

    uid: int
    data_source: str
    system: str
    user: str
    ground_truth: str
    extra_info: dict[str, Any] = field(default_factory=dict)

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "system", "content": self.system}, {"role": "user", "content": self.user}]


def _name(path: str | Path | None) -> str:
    return Path(path).name if path is not None else "<frame>"


def _plain(value: Any) -> Any:
    """numpy arrays / scalars from pandas-read parquet -> python lists / scalars (recursively)."""
    if isinstance(value, np.ndarray):
        return [_plain(v) for v in value.tolist()]
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def validate_rlla_frame(df: pd.DataFrame, path: str | Path | None = None) -> None:
    """Raise :class:`SchemaError` naming the file and column when ``df`` is not RLLA-shaped.

    Checks the required columns and, for struct columns, that at least one row has the field
    we read (a field absent from every row means a different schema, not a bad row).
    """
    name = _name(path)
    for column in REQUIRED_COLUMNS:
        if column not in df.columns:
            raise SchemaError(f"{name}: missing column {column!r} (have {list(df.columns)})")
    if len(df) == 0:
        return
    for column, fields in REQUIRED_FIELDS.items():
        values = [v for v in df[column].tolist() if isinstance(v, Mapping)]
        if not values:
            raise SchemaError(f"{name}: column {column!r} holds no records (expected a struct with {fields})")
        for f in fields:
            if not any(f in v for v in values):
                raise SchemaError(f"{name}: column {column!r} has no field {f!r}")


def parse_rlla_row(row: Mapping[str, Any], row_index: int, path: str | Path | None = None) -> RLLARecord:
    """Extract (uid, data_source, system, user, ground_truth, extra_info) from one row.

    Raises :class:`RowError` (with a ``reason`` key) naming the file and row when malformed.
    """
    where = f"{_name(path)} row {row_index}"

    def bad(reason: str, message: str) -> RowError:
        return RowError(f"{where}: {message}", reason)

    data_source = row.get("data_source")
    if not isinstance(data_source, str) or not data_source:
        raise bad("bad_data_source", f"data_source must be a non-empty string, got {data_source!r}")

    prompt = _plain(row.get("prompt"))
    if (
        not isinstance(prompt, Sequence)
        or len(prompt) != 2
        or not all(isinstance(m, Mapping) for m in prompt)
        or [m.get("role") for m in prompt] != ["system", "user"]
    ):
        raise bad("prompt_not_system_user", "prompt must be [system, user] messages")
    system, user = prompt[0].get("content"), prompt[1].get("content")
    if not isinstance(system, str) or not isinstance(user, str) or not user.strip():
        raise bad("empty_message", "prompt messages must have string content (non-empty user turn)")

    reward_model = row.get("reward_model")
    ground_truth = reward_model.get("ground_truth") if isinstance(reward_model, Mapping) else None
    if not isinstance(ground_truth, str) or not ground_truth.strip():
        raise bad("missing_ground_truth", "reward_model.ground_truth must be a non-empty string")

    problem = row_problem(data_source, ground_truth)
    if problem is not None:
        raise bad(
            problem, f"data_source={data_source!r}: {problem.replace('_', ' ')}: {ground_truth[:120]!r}"
        )

    extra_info = _plain(row.get("extra_info"))
    uid = extra_info.get("index") if isinstance(extra_info, Mapping) else None
    if isinstance(uid, bool) or not isinstance(uid, (int, float)) or uid != uid or int(uid) != uid:
        raise bad("missing_index", f"extra_info.index must be an integer, got {uid!r}")
    return RLLARecord(int(uid), data_source, system, user, ground_truth, dict(extra_info))


def extract_records(df: pd.DataFrame, path: str | Path | None = None) -> tuple[list[RLLARecord], Counter]:
    """Validate ``df`` and parse every row; malformed rows are skipped and counted by reason.

    Returns (records, skipped) where ``skipped`` maps reason -> count. One warning per file
    lists the counts and the first offending row's message.
    """
    validate_rlla_frame(df, path)
    records: list[RLLARecord] = []
    skipped: Counter = Counter()
    first_error: str | None = None
    for i, row in enumerate(df.to_dict(orient="records")):
        try:
            records.append(parse_rlla_row(row, i, path))
        except RowError as err:
            skipped[err.reason] += 1
            first_error = first_error or str(err)
    if skipped:
        log.warning(
            "%s: skipped %d of %d malformed rows %s (first: %s)",
            _name(path),
            sum(skipped.values()),
            len(df),
            dict(skipped),
            first_error,
        )
    return records, skipped


def read_rlla_parquet(path: str | Path) -> tuple[list[RLLARecord], Counter]:
    """Read one RLLA parquet file -> (records, skipped-by-reason). Missing file -> FileNotFoundError."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"RLLA parquet not found: {path}")
    try:
        df = pq.read_table(path).to_pandas()
    except (pa.ArrowInvalid, OSError) as err:
        raise SchemaError(f"{path.name}: not a readable parquet file ({err})") from err
    return extract_records(df, path)


def parquet_problem(path: str | Path) -> str | None:
    """What makes ``path`` unusable as RLLA data that its parquet footer alone shows (not a parquet
    file, cut short, a required column or field missing, no rows), or None. Reads the footer only,
    so a start-up check of large files stays cheap; malformed rows are the loader's to count."""
    try:
        with pq.ParquetFile(path) as f:
            schema, rows = f.schema_arrow, f.metadata.num_rows
    except (pa.ArrowInvalid, OSError) as err:  # no parquet magic / footer: not parquet, or truncated
        reason = str(err).splitlines()[0] if str(err) else type(err).__name__
        return f"not a readable parquet file ({reason})"
    missing = [c for c in REQUIRED_COLUMNS if c not in schema.names]
    if missing:
        return f"missing column(s) {missing} (has {schema.names}; RLLA files have {list(REQUIRED_COLUMNS)})"
    for column, fields in REQUIRED_FIELDS.items():
        kind = schema.field(column).type
        have = [kind.field(i).name for i in range(kind.num_fields)] if pa.types.is_struct(kind) else []
        lacking = [f for f in fields if f not in have]
        if lacking:
            return f"column {column!r} has no field(s) {lacking} (it holds {kind})"
    if rows == 0:
        return "holds no rows (0 rows)"
    return None


def first_row_problem(path: str | Path) -> str:
    """The problem of row 0 of a file none of whose rows is usable (so row 0 is bad too), named
    with the file and row: the one line that tells the user what the file's rows look like."""
    row = pq.read_table(path).slice(0, 1).to_pandas().to_dict(orient="records")[0]
    try:
        parse_rlla_row(row, 0, path)
    except RowError as err:
        return str(err)
    return f"{_name(path)} row 0: usable"
