"""Compose the job config outside ``scripts/train.py`` (tests, notebooks): the schemas registered first."""

from collections.abc import Sequence
from pathlib import Path

from omegaconf import DictConfig

from src.config.job import register_configs

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"


def compose_job(overrides: Sequence[str] = (), config_dir: Path | str = CONFIG_DIR) -> DictConfig:
    """``configs/train.yaml`` with ``overrides``, typed by the schemas (unknown keys raise).

    ``hydra:`` interpolations (``runtime.cwd``) resolve because the config is composed with
    ``return_hydra_config``; Hydra's own node is dropped from the result."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.hydra_config import HydraConfig
    from omegaconf import OmegaConf, open_dict

    register_configs()
    if GlobalHydra.instance().is_initialized():
        GlobalHydra.instance().clear()
    with initialize_config_dir(config_dir=str(config_dir), version_base="1.3"):
        cfg = compose(config_name="train", overrides=list(overrides), return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)  # keeps its own copy of the hydra node
    with open_dict(cfg):
        del cfg["hydra"]
    OmegaConf.resolve(cfg)
    return cfg
