"""Seconds per scored evaluation of the local games (a ``validate`` of the starter strategy).

    python scripts/benchmark_game_eval.py [--simulations 1000] [--repeats 15]

Prints one JSON line per game: median and min seconds over the repeats (the first included),
with the validation score, so a change to the sandbox or the scoring protocol can be timed.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from src.envs import LocalGameConfig, LocalGameEnv
from src.envs.games import GAMES

log = logging.getLogger("benchmark_game_eval")


def time_game(game: str, simulations: int, repeats: int) -> dict:
    with tempfile.TemporaryDirectory() as root:
        env = LocalGameEnv(LocalGameConfig(game=game, simulations=simulations, workspace_root=root))
        env.reset(seed=3)
        seconds, score = [], None
        for _ in range(repeats):
            start = time.perf_counter()
            _, _, _, info = env.step("validate")
            seconds.append(time.perf_counter() - start)
            score = info.get("validation_score")
        env.close()
    return {
        "game": game,
        "simulations": simulations,
        "median_s": round(statistics.median(seconds), 4),
        "min_s": round(min(seconds), 4),
        "score": score,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--simulations", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    for game in sorted(GAMES):
        log.info("%s", json.dumps(time_game(game, args.simulations, args.repeats)))


if __name__ == "__main__":
    main()
