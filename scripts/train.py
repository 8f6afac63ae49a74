"""Entry point: python scripts/train.py experiment=router_grpo [overrides...]"""

import logging
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from src.train import train  # noqa: E402


@hydra.main(version_base="1.3", config_path="../configs", config_name="train")
def main(cfg: DictConfig) -> None:
    metrics, _ = train(cfg)
    logging.getLogger("toolrouter").info(
        "final metrics: %s", {k: round(v, 4) for k, v in sorted(metrics.items())}
    )


if __name__ == "__main__":
    main()
