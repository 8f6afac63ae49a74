"""Convert RLLA (ToolRL XML) data to GPT-OSS harmony format.

    python scripts/convert_to_gpt_oss.py IN_DIR OUT_DIR [--sft-json PATH]

Converts IN_DIR/train.parquet and/or IN_DIR/test.parquet (whichever exist) into OUT_DIR with the
input's exact arrow schema, and with ``--sft-json`` the ToolRL SFT set ({instruction, input,
output} records) into OUT_DIR/sft_gpt.json. Rows that cannot be converted are dropped and
reported (log + OUT_DIR/conversion_stats.json); pattern counts are logged at INFO.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from src.datamodules.gpt_oss import ConversionStats, convert_frame, convert_sft_records

log = logging.getLogger("convert_to_gpt_oss")

SPLITS = ("train", "test")


def convert_parquet(src: Path, dst: Path) -> ConversionStats:
    """Convert one parquet file; the output's arrow schema equals the input's (fields and types)."""
    table = pq.read_table(src)
    df, stats = convert_frame(table.to_pandas())
    schema = table.schema.remove_metadata()
    out = pa.Table.from_pandas(df, schema=schema, preserve_index=False)
    if not out.schema.remove_metadata().equals(schema):
        raise RuntimeError(f"{dst}: converted schema differs from {src}'s:\n{out.schema}\nvs\n{schema}")
    pq.write_table(out, dst)
    stats.log(src.name)
    return stats


def convert_sft_json(src: Path, dst: Path) -> ConversionStats:
    """Convert the SFT json list; writes the converted records with the same keys."""
    with src.open(encoding="utf-8") as f:
        records = json.load(f)
    if not isinstance(records, list):
        raise ValueError(f"{src}: expected a JSON list of records, got {type(records).__name__}")
    converted, stats = convert_sft_records(records)
    with dst.open("w", encoding="utf-8") as f:
        json.dump(converted, f, ensure_ascii=False, indent=2)
    stats.log(src.name)
    return stats


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("in_dir", type=Path, help="folder with train.parquet and/or test.parquet")
    parser.add_argument("out_dir", type=Path, help="output folder (created)")
    parser.add_argument("--sft-json", type=Path, default=None, help="ToolRL SFT json to convert too")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    inputs = [args.in_dir / f"{split}.parquet" for split in SPLITS]
    inputs = [p for p in inputs if p.is_file()]
    if not inputs and args.sft_json is None:
        log.error("%s has neither train.parquet nor test.parquet, and no --sft-json was given", args.in_dir)
        return 2
    if args.sft_json is not None and not args.sft_json.is_file():
        log.error("--sft-json %s does not exist", args.sft_json)
        return 2
    args.out_dir.mkdir(parents=True, exist_ok=True)

    report = {}
    for src in inputs:
        report[src.name] = convert_parquet(src, args.out_dir / src.name).as_dict()
    if args.sft_json is not None:
        report[args.sft_json.name] = convert_sft_json(args.sft_json, args.out_dir / "sft_gpt.json").as_dict()
    with (args.out_dir / "conversion_stats.json").open("w", encoding="utf-8") as f:
        json.dump(report, f, indent=2)
    log.info("wrote %s", ", ".join(sorted(report)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
