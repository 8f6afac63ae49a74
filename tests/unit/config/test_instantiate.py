"""The swappable components come from their ``_target_``: engine, datamodule, environment."""

from __future__ import annotations

from omegaconf import OmegaConf

from src.config.job import compose_job


def test_engine_from_its_target(tiny):
    from src.rollout.engines.hf import HFGenerateEngine
    from src.rollout.factory import make_engine

    model, tok = tiny
    cfg = compose_job(["experiment=grpo", "rollout.micro_batch_size=8"])
    engine = make_engine(cfg.rollout, tok, model, model_path=None)
    assert isinstance(engine, HFGenerateEngine) and engine.settings.micro_batch_size == 8


def test_datamodules_from_their_target(tiny, cache_dir, tmp_path):
    from src.datamodules.rlla_datamodule import RLLADataModule, SeedDataModule
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
    from src.rollout.factory import env_factory

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


class _MyStrategy:
    """A researcher's strategy: built from its node, nothing in src/ edited."""

    def __init__(self, *, grad_clip: float, world: int, flavour: str):
        self.grad_clip, self.world, self.flavour = grad_clip, world, flavour


def test_strategy_from_its_target_and_lightnings_own_names_pass_through():
    from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy

    from src.jobs.checks import validate_job
    from src.jobs.strategies import build_strategy

    def built(*overrides):
        cfg = compose_job(["experiment=grpo", "trainer.devices=2", *overrides])
        validate_job(cfg)
        return build_strategy(cfg.trainer, 0.5, 2)

    ddp = built("trainer.strategy=ddp")
    assert isinstance(ddp, DDPStrategy) and ddp._ddp_kwargs["find_unused_parameters"] is True
    fsdp = built("trainer.strategy=fsdp")
    assert isinstance(fsdp, ModelParallelStrategy) and fsdp._data_parallel_size == 2
    assert built("trainer.strategy=auto") == "auto" and built("trainer.strategy=ddp_spawn") == "ddp_spawn"
    mine = built(
        f"+trainer.strategies.mine._target_={__name__}._MyStrategy",
        "+trainer.strategies.mine.flavour=plain",
        "trainer.strategy=mine",
    )
    assert isinstance(mine, _MyStrategy) and (mine.grad_clip, mine.world, mine.flavour) == (0.5, 2, "plain")


def test_the_module_takes_the_router_config_as_its_lambda_settings():
    """One source: the λ keys of ``router`` are DualSettings' fields, read by the module as they are."""
    from dataclasses import fields

    from src.config.schema import DualSettings, RouterConfig
    from src.jobs.build import dataclass_from

    cfg = compose_job(["experiment=router_grpo", "router.lambda_lr=0.25", "router.lambda_update=pid"])
    router = dataclass_from(RouterConfig, cfg.router)
    assert isinstance(router, DualSettings)
    assert (router.lambda_lr, router.lambda_update) == (0.25, "pid")
    assert {f.name for f in fields(DualSettings)} <= set(cfg.router)  # every field is a config key
