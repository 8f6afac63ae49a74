"""Write synthetic RLLA train/test (and calibration) parquet files (ToolRL's exact schema).

    python scripts/make_synthetic_data.py OUT_DIR [--n-train 4000] [--n-test 200] [--n-calib 0] [--seed 0]
        [--p-search 0.35] [--p-calculate 0.35] [--p-answer 0.3] [--data-source rlla]
        [--min-tools 4] [--max-tools 4] [--max-params 8]

Prints one JSON line: the written paths and the family counts of each split.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections import Counter

import pandas as pd

from src.datamodules.synthetic import SyntheticOptions, ground_truth_family, write_synthetic_rlla

log = logging.getLogger("make_synthetic_data")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("out_dir")
    parser.add_argument("--n-train", type=int, default=4000)
    parser.add_argument("--n-test", type=int, default=200)
    parser.add_argument(
        "--n-calib", type=int, default=0, help="calib.parquet: held-out phrasing, texts apart from train/test"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--p-search", type=float, default=0.35)
    parser.add_argument("--p-calculate", type=float, default=0.35)
    parser.add_argument("--p-answer", type=float, default=0.3)
    parser.add_argument(
        "--low-gain",
        type=float,
        default=0.0,
        help="share of tool rows that are vague requests (tools pay little)",
    )
    parser.add_argument("--data-source", default="rlla")
    parser.add_argument("--min-tools", type=int, default=4)
    parser.add_argument("--max-tools", type=int, default=4)
    parser.add_argument(
        "--max-params", type=int, default=8, help="parameters over all listed tools (caps prompt length)"
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        paths = write_synthetic_rlla(
            args.out_dir,
            args.n_train,
            args.n_test,
            seed=args.seed,
            options=SyntheticOptions(
                p_search=args.p_search,
                p_calculate=args.p_calculate,
                p_answer=args.p_answer,
                data_source=args.data_source,
                min_tools=args.min_tools,
                max_tools=args.max_tools,
                max_params=args.max_params,
                low_gain=args.low_gain,
            ),
            n_calib=args.n_calib,
        )
    except ValueError as err:
        log.error("%s", err)
        return 2
    summary = {}
    for split, path in paths.items():
        gts = [r["ground_truth"] for r in pd.read_parquet(path, columns=["reward_model"])["reward_model"]]
        families = dict(Counter(map(ground_truth_family, gts)))
        summary[split] = {"path": str(path), "rows": len(gts), "families": families}
        log.info("%s: %s", split, summary[split])
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
