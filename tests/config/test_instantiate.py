"""The swappable components come from their ``_target_``: engine, datamodule, environment."""

from __future__ import annotations

from omegaconf import OmegaConf

from src.config.compose import compose_job


def test_engine_from_its_target(tiny):
    from src.rollout.engines.hf import HFGenerateEngine
    from src.rollout.factory import make_engine

    model, tok = tiny

    class Module:
        actor = model

    cfg = compose_job(["experiment=grpo", "rollout.micro_batch_size=8"])
    engine = make_engine(cfg, tok, Module(), model_path=None)
    assert isinstance(engine, HFGenerateEngine) and engine.settings.micro_batch_size == 8


def test_datamodules_from_their_target(tiny, cache_dir, tmp_path):
    from src.datamodules.rlla_datamodule import RLLADataModule
    from src.datamodules.seeds import SeedDataModule
    from src.jobs.build import build_datamodule

    tok = tiny[1]
    cfg = compose_job(
        ["experiment=grpo", f"cache_dir={cache_dir}", "sampling.n_prompts=6", "trainer.devices=2"]
    )
    dm = build_datamodule(cfg, tok)
    assert isinstance(dm, RLLADataModule) and dm.batch_size == 3  # 6 prompts over 2 ranks
    seeds = build_datamodule(compose_job(["experiment=mlgym_grpo", "seed=7", f"cache_dir={tmp_path}"]), tok)
    assert isinstance(seeds, SeedDataModule) and (seeds.batch_size, seeds.seed) == (2, 7)


def test_env_from_its_target():
    from src.envs.local_game import LocalGameEnv
    from src.rollout.episodes.factory import env_factory

    cfg = compose_job(["experiment=mlgym_grpo", "env=local_pd", "env.rounds=3"])
    env = env_factory(OmegaConf.to_container(cfg.env, resolve=True))()
    try:
        assert (
            isinstance(env, LocalGameEnv)
            and env.config.game == "prisoners_dilemma"
            and env.config.rounds == 3
        )
    finally:
        env.close()
